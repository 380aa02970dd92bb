"""Every refused copy has a terminal record, and the reconciler never re-drives one.

A copy refused before the claim (here: its body is over ``max_body_bytes``, a limit lowered
while the message was in flight) can never be handled. If the ledger row is still in flight
(``retrying``, or ``processing`` with a lapsed lease), it must end ``dead`` with the reason,
not stay in flight for the reconciler to re-drive a copy the worker refuses again, for ever.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from pydantic import BaseModel

from rabbitretry import Consumer, Context, Permanent, Retry, RetryPolicy, amqp, db
from rabbitretry.consumer import topology_of
from rabbitretry.ledger import AttemptLedger, ClaimRequest, Key, Snapshot, repairs
from rabbitretry.ledger.failures import rejection
from rabbitretry.reconcile.pacing import RateLimiter
from rabbitretry.reconcile.redrive import redrive
from rabbitretry.reconcile.run import Run, RunReport
from rabbitretry.topology import declare, delays
from tests.integration.harness import (
    publish,
    queue_depth,
    running_worker,
    wait_for,
    wait_status,
)

pytestmark = pytest.mark.asyncio

BODY = {"n": 1, "padding": "x" * 64}
SMALL_LIMIT = 16  # bytes: BODY is over it


class Job(BaseModel):
    n: int
    padding: str = ""


def make_consumer(queue: str, *, fail_first: bool) -> type[Consumer[Job]]:
    class Refusing(Consumer[Job]):
        async def handle(self, msg: Job, ctx: Context) -> None:
            if fail_first and ctx.attempt == 1:
                # The limit is lowered while the retry copy is in flight (a deploy).
                type(self).max_body_bytes = SMALL_LIMIT
                raise Retry("first attempt fails", delay=0.3)

    Refusing.queue = queue
    Refusing.retry = RetryPolicy(max_attempts=3, initial_delay=0.3, jitter=0.0)
    Refusing.lease = 1.0
    return Refusing


async def row_of(pool: asyncpg.Pool, queue: str, message_id: str) -> asyncpg.Record:
    row = await pool.fetchrow(
        "SELECT * FROM rabbitretry.ledger WHERE queue = $1 AND message_id = $2", queue, message_id
    )
    assert row is not None
    return row


async def attempt_outcomes(pool: asyncpg.Pool, queue: str, message_id: str) -> list[str | None]:
    rows = await pool.fetch(
        "SELECT outcome FROM rabbitretry.attempt_history WHERE queue = $1 AND message_id = $2 "
        "ORDER BY attempt",
        queue,
        message_id,
    )
    return [row["outcome"] for row in rows]


async def claimed_by_a_lost_worker(pool: asyncpg.Pool, queue: str, message_id: str) -> None:
    """A ``processing`` row whose worker died in its handler: its lease (1 s) has run out."""
    snapshot = Snapshot(
        body=json.dumps(BODY).encode(),
        headers={},
        properties={"message_id": message_id, "content_type": "application/json"},
        exchange="",
        routing_key=queue,
    )
    request = ClaimRequest(
        Key(queue, message_id),
        max_attempts=3,
        lease_seconds=1.0,
        worker="lost-worker",
        copy_attempts=0,
        snapshot=snapshot,
    )
    ledger = AttemptLedger(pool)
    claim = await ledger.claim(request)
    assert claim.verdict == "claimed", claim
    assert await ledger.mark_started(request.key, claim.attempt)  # died inside its handler

    async def lease_lapsed() -> bool:
        lapsed: bool = await pool.fetchval(
            "SELECT lease_until < now() FROM rabbitretry.ledger "
            "WHERE queue = $1 AND message_id = $2",
            queue,
            message_id,
        )
        return lapsed

    await wait_for(lease_lapsed, timeout=5)


def assert_dead_too_large(row: asyncpg.Record) -> None:
    assert row["status"] == "dead", dict(row)
    assert row["reason"] == "too-large"
    assert row["next_retry_at"] is None and row["lease_until"] is None


async def test_a_retry_copy_too_large_for_a_lowered_limit_ends_dead(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    consumer = make_consumer(queue_name, fail_first=True)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url):
        await publish(amqp_url, queue_name, BODY, message_id="m1")
        await wait_status(pool, queue_name, "m1", "dead", timeout=15)
        await wait_for(lambda: _depth_is(amqp_url, f"{queue_name}.dead", 1), timeout=10)
    row = await row_of(pool, queue_name, "m1")
    assert_dead_too_large(row)
    assert row["attempts"] == 1
    assert await attempt_outcomes(pool, queue_name, "m1") == ["retry"]
    assert await queue_depth(amqp_url, queue_name) == 0


async def test_a_refused_copy_of_a_lapsed_claim_ends_dead(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    """The broker redelivers the message of a worker that died mid-attempt to a worker whose
    limit is now lower: the row must not stay ``processing`` for the reconciler to loop on."""
    consumer = make_consumer(queue_name, fail_first=False)
    consumer.max_body_bytes = SMALL_LIMIT
    cleanup.append(consumer)
    await claimed_by_a_lost_worker(pool, queue_name, "m1")
    async with running_worker([consumer], amqp_url, database_url):
        await publish(amqp_url, queue_name, BODY, message_id="m1")
        await wait_for(lambda: _depth_is(amqp_url, f"{queue_name}.dead", 1), timeout=10)
        await wait_status(pool, queue_name, "m1", "dead", timeout=10)
    assert_dead_too_large(await row_of(pool, queue_name, "m1"))
    # The attempt the lost worker started is closed, so attempts matches the attempt log.
    assert await attempt_outcomes(pool, queue_name, "m1") == ["crashed"]


@pytest.fixture
async def reconcile_run(amqp_url: str, pool: asyncpg.Pool) -> AsyncIterator[Run]:
    connection = await amqp.connect(amqp_url)
    try:
        yield Run(
            ledger=db.Answering(pool),
            publisher=await amqp.ConfirmingPublisher.open(connection),
            limiter=RateLimiter(1000),
            report=RunReport(),
            grace=0.0,
            batch_size=10,
            max_batches=1,
        )
    finally:
        await connection.close()


@pytest.mark.parametrize("state", ["processing", "retrying"])
async def test_the_reconciler_records_a_snapshot_the_worker_would_refuse_as_dead(
    amqp_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    reconcile_run: Run,
    state: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    consumer = make_consumer(queue_name, fail_first=False)
    consumer.max_body_bytes = SMALL_LIMIT
    cleanup.append(consumer)
    connection = await amqp.connect(amqp_url)
    try:
        await declare(connection, topology_of([consumer]))
    finally:
        await connection.close()
    await claimed_by_a_lost_worker(pool, queue_name, "m1")
    scan = repairs.take_expired_leases
    if state == "retrying":
        failure = rejection(queue_name, "Retry", "first attempt fails")
        await AttemptLedger(pool).schedule_retry(Key(queue_name, "m1"), 1, 0.0, failure)
        scan = repairs.take_overdue_retries
        await wait_status(pool, queue_name, "m1", "retrying", timeout=1)

    published = await redrive(reconcile_run, scan, {}, {queue_name: SMALL_LIMIT})

    assert published == 0
    assert await queue_depth(amqp_url, queue_name) == 0, "a snapshot the worker refuses"
    row = await row_of(pool, queue_name, "m1")
    assert_dead_too_large(row)
    assert "over the limit of 16 bytes" in row["error_message"]
    expected = "crashed" if state == "processing" else "retry"
    assert await attempt_outcomes(pool, queue_name, "m1") == [expected]
    # A second pass finds nothing in flight: nothing loops.
    assert await redrive(reconcile_run, scan, {}, {queue_name: SMALL_LIMIT}) == 0


async def _depth_is(amqp_url: str, queue: str, depth: int) -> bool:
    return await queue_depth(amqp_url, queue) == depth


# --- copies the broker refuses ------------------------------------------------------------------


async def unbind_from_the_deliver_exchange(amqp_url: str, queue: str) -> None:
    """The work queue loses its binding on the delay chain's deliver exchange (a definitions
    import, a hand-made topology): a copy with no wait is returned unroutable."""
    connection = await amqp.connect(amqp_url)
    try:
        channel = await connection.channel()
        work = await channel.declare_queue(queue, passive=True)
        await work.unbind(delays.DELIVER_EXCHANGE, delays.deliver_key(queue))
    finally:
        await connection.close()


async def test_a_retry_copy_the_broker_refuses_ends_dead_with_the_brokers_reason(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The retry copy came back unroutable: the delivery was requeued after a pause, with no
    record of why, and met the refusal again on every attempt until its budget was spent
    (``attempts-exhausted``, the broker's reason nowhere). Now the first refusal ends it dead
    with the broker's reason, once, and its dead letter is on ``Q.dead``."""
    handled: list[int] = []

    class Retrying(Consumer[Job]):
        async def handle(self, msg: Job, ctx: Context) -> None:
            handled.append(ctx.attempt)
            raise Retry("try again at once", delay=0.0)

    Retrying.queue = queue_name
    Retrying.retry = RetryPolicy(max_attempts=3, initial_delay=0.0, jitter=0.0)
    cleanup.append(Retrying)
    async with running_worker([Retrying], amqp_url, database_url):
        await unbind_from_the_deliver_exchange(amqp_url, queue_name)
        await publish(amqp_url, queue_name, BODY, message_id="m1")
        await wait_status(pool, queue_name, "m1", "dead", timeout=15)
        await wait_for(lambda: _depth_is(amqp_url, f"{queue_name}.dead", 1), timeout=10)
    row = await row_of(pool, queue_name, "m1")
    no_wait = delays.route(queue_name, "classic", 0.0)
    assert (row["reason"], row["attempts"], handled) == ("unpublishable", 1, [1])
    assert row["error_message"] == (
        "the broker refused the copy for the delay path: no queue is bound for exchange "
        f"'{delays.DELIVER_EXCHANGE}' with routing key '{no_wait.routing_key}'"
    )
    assert await attempt_outcomes(pool, queue_name, "m1") == ["retry"]
    assert await queue_depth(amqp_url, queue_name) == 0
    assert not [r for r in caplog.records if "requeued" in r.getMessage()]


async def test_a_dead_copy_the_broker_refuses_is_logged_once_and_the_delivery_acked(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``Q.dead`` deleted: the dead letter's copy comes back unroutable. The ledger row is the
    dead letter (recorded, alerted); the delivery was requeued as if nothing were recorded,
    with an ERROR saying so. Now the missing copy is one WARNING naming the reason, and the
    delivery is acked."""

    class Failing(Consumer[Job]):
        async def handle(self, msg: Job, ctx: Context) -> None:
            raise Permanent("order not found")

    Failing.queue = queue_name
    Failing.retry = RetryPolicy(max_attempts=1, initial_delay=0.3, jitter=0.0)
    cleanup.append(Failing)
    async with running_worker([Failing], amqp_url, database_url):
        connection = await amqp.connect(amqp_url)
        try:
            await (await connection.channel()).queue_delete(f"{queue_name}.dead")
        finally:
            await connection.close()
        await publish(amqp_url, queue_name, BODY, message_id="m1")
        await wait_status(pool, queue_name, "m1", "dead", timeout=15)

        async def said_once() -> list[str]:
            return [r.getMessage() for r in caplog.records if "no copy on" in r.getMessage()]

        (line,) = await wait_for(said_once, timeout=10)
        await wait_for(lambda: _depth_is(amqp_url, queue_name, 0), timeout=10)
    assert line == (
        f"{queue_name}/m1: dead in the ledger; no copy on {queue_name}.dead: no queue is bound "
        f"for exchange '(default)' with routing key '{queue_name}.dead'"
    )
    assert not [r for r in caplog.records if "requeued" in r.getMessage()]
    row = await row_of(pool, queue_name, "m1")
    assert (row["status"], row["reason"], row["attempts"]) == ("dead", "permanent-error", 1)
    alert = await pool.fetchval("SELECT count FROM rabbitretry.alert WHERE queue = $1", queue_name)
    assert alert == 1
