"""Ledger statements: typed calls over the named statements in ``sql/statements.sql``.

Every state change of a message goes through here, and each is one statement (one commit),
so the ledger is never half-written.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from rabbitretry.db import Executor, Record, query
from rabbitretry.ledger.failures import Failure
from rabbitretry.message.storable import decode_table, encode_table

Verdict = Literal["claimed", "finished", "stale", "busy", "not-due", "exhausted"]


@dataclass(frozen=True)
class Key:
    queue: str
    message_id: str

    def __str__(self) -> str:
        return f"{self.queue}/{self.message_id}"


FINISHED = ("succeeded", "dead", "skipped", "ignored")
"""The statuses of a row whose work is done: a copy that finds one is dropped."""


@dataclass(frozen=True)
class Snapshot:
    """The message as it arrived, kept so that it can be re-published from the ledger."""

    body: bytes
    headers: dict[str, Any]
    properties: dict[str, Any]
    exchange: str
    routing_key: str


MISSING_ID_PREFIX = "missing-id:"


def missing_id_key(snapshot: Snapshot, *, twin: bool = False) -> str:
    """A ledger ``message_id`` for a message that came without one.

    It is the hash of what the message carries (body, headers, properties, where it was
    published), so every delivery of one message finds the same record: a redelivery after
    a broker blip or a lost connection never makes a second dead letter, and replaying them
    all never runs a handler twice for one message. ``twin`` is for a second message
    identical to one already recorded (a first delivery that finds its key taken): a key of
    its own, so the two never collapse into one record.
    """
    digest = hashlib.sha256()
    for part in (
        snapshot.body,
        encode_table(snapshot.headers).encode(),
        encode_table(snapshot.properties).encode(),
        snapshot.exchange.encode(errors="surrogatepass"),
        snapshot.routing_key.encode(errors="surrogatepass"),
    ):
        digest.update(len(part).to_bytes(8, "big") + part)
    key = MISSING_ID_PREFIX + digest.hexdigest()[:32]
    return f"{key}-{uuid.uuid4().hex[:12]}" if twin else key


@dataclass(frozen=True)
class Claim:
    verdict: Verdict
    attempt: int
    budget_attempt: int
    wait_seconds: float
    status: str


async def claim(
    executor: Executor,
    key: Key,
    *,
    max_attempts: int,
    lease_seconds: float,
    worker: str,
    copy_attempts: int,
    snapshot: Snapshot,
    statement: str = "claim",
) -> Claim:
    row = await executor.fetchrow(
        query(statement),
        key.queue,
        key.message_id,
        max_attempts,
        lease_seconds,
        worker,
        copy_attempts,
        snapshot.body,
        encode_table(snapshot.headers),
        encode_table(snapshot.properties),
        snapshot.exchange,
        snapshot.routing_key,
    )
    assert row is not None
    return claim_of(row)


def claim_of(row: Record) -> Claim:
    return Claim(
        verdict=row["verdict"],
        attempt=row["attempt"],
        budget_attempt=row["budget_attempt"],
        wait_seconds=row["wait_seconds"],
        status=row["status"],
    )


async def mark_started(executor: Executor, key: Key, attempt: int) -> bool:
    """The handler of ``attempt`` starts: it counts from now on; False if it is not ours."""
    return (
        await executor.fetchval(query("mark_started"), key.queue, key.message_id, attempt)
        is not None
    )


async def renew_lease(executor: Executor, key: Key, attempt: int, lease_seconds: float) -> bool:
    return (
        await executor.fetchval(
            query("renew_lease"), key.queue, key.message_id, attempt, lease_seconds
        )
        is not None
    )


async def finish(
    executor: Executor,
    key: Key,
    attempt: int,
    status: Literal["succeeded", "dead", "skipped"],
    *,
    reason: str | None = None,
    failure: Failure | None = None,
    keep_snapshot: bool = False,
) -> bool:
    """Close ``attempt``; False when it was no longer the current attempt (lease lost). A
    succeeded message's snapshot is dropped unless ``keep_snapshot``."""
    return (
        await executor.fetchval(
            query("finish_attempt"),
            key.queue,
            key.message_id,
            attempt,
            status,
            reason,
            failure.type if failure else None,
            failure.message if failure else None,
            failure.traceback if failure else None,
            failure.fingerprint if failure else None,
            keep_snapshot,
        )
        is not None
    )


async def schedule_retry(
    executor: Executor, key: Key, attempt: int, delay: float, failure: Failure
) -> float | None:
    """Mark the key ``retrying``; the seconds until it is due, or None if the lease was lost."""
    wait: float | None = await executor.fetchval(
        query("schedule_retry"),
        key.queue,
        key.message_id,
        attempt,
        delay,
        failure.type,
        failure.message,
        failure.traceback,
        failure.fingerprint,
        failure.downstream,
    )
    return wait


async def confirm_retry_copy(executor: Executor, key: Key, attempt: int) -> None:
    await executor.execute(query("confirm_retry_copy"), key.queue, key.message_id, attempt)


async def interrupt(executor: Executor, key: Key, attempt: int) -> bool:
    return (
        await executor.fetchval(query("interrupt_attempt"), key.queue, key.message_id, attempt)
        is not None
    )


async def defer(executor: Executor, key: Key, attempt: int, failure: Failure) -> bool:
    """``attempt`` met its downstream (``failure.downstream``) unavailable: not counted, due
    again at once. False if the attempt was no longer ours."""
    return (
        await executor.fetchval(
            query("defer_attempt"),
            key.queue,
            key.message_id,
            attempt,
            failure.downstream,
            failure.type,
            failure.message,
            failure.traceback,
            failure.fingerprint,
        )
        is not None
    )


async def release_claim(executor: Executor, key: Key, worker: str) -> bool:
    """Interrupt the open attempt of ``key`` that ``worker`` claimed, if there is one."""
    return (
        await executor.fetchval(query("release_claim"), key.queue, key.message_id, worker)
        is not None
    )


async def record_rejected(
    executor: Executor,
    key: Key,
    *,
    max_attempts: int,
    reason: str,
    failure: Failure,
    snapshot: Snapshot,
) -> bool:
    """Store a delivery refused before any attempt as dead; False if the key already exists."""
    return (
        await executor.fetchval(
            query("record_rejected"),
            key.queue,
            key.message_id,
            max_attempts,
            reason,
            failure.type,
            failure.message,
            failure.fingerprint,
            snapshot.body,
            encode_table(snapshot.headers),
            encode_table(snapshot.properties),
            snapshot.exchange,
            snapshot.routing_key,
        )
        is not None
    )


async def get(executor: Executor, key: Key) -> Record | None:
    return await executor.fetchrow(query("get_entry"), key.queue, key.message_id)


def snapshot_of(row: Record) -> Snapshot:
    return Snapshot(
        body=bytes(row["payload"]),
        headers=decode_table(row["headers"]),
        properties=decode_table(row["properties"]),
        exchange=row["exchange"],
        routing_key=row["routing_key"],
    )
