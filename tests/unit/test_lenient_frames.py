"""Values a foreign producer can send that the AMQP codec would refuse, closing the connection."""

from __future__ import annotations

import struct
from datetime import UTC, datetime

import pytest
from pamqp import decode

import rabbitretry.amqp  # noqa: F401  (installs the lenient decoders)


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
