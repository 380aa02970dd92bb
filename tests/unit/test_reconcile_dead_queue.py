"""The pure parts of the dead-letter queue scan: keys and explanations."""

from __future__ import annotations

from rabbitretry.ledger import MISSING_ID_PREFIX as MISSING_ID
from rabbitretry.ledger.failures import rejection
from rabbitretry.reconcile.dead_queue import (
    REASON,
    explain,
    ledger_key,
)


def test_a_message_id_is_the_key_and_an_absent_one_gets_a_key_of_its_own() -> None:
    assert ledger_key("order-1") == "order-1"
    assert ledger_key("a\x00b") == "a\\x00b" == ledger_key("a\x00b")  # stable across runs
    first, second = ledger_key(None), ledger_key("")
    assert first.startswith(MISSING_ID) and second.startswith(MISSING_ID)
    assert first != second  # two id-less messages are two records


def test_the_explanation_groups_by_the_brokers_reason() -> None:
    limited = explain([{"queue": "q1", "reason": "delivery_limit", "count": 1}], "q1.dead")
    other = explain([{"queue": "q1", "reason": "delivery_limit", "count": 7}], "q1.dead")
    rejected = explain([{"queue": "q1", "reason": "rejected", "count": 1}], "q1.dead")
    assert "delivery_limit" in limited
    fingerprint = rejection("q1", REASON, limited).fingerprint
    assert fingerprint == rejection("q1", REASON, other).fingerprint
    assert fingerprint != rejection("q1", REASON, rejected).fingerprint
    assert "no x-death header" in explain([], "q1.dead")
