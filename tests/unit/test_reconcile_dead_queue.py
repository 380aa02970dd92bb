"""The pure parts of the dead-letter queue scan: keys, explanations, storable headers."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from decimal import Decimal

from rabbitretry.failure import rejection
from rabbitretry.reconcile_dead_queue import (
    MISSING_ID,
    REASON,
    explain,
    ledger_key,
    republishable,
    storable,
)


def test_a_message_id_is_the_key_and_an_absent_one_gets_a_key_of_its_own() -> None:
    assert ledger_key("order-1") == "order-1"
    assert ledger_key("a\x00b") == "a\\x00b" == ledger_key("a\x00b")  # stable across runs
    first, second = ledger_key(None), ledger_key("")
    assert first.startswith(MISSING_ID) and second.startswith(MISSING_ID)
    assert first != second  # two id-less messages are two records


def test_broker_headers_are_stored_as_json_postgres_accepts() -> None:
    when = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    raw = {
        "x-death": [
            {
                "count": 1,
                "reason": "delivery_limit",
                "queue": "q",
                "time": when,
                "routing-keys": ["q"],
            }
        ],
        "blob": b"\xff\x00ok",
        "price": Decimal("1.50"),
        "ratio": math.nan,
        "note": "a\x00b",
        "flag": True,
    }
    stored = storable(raw)
    text = json.dumps(stored, allow_nan=False)
    assert "\\u0000" not in text
    assert stored["x-death"][0]["time"] == when.isoformat()
    assert stored["x-death"][0]["count"] == 1
    assert stored["price"] == "1.50" and stored["ratio"] == "nan" and stored["flag"] is True
    assert stored["note"] == "a\\x00b"


def test_a_republished_copy_keeps_its_headers_unless_the_broker_would_refuse_them() -> None:
    when = datetime(2025, 1, 2, tzinfo=UTC)
    raw = {"x-death": [{"time": when, "count": 2}], "n": 1, "s": "a\x00b"}
    assert republishable(raw) == raw
    assert republishable({"bad": math.inf, "raw": b"ok"}) == {"bad": "inf", "raw": "ok"}


def test_the_explanation_groups_by_the_brokers_reason() -> None:
    limited = explain([{"queue": "q1", "reason": "delivery_limit", "count": 1}], "q1.dead")
    other = explain([{"queue": "q1", "reason": "delivery_limit", "count": 7}], "q1.dead")
    rejected = explain([{"queue": "q1", "reason": "rejected", "count": 1}], "q1.dead")
    assert "delivery_limit" in limited
    fingerprint = rejection("q1", REASON, limited).fingerprint
    assert fingerprint == rejection("q1", REASON, other).fingerprint
    assert fingerprint != rejection("q1", REASON, rejected).fingerprint
    assert "no x-death header" in explain([], "q1.dead")
