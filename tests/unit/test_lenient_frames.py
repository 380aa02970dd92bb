"""Values a foreign producer can send that the AMQP codec would refuse, closing the connection."""

from __future__ import annotations

import struct
from datetime import UTC, datetime

import pytest
from pamqp import decode

import rabbitretry.amqp  # noqa: F401  (installs the lenient decoders)
from rabbitretry.amqp import lenient_frames
from rabbitretry.message import headers as headers_mod


def _table(key: bytes, kind: bytes, value: bytes) -> bytes:
    entry = bytes([len(key)]) + key + kind + value
    return struct.pack(">I", len(entry)) + entry


def test_a_short_string_that_is_not_utf8_keeps_its_bytes() -> None:
    consumed, text = decode.by_type(b"\x03a\xff\xfe", "shortstr")
    assert consumed == 4 and text == "a\udcff\udcfe"
    assert str(text).encode("utf-8", "surrogateescape") == b"a\xff\xfe"


@pytest.mark.parametrize("seconds", [2**64 - 1, 1_700_000_000_000_000])
def test_a_timestamp_out_of_range_reads_as_absent(seconds: int) -> None:
    assert decode.by_type(struct.pack(">Q", seconds), "timestamp") == (8, None)
    table = _table(b"sent", b"T", struct.pack(">Q", seconds))
    assert decode.by_type(table, "table") == (len(table), {"sent": None})


def test_an_ordinary_timestamp_reads_as_before() -> None:
    assert decode.by_type(struct.pack(">Q", 1_700_000_000), "timestamp") == (
        8,
        datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC),
    )


def test_a_header_name_that_is_not_utf8_keeps_its_bytes() -> None:
    table = _table(b"k\xff", b"S", struct.pack(">I", 1) + b"v")
    assert decode.by_type(table, "table") == (len(table), {"k\udcff": "v"})


def test_a_truncated_frame_is_still_an_error() -> None:
    with pytest.raises(ValueError):
        decode.by_type(b"\x00\x01", "timestamp")


def nested(depth: int, innermost: bytes = b"t\x01", *, kind: bytes = b"F") -> bytes:
    """A header table whose value ``x`` nests ``depth`` tables (or arrays) deep."""
    value = innermost
    for _ in range(depth):
        if kind == b"F":
            value = b"F" + _table(b"x", value[:1], value[1:])
        else:
            value = b"A" + struct.pack(">I", len(value)) + value
    return _table(b"x", value[:1], value[1:])


@pytest.mark.parametrize("kind", [b"F", b"A"], ids=["tables", "arrays"])
def test_a_table_nested_to_the_bound_decodes(kind: bytes) -> None:
    table = nested(lenient_frames.MAX_DEPTH, kind=kind)
    consumed, headers = decode.by_type(table, "table")
    assert consumed == len(table) and headers_mod.UNDECODABLE not in headers


@pytest.mark.parametrize("depth", [lenient_frames.MAX_DEPTH + 1, 800, 5_000])
@pytest.mark.parametrize("kind", [b"F", b"A"], ids=["tables", "arrays"])
def test_a_table_nested_past_the_bound_is_a_marker_with_its_bytes(kind: bytes, depth: int) -> None:
    table = nested(depth, kind=kind)
    following = b"\x05after"  # what follows the table in the frame is still read right
    consumed, headers = decode.by_type(table + following, "table")
    assert consumed == len(table)
    assert headers == {
        headers_mod.UNDECODABLE: f"a header table nested deeper than {lenient_frames.MAX_DEPTH} "
        "tables and arrays",
        headers_mod.RAW_HEADERS: bytearray(table[4:]),
    }
    assert headers_mod.why_undecodable(headers) is not None
    assert decode.by_type(table + following, "table")[1] == headers  # the depth was reset
