"""The reconciler against the real broker and ledger: lost copies re-driven, never twice."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import pytest
from pydantic import BaseModel

from rabbitretry import (
    Consumer,
    Context,
    Outbox,
    Permanent,
    RetryPolicy,
    Topology,
    amqp,
    ledger,
)
from rabbitretry.delivery.worker import topology_of
from rabbitretry.errors import ServiceUnavailable
from rabbitretry.ledger.failures import describe
from rabbitretry.monitoring import heartbeat
from rabbitretry.reconcile.expected import Expected, Reconciliation
from rabbitretry.reconcile.reconciler import Reconciler
from rabbitretry.topology import declare, delays
from tests.integration.conftest import BrokerCleanup
from tests.integration.harness import publish, queue_depth, running_worker, wait_for, wait_status

pytestmark = pytest.mark.asyncio

ROOT = Path(__file__).resolve().parents[2]


class Job(BaseModel):
    n: int


def make_consumer(queue: str, handler: Any, **attributes: Any) -> type[Consumer[Job]]:
    class TestConsumer(Consumer[Job]):
        async def handle(self, msg: Job, ctx: Context) -> None:
            await handler(msg, ctx)

    TestConsumer.queue = queue
    TestConsumer.retry = RetryPolicy(max_attempts=3, initial_delay=4.0, jitter=0.0)
    for name, value in attributes.items():
        setattr(TestConsumer, name, value)
    return TestConsumer


async def never_called(msg: Job, ctx: Context) -> None:
    raise AssertionError(f"the handler ran for {ctx.message_id}")


@pytest.fixture
async def reconcilers(pool: asyncpg.Pool, amqp_url: str) -> AsyncIterator[list[Reconciler]]:
    """Append reconcilers made for the test; their connections are closed afterwards."""
    made: list[Reconciler] = []
    yield made
    for reconciler in made:
        await reconciler.close()


def reconciler_for(
    made: list[Reconciler], pool: asyncpg.Pool, amqp_url: str, **options: Any
) -> Reconciler:
    reconciler = Reconciler(pool, amqp_url, **{"grace": 1.0, **options})
    made.append(reconciler)
    return reconciler


async def declared(amqp_url: str, consumer: type[Consumer[Any]]) -> None:
    connection = await amqp.connect(amqp_url, name="rabbitretry-tests")
    try:
        await declare(connection, topology_of([consumer]))
    finally:
        await connection.close()


async def lost_retries(pool: asyncpg.Pool, queue: str, keys: list[str]) -> None:
    """Ledger rows that failed once and are overdue, with no copy anywhere on the broker."""
    snapshot = ledger.Snapshot(b'{"n": 1}', {}, {"content_type": "application/json"}, "", queue)
    for index, key in enumerate(keys):
        claim = await ledger.claim(
            pool,
            ledger.Key(queue, key),
            max_attempts=3,
            lease_seconds=30,
            worker=f"gone:{index}",
            copy_attempts=0,
            snapshot=snapshot,
        )
        assert claim.verdict == "claimed"
        failure = describe(queue, ConnectionError("downstream down"))
        await ledger.schedule_retry(pool, ledger.Key(queue, key), 1, 0.0, failure)
    await pool.execute(
        "UPDATE rabbitretry.ledger SET next_retry_at = now() - interval '1 minute'"
        " WHERE queue = $1",
        queue,
    )


async def drain(amqp_url: str, queue: str) -> list[str]:
    """Take every message off ``queue``: their message_ids, in order."""
    connection = await aio_pika.connect(amqp_url)
    ids: list[str] = []
    try:
        channel = await connection.channel()
        declared_queue = await channel.declare_queue(queue, passive=True)
        while (message := await declared_queue.get(fail=False)) is not None:
            ids.append(str(message.message_id))
            await message.ack()
    finally:
        await connection.close()
    return ids


async def purge(amqp_url: str, queues: list[str]) -> int:
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        purged = 0
        for name in queues:
            declared_queue = await channel.declare_queue(name, passive=True)
            result = await declared_queue.purge()
            purged += int(result.message_count or 0)
        return purged
    finally:
        await connection.close()


async def unbind_from_delay_chain(amqp_url: str, queue: str) -> None:
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        work = await channel.declare_queue(queue, passive=True)
        await work.unbind(delays.DELIVER_EXCHANGE, routing_key=delays.deliver_key(queue))
    finally:
        await connection.close()


# --- re-driving lost copies ------------------------------------------------------------------


async def test_retries_whose_delay_copies_were_lost_are_redriven_and_succeed(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    reconcilers: list[Reconciler],
) -> None:
    calls: collections.Counter[str] = collections.Counter()

    async def fail_first(msg: Job, ctx: Context) -> None:
        calls[ctx.message_id] += 1
        if ctx.attempt == 1:
            raise ConnectionError("downstream down")

    consumer = make_consumer(queue_name, fail_first)
    cleanup.append(consumer)
    keys = ["r-1", "r-2", "r-3"]
    async with running_worker([consumer], amqp_url, database_url):
        for key in keys:
            await publish(amqp_url, queue_name, {"n": 1}, message_id=key)

        async def parked() -> bool:
            confirmed = await pool.fetchval(
                "SELECT count(*) FROM rabbitretry.ledger WHERE queue = $1"
                " AND status = 'retrying' AND retry_copy_confirmed",
                queue_name,
            )
            return bool(confirmed == len(keys))

        await wait_for(parked)
        # The broker loses the delay copies (as a classic queue may in a crash): here, at the
        # end of the delay chain, where nothing routes them back to the work queue any more.
        await unbind_from_delay_chain(amqp_url, queue_name)

        async def overdue() -> bool:
            late = await pool.fetchval(
                "SELECT count(*) FROM rabbitretry.ledger WHERE queue = $1"
                " AND status = 'retrying' AND next_retry_at < now() - interval '1 second'",
                queue_name,
            )
            return bool(late == len(keys))

        await wait_for(overdue)
        reconciler = reconciler_for(reconcilers, pool, amqp_url)
        report = await reconciler.run_once()
        assert report.retries_redriven == len(keys)
        for key in keys:
            await wait_status(pool, queue_name, key, "succeeded")
        again = await reconciler.run_once()
        assert again.retries_redriven == 0

    assert calls == {key: 2 for key in keys}  # the failed attempt and the re-driven one
    outcomes = await pool.fetch(
        "SELECT message_id, array_agg(outcome ORDER BY attempt) AS outcomes"
        " FROM rabbitretry.attempt WHERE queue = $1 GROUP BY message_id",
        queue_name,
    )
    assert {r["message_id"]: r["outcomes"] for r in outcomes} == {
        key: ["retry", "succeeded"] for key in keys
    }
    beat = next(b for b in await heartbeat.read_all(pool) if b.name == "reconciler")
    assert beat.ok and beat.counts["retries_redriven"] == 0 and beat.finished_at is not None


async def test_two_reconcilers_at_once_never_publish_a_message_twice(
    amqp_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    reconcilers: list[Reconciler],
) -> None:
    consumer = make_consumer(queue_name, never_called)
    cleanup.append(consumer)
    await declared(amqp_url, consumer)
    keys = [f"lost-{n}" for n in range(150)]
    await lost_retries(pool, queue_name, keys)

    options = {"batch_size": 7, "max_batches": 100, "publish_rate": 5000.0, "grace": 30.0}
    first = reconciler_for(reconcilers, pool, amqp_url, **options)
    second = reconciler_for(reconcilers, pool, amqp_url, **options)
    reports = await asyncio.gather(first.run_once(), second.run_once(), first.run_once())

    assert sum(r.retries_redriven for r in reports) == len(keys)
    assert all(r.retries_redriven > 0 for r in reports[:2])  # both took part
    published = await drain(amqp_url, queue_name)
    assert sorted(published) == sorted(keys)  # each exactly once
    rows = await pool.fetch("SELECT redrives FROM rabbitretry.ledger WHERE queue = $1", queue_name)
    assert {r["redrives"] for r in rows} == {1}


async def test_a_row_redriven_again_and_again_waits_longer_each_time(
    amqp_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    reconcilers: list[Reconciler],
) -> None:
    consumer = make_consumer(queue_name, never_called)
    cleanup.append(consumer)
    await declared(amqp_url, consumer)
    await lost_retries(pool, queue_name, ["unlucky"])  # no worker ever takes the copies
    reconciler = reconciler_for(reconcilers, pool, amqp_url, grace=30.0)

    async def redriven_after(seconds_ago: int) -> int:
        await pool.execute(
            "UPDATE rabbitretry.ledger SET redriven_at = now() - make_interval(secs => $1)",
            seconds_ago,
        )
        return (await reconciler.run_once()).retries_redriven

    assert (await reconciler.run_once()).retries_redriven == 1
    assert await redriven_after(10) == 0  # within the grace period
    assert await redriven_after(45) == 1  # past it: the second re-drive
    assert await redriven_after(45) == 0  # now the hold-off is 2 x 30 s
    assert await redriven_after(75) == 1
    assert len(await drain(amqp_url, queue_name)) == 3


@pytest.mark.slow
async def test_a_dead_workers_lost_delivery_is_redriven_after_its_lease(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    broker_cleanup: BrokerCleanup,
    reconcilers: list[Reconciler],
    tmp_path: Path,
) -> None:
    from tests.integration import crash_consumers

    events = tmp_path / "events.log"
    events.touch()
    env = {
        **os.environ,
        "RABBITRETRY_AMQP_URL": amqp_url,
        "RABBITRETRY_DATABASE_URL": database_url,
        "RR_TEST_QUEUE": queue_name,
        "RR_EVENTS": str(events),
        "RR_LEASE": "2",
        "RR_MODE": "hang-first",
    }
    work_queue = crash_consumers.Crashy.work_queue().model_copy(update={"name": queue_name})
    broker_cleanup.topology(Topology(queues=[work_queue]))
    command = [
        sys.executable,
        "-c",
        "from rabbitretry.cli import main; main()",
        "run",
        "tests.integration.crash_consumers:Crashy",
        "--declare",
    ]

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def lines(kind: str) -> list[str]:
        return [line for line in events.read_text().splitlines() if line.startswith(kind)]

    worker = start()
    try:

        async def published() -> bool:
            try:
                await publish(amqp_url, queue_name, {"n": 1}, message_id="held")
            except Exception:
                return False  # the worker has not declared its queue yet
            return True

        await wait_for(published, timeout=30, interval=0.3)

        async def handler_started() -> bool:
            return bool(lines("start"))

        await wait_for(handler_started)
        worker.kill()  # SIGKILL inside the handler: the lease is left to run out
        worker.wait(10)

        # The broker requeues the unacked delivery; then it loses it too.
        async def requeued() -> bool:
            return await queue_depth(amqp_url, queue_name) == 1

        await wait_for(requeued)
        assert await purge(amqp_url, [queue_name]) == 1

        async def lease_long_gone() -> bool:
            return bool(
                await pool.fetchval(
                    "SELECT lease_until < now() - interval '1 second' FROM rabbitretry.ledger"
                    " WHERE queue = $1 AND message_id = 'held' AND status = 'processing'",
                    queue_name,
                )
            )

        await wait_for(lease_long_gone)
        report = await reconciler_for(reconcilers, pool, amqp_url).run_once()
        assert (report.leases_redriven, report.retries_redriven) == (1, 0)
        assert await queue_depth(amqp_url, queue_name) == 1

        worker = start()
        await wait_status(pool, queue_name, "held", "succeeded")
    finally:
        worker.kill()
        worker.wait(10)
    attempts = await pool.fetch(
        "SELECT attempt, outcome FROM rabbitretry.attempt WHERE queue = $1 ORDER BY attempt",
        queue_name,
    )
    assert [tuple(r) for r in attempts] == [(1, "crashed"), (2, "succeeded")]
    assert len(lines("done")) == 1


async def test_an_outbox_row_no_relay_published_is_published(
    amqp_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    reconcilers: list[Reconciler],
) -> None:
    consumer = make_consumer(queue_name, never_called)
    cleanup.append(consumer)
    await declared(amqp_url, consumer)
    async with pool.acquire() as conn, conn.transaction():
        await Outbox().enqueue(conn, "", {"n": 5}, routing_key=queue_name, message_id="out-1")
        await Outbox().enqueue(conn, "", {"n": 6}, routing_key=queue_name, message_id="out-2")
    await pool.execute(
        "UPDATE rabbitretry.outbox SET next_try_at = now() - interval '1 minute'"
        " WHERE message_id = 'out-1'"
    )
    report = await reconciler_for(reconcilers, pool, amqp_url).run_once()
    assert report.outbox_published == 1  # out-2 is not late yet: it is the relay's
    assert await drain(amqp_url, queue_name) == ["out-1"]
    statuses = await pool.fetch("SELECT message_id, status FROM rabbitretry.outbox ORDER BY id")
    assert [tuple(r) for r in statuses] == [("out-1", "sent"), ("out-2", "pending")]


# --- running on an interval, and failing visibly ---------------------------------------------


async def test_an_embedded_reconciler_keeps_running_until_stopped(
    amqp_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    reconcilers: list[Reconciler],
) -> None:
    consumer = make_consumer(queue_name, never_called)
    cleanup.append(consumer)
    await declared(amqp_url, consumer)
    reconciler = reconciler_for(reconcilers, pool, amqp_url)
    task = asyncio.create_task(reconciler.run(interval=1.0))
    try:

        async def a_run_finished() -> bool:
            beats = await heartbeat.read_all(pool)
            return bool(beats and beats[0].finished_at is not None)

        await wait_for(a_run_finished)
        await lost_retries(pool, queue_name, ["later"])  # lost after the first run

        async def redriven_by_a_later_run() -> bool:
            return await queue_depth(amqp_url, queue_name) == 1

        await wait_for(redriven_by_a_later_run)
    finally:
        reconciler.stop()
        await asyncio.wait_for(task, timeout=30)
    (beat,) = await heartbeat.read_all(pool)
    assert beat.ok and beat.expected_every == 1.0


async def test_a_failing_run_is_recorded_in_the_heartbeat(
    pool: asyncpg.Pool, reconcilers: list[Reconciler]
) -> None:
    reconciler = reconciler_for(reconcilers, pool, "amqp://guest:guest@127.0.0.1:1/")
    with pytest.raises(ServiceUnavailable):
        await reconciler.run_once()
    (beat,) = await heartbeat.read_all(pool)
    assert beat.failing and beat.error is not None
    assert beat.error.startswith("ServiceUnavailable: cannot connect to RabbitMQ")


# --- business validity -----------------------------------------------------------------------


async def publish_at(
    amqp_url: str, queue: str, body: dict[str, Any], key: str, at: datetime
) -> None:
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        await channel.default_exchange.publish(
            aio_pika.Message(json.dumps(body).encode(), message_id=key, timestamp=at),
            routing_key=queue,
        )
    finally:
        await connection.close()


async def test_expired_or_unwanted_messages_are_skipped_and_never_handled(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    handled: list[str] = []

    async def handle(msg: Job, ctx: Context) -> None:
        handled.append(ctx.message_id)

    async def unlucky(self: Any, msg: Job, ctx: Context) -> str | None:
        return "thirteen is unlucky" if msg.n == 13 else None

    consumer = make_consumer(queue_name, handle, expires_after=60.0, should_skip=unlucky)
    cleanup.append(consumer)
    now = datetime.now(UTC)
    async with running_worker([consumer], amqp_url, database_url):
        await publish_at(amqp_url, queue_name, {"n": 1}, "old", now - timedelta(minutes=2))
        await publish_at(amqp_url, queue_name, {"n": 13}, "unlucky", now)
        await publish_at(amqp_url, queue_name, {"n": 2}, "fresh", now)
        await wait_status(pool, queue_name, "old", "skipped")
        await wait_status(pool, queue_name, "unlucky", "skipped")
        await wait_status(pool, queue_name, "fresh", "succeeded")
    assert handled == ["fresh"]
    rows = await pool.fetch(
        "SELECT l.message_id, l.reason, a.outcome FROM rabbitretry.ledger l"
        " JOIN rabbitretry.attempt a USING (queue, message_id) WHERE l.queue = $1"
        " AND l.status = 'skipped' ORDER BY l.message_id",
        queue_name,
    )
    assert [tuple(r) for r in rows] == [
        ("old", "expired", "skipped"),
        ("unlucky", "thirteen is unlucky", "skipped"),
    ]


async def test_a_should_skip_that_raises_fails_the_attempt_like_a_handler_would(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    async def refuse(self: Any, msg: Job, ctx: Context) -> str | None:
        raise Permanent("the account service refused the lookup")

    consumer = make_consumer(queue_name, never_called, should_skip=refuse)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url):
        await publish(amqp_url, queue_name, {"n": 1}, message_id="checked")
        await wait_status(pool, queue_name, "checked", "dead")
    row = await pool.fetchrow(
        "SELECT error_type, error_message FROM rabbitretry.ledger WHERE message_id = 'checked'"
    )
    assert row is not None
    assert row["error_message"] == "the account service refused the lookup"


async def test_the_reconciler_skips_overdue_work_that_expired_without_publishing_it(
    amqp_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    reconcilers: list[Reconciler],
) -> None:
    consumer = make_consumer(queue_name, never_called, expires_after=60.0)
    cleanup.append(consumer)
    await declared(amqp_url, consumer)
    await lost_retries(pool, queue_name, ["stale", "recent"])
    await pool.execute(
        "UPDATE rabbitretry.ledger SET first_seen = now() - interval '2 minutes'"
        " WHERE message_id = 'stale'"
    )
    report = await reconciler_for(reconcilers, pool, amqp_url, consumers=[consumer]).run_once()
    assert (report.expired_skipped, report.retries_redriven) == (1, 1)
    assert await drain(amqp_url, queue_name) == ["recent"]
    row = await pool.fetchrow(
        "SELECT status, reason FROM rabbitretry.ledger WHERE message_id = 'stale'"
    )
    assert row is not None and tuple(row) == ("skipped", "expired")


# --- expected vs actual ----------------------------------------------------------------------


async def test_a_key_never_published_is_republished_once_and_its_late_original_dropped(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    reconcilers: list[Reconciler],
) -> None:
    calls: collections.Counter[str] = collections.Counter()

    async def handle(msg: Job, ctx: Context) -> None:
        calls[ctx.message_id] += 1

    async def paid_orders(start: datetime, end: datetime) -> AsyncIterator[Expected]:
        for n in (1, 2, 3):
            yield Expected(f"order-{n}", {"n": n})

    consumer = make_consumer(queue_name, handle)
    cleanup.append(consumer)
    expected = Reconciliation("paid_orders", queue_name, paid_orders, lookback=600, settle=0)
    reconciler = reconciler_for(reconcilers, pool, amqp_url, reconciliations=[expected])
    async with running_worker([consumer], amqp_url, database_url) as worker:
        for key in ("order-1", "order-2", "refund-9"):  # order-3 is never published
            await publish(amqp_url, queue_name, {"n": 0}, message_id=key)
        for key in ("order-1", "order-2", "refund-9"):
            await wait_status(pool, queue_name, key, "succeeded")

        (window,) = (await reconciler.run_once()).windows
        assert (window.expected, window.succeeded, window.missing) == (3, 2, 1)
        assert (window.republished, window.orphaned, window.orphan_examples) == (
            1,
            1,
            ["refund-9"],
        )
        await wait_status(pool, queue_name, "order-3", "succeeded")

        await publish(amqp_url, queue_name, {"n": 3}, message_id="order-3")  # the late original

        async def late_original_dropped() -> bool:
            return any(
                o.key is not None and o.key.message_id == "order-3" and o.result == "dropped"
                for o in worker.outcomes
            )

        await wait_for(late_original_dropped)
        (again,) = (await reconciler.run_once()).windows
        assert (again.succeeded, again.missing, again.republished) == (3, 0, 0)
    assert calls == {"order-1": 1, "order-2": 1, "order-3": 1, "refund-9": 1}
    body = await pool.fetchval(
        "SELECT payload FROM rabbitretry.ledger WHERE queue = $1 AND message_id = 'order-3'",
        queue_name,
    )
    assert json.loads(body) == {"n": 3}  # the re-published payload came from the expectation


async def test_two_reconcilers_republish_a_missing_key_once(
    amqp_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    reconcilers: list[Reconciler],
) -> None:
    consumer = make_consumer(queue_name, never_called)
    cleanup.append(consumer)
    await declared(amqp_url, consumer)

    async def expected(start: datetime, end: datetime) -> AsyncIterator[Expected]:
        for n in range(50):
            yield Expected(f"k-{n}", {"n": n})

    item = Reconciliation("all", queue_name, expected, lookback=600, settle=0)
    made = [
        reconciler_for(reconcilers, pool, amqp_url, reconciliations=[item], grace=30.0)
        for _ in range(2)
    ]
    reports = await asyncio.gather(*(r.run_once() for r in made))
    assert sum(r.windows[0].republished for r in reports) == 50
    assert sorted(await drain(amqp_url, queue_name)) == sorted(f"k-{n}" for n in range(50))


# --- scale: every scan served by its index ---------------------------------------------------


async def plan_of(pool: asyncpg.Pool, statement: str, *args: Any) -> str:
    plan = await pool.fetchval(f"EXPLAIN (FORMAT JSON) {statement}", *args)
    return json.dumps(json.loads(plan) if isinstance(plan, str) else plan)


async def test_the_scans_use_their_indexes_not_a_sequential_scan(pool: asyncpg.Pool) -> None:
    from rabbitretry.db import query

    await pool.execute(
        """
        INSERT INTO rabbitretry.ledger (queue, message_id, status, attempts, max_attempts,
                                        finished_at, payload, next_retry_at, lease_until)
        SELECT 'q' || (n % 5), 'm' || n,
               CASE WHEN n % 100 = 0 THEN 'retrying' WHEN n % 100 = 1 THEN 'processing'
                    ELSE 'succeeded' END,
               1, 5, now() - make_interval(secs => n % 7200), '\\x7b7d',
               CASE WHEN n % 100 = 0 THEN now() - make_interval(secs => n % 600) END,
               CASE WHEN n % 100 = 1 THEN now() - make_interval(secs => n % 600) END
        FROM generate_series(1, 50000) AS n;
        INSERT INTO rabbitretry.outbox (exchange, routing_key, message_id, payload, status)
        SELECT '', 'q', 'o' || n, '\\x7b7d', CASE WHEN n % 100 = 0 THEN 'pending' ELSE 'sent' END
        FROM generate_series(1, 50000) AS n;
        ANALYZE rabbitretry.ledger;
        ANALYZE rabbitretry.outbox;
        """
    )
    scans = {
        "reconcile_overdue_retries": ("ledger_retry_due_idx", (30.0, 100)),
        "reconcile_expired_leases": ("ledger_lease_idx", (30.0, 100)),
        "reconcile_stuck_outbox": ("outbox_pending_idx", (30.0, 100)),
        "reconcile_orphans": (
            "ledger_succeeded_idx",
            (
                "q1",
                datetime.now(UTC) - timedelta(minutes=10),
                datetime.now(UTC),
                ["m1", "m6"],
                20,
            ),
        ),
    }
    for name, (index, args) in scans.items():
        plan = await plan_of(pool, query(name), *args)
        assert index in plan, f"{name} does not use {index}: {plan}"
        scanned = json.loads(plan)
        seq = [node for node in _nodes(scanned) if node.get("Node Type") == "Seq Scan"]
        assert not seq, f"{name} scans a table sequentially: {seq}"


def _nodes(plan: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(plan, list):
        for item in plan:
            found += _nodes(item)
    elif isinstance(plan, dict):
        found.append(plan)
        for value in plan.values():
            if isinstance(value, list | dict):
                found += _nodes(value)
    return found


async def test_republication_claims_are_forgotten_once_outside_the_window(
    amqp_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    reconcilers: list[Reconciler],
) -> None:
    consumer = make_consumer(queue_name, never_called)
    cleanup.append(consumer)
    await declared(amqp_url, consumer)

    async def nothing(start: datetime, end: datetime) -> AsyncIterator[Expected]:
        for _ in ():
            yield Expected("never", b"")

    await pool.execute(
        "INSERT INTO rabbitretry.reconciler_republished"
        " (queue, message_id, reconciliation, republished_at) VALUES"
        " ($1, 'old', 'daily', now() - interval '20 minutes'),"
        " ($1, 'recent', 'daily', now() - interval '5 minutes'),"
        " ($1, 'other', 'hourly', now() - interval '20 minutes')",
        queue_name,
    )
    item = Reconciliation("daily", queue_name, nothing, lookback=600, settle=0)
    await reconciler_for(reconcilers, pool, amqp_url, reconciliations=[item]).run_once()
    left = await pool.fetch(
        "SELECT message_id FROM rabbitretry.reconciler_republished ORDER BY message_id"
    )
    assert [r["message_id"] for r in left] == ["other", "recent"]
