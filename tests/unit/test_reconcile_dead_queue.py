"""The pure parts of the dead-letter queue scan: keys and explanations."""

from __future__ import annotations

from rabbitretry.ledger import MISSING_ID_PREFIX as MISSING_ID
from rabbitretry.ledger import Snapshot, missing_id_key
from rabbitretry.ledger.failures import rejection
from rabbitretry.reconcile.dead_queue import REASON, explain


def snapshot(body: bytes = b"{}", **headers: object) -> Snapshot:
    return Snapshot(body, dict(headers), {"content_type": "application/json"}, "", "orders")


def test_a_message_without_an_id_is_keyed_by_what_it_carries() -> None:
    key = missing_id_key(snapshot(b'{"n": 1}', tenant="t1"))
    assert key.startswith(MISSING_ID)
    assert key == missing_id_key(snapshot(b'{"n": 1}', tenant="t1"))  # every delivery of it
    assert key != missing_id_key(snapshot(b'{"n": 2}', tenant="t1"))
    assert key != missing_id_key(snapshot(b'{"n": 1}', tenant="t2"))
    moved = Snapshot(b'{"n": 1}', {"tenant": "t1"}, {"content_type": "application/json"}, "", "x")
    assert key != missing_id_key(moved)


def test_a_twin_gets_a_key_of_its_own_next_to_the_hash() -> None:
    key = missing_id_key(snapshot())
    first, second = missing_id_key(snapshot(), twin=True), missing_id_key(snapshot(), twin=True)
    assert first.startswith(key + "-") and second.startswith(key + "-")
    assert len({key, first, second}) == 3


def test_the_explanation_groups_by_the_brokers_reason() -> None:
    limited = explain([{"queue": "q1", "reason": "delivery_limit", "count": 1}], "q1.dead")
    other = explain([{"queue": "q1", "reason": "delivery_limit", "count": 7}], "q1.dead")
    rejected = explain([{"queue": "q1", "reason": "rejected", "count": 1}], "q1.dead")
    assert "delivery_limit" in limited
    fingerprint = rejection("q1", REASON, limited).fingerprint
    assert fingerprint == rejection("q1", REASON, other).fingerprint
    assert fingerprint != rejection("q1", REASON, rejected).fingerprint
    assert "no x-death header" in explain([], "q1.dead")
