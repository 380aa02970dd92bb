"""The ledger writes the reconciler makes to repair what the broker lost.

Each runs one named statement (``sql/repairs.sql``) on the executor it is given; none opens a
transaction of its own, as the reconciler runs each statement on its own (one commit). The
scans take a bounded batch with ``FOR UPDATE SKIP LOCKED`` and mark it re-driven in the same
statement, so that reconcilers running side by side never take the same row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rabbitretry.db import Executor, Record, query
from rabbitretry.ledger.failures import Failure
from rabbitretry.ledger.statements import Key
from rabbitretry.message.storable import encode_table


async def take_overdue_retries(executor: Executor, grace: float, limit: int) -> list[Record]:
    """``retrying`` rows overdue by more than ``grace`` seconds (their delay copy never came
    back), at most ``limit``, marked re-driven: each with its snapshot, to publish again."""
    rows: list[Record] = await executor.fetch(query("reconcile_overdue_retries"), grace, limit)
    return rows


async def take_expired_leases(executor: Executor, grace: float, limit: int) -> list[Record]:
    """``processing`` rows whose lease ran out more than ``grace`` seconds ago (the worker died
    and its delivery was lost), at most ``limit``, marked re-driven like the retries."""
    rows: list[Record] = await executor.fetch(query("reconcile_expired_leases"), grace, limit)
    return rows


async def skip_expired(executor: Executor, key: Key, reason: str) -> bool:
    """Finish a retrying row, or one whose lease ran out, as ``skipped`` for ``reason`` (its
    open attempt logged crashed); False when the row had moved on meanwhile."""
    skipped: int = await executor.fetchval(
        query("reconcile_skip_expired"), key.queue, key.message_id, reason
    )
    return bool(skipped)


async def refuse_in_flight(executor: Executor, key: Key, reason: str, failure: Failure) -> bool:
    """Finish as ``dead`` for ``reason`` a row still in flight (``retrying``, or ``processing``
    with its lease run out: its open attempt logged crashed) whose message is refused before
    the claim, e.g. too large for its consumer: no copy of it can ever be handled. False when
    the row was not in flight (finished already, or a live lease: its owner decides)."""
    refused: int = await executor.fetchval(
        query("refuse_in_flight"),
        key.queue,
        key.message_id,
        reason,
        failure.type,
        failure.message,
        failure.fingerprint,
    )
    return bool(refused)


@dataclass(frozen=True)
class BrokerDeadLetter:
    """A message the broker dead-lettered on its own, as the ledger stores it."""

    message_id: str
    payload: bytes
    headers: Mapping[str, Any]
    properties: Mapping[str, Any]
    exchange: str
    routing_key: str
    failure: Failure


async def record_broker_dead(
    executor: Executor,
    queue: str,
    letters: Sequence[BrokerDeadLetter],
    *,
    max_attempts: int,
    reason: str,
) -> set[str]:
    """Store ``letters`` of work queue ``queue`` as ``dead`` rows with ``reason``, unless the
    ledger already has their key (any row is left exactly as it is); the keys inserted."""
    rows = await executor.fetch(
        query("dead_queue_record"),
        queue,
        max_attempts,
        reason,
        [letter.message_id for letter in letters],
        [letter.payload for letter in letters],
        [encode_table(letter.headers) for letter in letters],
        [encode_table(letter.properties) for letter in letters],
        [letter.exchange for letter in letters],
        [letter.routing_key for letter in letters],
        [letter.failure.message for letter in letters],
        [letter.failure.fingerprint for letter in letters],
    )
    return {row["message_id"] for row in rows}
