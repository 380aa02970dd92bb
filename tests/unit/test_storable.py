"""The stored form of headers and properties: lossless, and always accepted by PostgreSQL."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from rabbitretry.message.storable import decode_table, encode_table, is_storable_text, storable_text

HOSTILE: dict[str, Any] = {
    "plain": "text",
    "nul": "a\x00b",
    "surrogate": "\ud800",
    "bytes": bytearray(b"\x00\xff"),
    "decimal": Decimal("1.50"),
    "timestamp": datetime(2020, 1, 1, tzinfo=UTC),
    "nested": {"list": [1, "a\x00", {"k\x00": None}], "flag": True},
    "big": 2**70,
    "$bytes": "a name that looks like a tag",
}


def _nul_free(stored: str) -> bool:
    return "\\u0000" not in stored and "\x00" not in stored


def test_every_amqp_value_round_trips() -> None:
    stored = encode_table(HOSTILE)
    assert decode_table(stored) == HOSTILE
    assert _nul_free(stored)
    stored.encode("utf-8")  # no lone surrogate either


def test_plain_tables_are_stored_as_they_read() -> None:
    table = {"x-tenant": "acme", "x-retries": 3, "x-tags": ["a", "b"], "x-none": None}
    assert json.loads(encode_table(table)) == table


def test_values_that_need_a_mark_are_marked() -> None:
    stored = json.loads(encode_table({"b": b"\x01", "s": "a\x00", "d": Decimal("2.5")}))
    assert stored == {"b": {"$bytes": "AQ=="}, "s": {"$text": "YQA="}, "d": {"$decimal": "2.5"}}


def test_non_finite_floats_are_kept() -> None:
    decoded = decode_table(encode_table({"f": float("nan"), "g": float("inf")}))
    assert math.isnan(decoded["f"]) and decoded["g"] == float("inf")


def test_rows_stored_before_the_marks_read_unchanged() -> None:
    assert decode_table('{"x": "y", "n": [1, 2]}') == {"x": "y", "n": [1, 2]}
    assert decode_table({"x": "y"}) == {"x": "y"}
    assert decode_table(None) == {}


@pytest.mark.parametrize(
    ("text", "stored"),
    [("ok", "ok"), ("a\x00b", "a\\x00b"), ("\ud800", "\\ud800"), ("é", "é")],
)
def test_storable_text_escapes_what_postgres_refuses(text: str, stored: str) -> None:
    assert storable_text(text) == stored
    assert is_storable_text(storable_text(text))
