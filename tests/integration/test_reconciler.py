"""The reconciler against the real broker and ledger: lost copies re-driven, never twice.

Most tests share one shape: put the ledger (or the outbox) in a state the broker lost, run the
reconciler, then check its report, what reached the work queue and the rows left behind. Each
shape is one parametrized test, a case per kind of loss; what fits no shape stands alone.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
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
    topology_of,
)
from rabbitretry.db import query
from rabbitretry.errors import ServiceUnavailable
from rabbitretry.ledger.failures import describe
from rabbitretry.monitoring import heartbeat
from rabbitretry.reconcile.expected import Expected, Reconciliation
from rabbitretry.reconcile.reconciler import Reconciler
from rabbitretry.topology import declare, delays
from tests.integration.conftest import BrokerCleanup
from tests.integration.harness import (
    is_marked,
    publish,
    queue_depth,
    running_worker,
    wait_for,
    wait_status,
)

pytestmark = pytest.mark.asyncio

ROOT = Path(__file__).resolve().parents[2]


class Job(BaseModel):
    n: int


Handler = Callable[[Job, Context], Awaitable[None]]


async def never_called(msg: Job, ctx: Context) -> None:
    raise AssertionError(f"the handler ran for {ctx.message_id}")


def expecting(name: str, queue: str, items: list[Expected]) -> Reconciliation:
    async def expected(start: datetime, end: datetime) -> AsyncIterator[Expected]:
        for item in items:
            yield item

    return Reconciliation(name, queue, expected, lookback=600, settle=0)


@dataclass
class Scene:
    """One test's broker, ledger and queue, and the reconcilers it made (closed afterwards)."""

    amqp_url: str
    database_url: str
    pool: asyncpg.Pool
    queue: str
    cleanup: list[type[Consumer[Any]]]
    made: list[Reconciler] = field(default_factory=list)

    async def consumer(
        self, handler: Handler = never_called, *, declared: bool = True, **attributes: Any
    ) -> type[Consumer[Job]]:
        """A consumer of the test queue; ``declared``: its topology is declared now (a running
        worker declares its own)."""

        class TestConsumer(Consumer[Job]):
            async def handle(self, msg: Job, ctx: Context) -> None:
                await handler(msg, ctx)

        TestConsumer.queue = self.queue
        TestConsumer.retry = RetryPolicy(max_attempts=3, initial_delay=4.0, jitter=0.0)
        for name, value in attributes.items():
            setattr(TestConsumer, name, value)
        self.cleanup.append(TestConsumer)
        if declared:
            connection = await amqp.connect(self.amqp_url, name="rabbitretry-tests")
            try:
                await declare(connection, topology_of([TestConsumer]))
            finally:
                await connection.close()
        return TestConsumer

    def reconciler(self, **options: Any) -> Reconciler:
        reconciler = Reconciler(self.pool, self.amqp_url, **{"grace": 1.0, **options})
        self.made.append(reconciler)
        return reconciler

    async def lost_retries(self, keys: list[str]) -> None:
        """Ledger rows that failed once and are overdue, with no copy anywhere on the broker."""
        properties = {"content_type": "application/json"}
        snapshot = ledger.Snapshot(b'{"n": 1}', {}, properties, "", self.queue)
        for index, key in enumerate(keys):
            claim = await ledger.claim(
                self.pool,
                ledger.Key(self.queue, key),
                max_attempts=3,
                lease_seconds=30,
                worker=f"gone:{index}",
                copy_attempts=0,
                snapshot=snapshot,
            )
            assert claim.verdict == "claimed"
            failure = describe(self.queue, ConnectionError("downstream down"))
            await ledger.schedule_retry(self.pool, ledger.Key(self.queue, key), 1, 0.0, failure)
        await self.pool.execute(
            "UPDATE rabbitretry.ledger SET next_retry_at = now() - interval '1 minute'"
            " WHERE queue = $1",
            self.queue,
        )

    async def rows(self, sql: str) -> list[tuple[Any, ...]]:
        """The rows of ``sql``, whose ``$1`` (if it has one) is the test queue."""
        args = (self.queue,) if "$1" in sql else ()
        return [tuple(row) for row in await self.pool.fetch(sql, *args)]

    async def until(self, sql: str) -> None:
        """Wait until ``sql`` (``$1``: the test queue) is true."""

        async def holds() -> bool:
            return bool(await self.pool.fetchval(sql, self.queue))

        holds.__name__ = sql
        await wait_for(holds)

    @contextlib.asynccontextmanager
    async def channel(self) -> AsyncIterator[aio_pika.abc.AbstractChannel]:
        connection = await aio_pika.connect(self.amqp_url)
        try:
            yield await connection.channel()
        finally:
            await connection.close()

    async def drain(self) -> list[str]:
        """Take every message off the test queue: their message_ids, in order."""
        ids: list[str] = []
        async with self.channel() as channel:
            work = await channel.declare_queue(self.queue, passive=True)
            while (message := await work.get(fail=False)) is not None:
                ids.append(str(message.message_id))
                await message.ack()
        return ids

    async def publish_at(self, key: str, n: int, at: datetime) -> None:
        async with self.channel() as channel:
            await channel.default_exchange.publish(
                aio_pika.Message(json.dumps({"n": n}).encode(), message_id=key, timestamp=at),
                routing_key=self.queue,
            )


@pytest.fixture
async def scene(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> AsyncIterator[Scene]:
    made = Scene(amqp_url, database_url, pool, queue_name, cleanup)
    yield made
    for reconciler in made.made:
        await reconciler.close()


# --- what the broker lost, and reconciler runs over it ----------------------------------------


@dataclass(frozen=True)
class Loss:
    """A state the broker lost, reconciler runs over it, and what they must leave behind."""

    arrange: Callable[[Scene], Awaitable[dict[str, Any]]]
    """Sets the state up; the reconcilers' options."""
    counts: dict[str, int]
    """``RunReport.counts()`` summed over the runs."""
    published: list[str] | None = None
    """What reached the work queue, each exactly once (in any order)."""
    rows: tuple[str, list[tuple[Any, ...]]] | None = None
    """A query (``$1``: the queue) and its rows after the runs."""
    runs: tuple[int, ...] = (0,)
    """Runs at once, by reconciler: ``(0, 1, 0)`` is two reconcilers, the first one twice."""
    taking_part: int = 0
    """How many of the first runs must each have done something."""


async def stuck_outbox(scene: Scene) -> dict[str, Any]:
    await scene.consumer()
    async with scene.pool.acquire() as conn, conn.transaction():
        await Outbox().enqueue(conn, "", {"n": 5}, routing_key=scene.queue, message_id="out-1")
        await Outbox().enqueue(conn, "", {"n": 6}, routing_key=scene.queue, message_id="out-2")
    await scene.pool.execute(
        "UPDATE rabbitretry.outbox SET next_try_at = now() - interval '1 minute'"
        " WHERE message_id = 'out-1'"
    )
    return {}


async def expired_retry(scene: Scene) -> dict[str, Any]:
    consumer = await scene.consumer(expires_after=60.0)
    await scene.lost_retries(["stale", "recent"])
    await scene.pool.execute(
        "UPDATE rabbitretry.ledger SET first_seen = now() - interval '2 minutes'"
        " WHERE message_id = 'stale'"
    )
    return {"consumers": [consumer]}


async def old_republication_claims(scene: Scene) -> dict[str, Any]:
    await scene.consumer()
    await scene.pool.execute(
        "INSERT INTO rabbitretry.reconciler_republished"
        " (queue, message_id, reconciliation, republished_at) VALUES"
        " ($1, 'old', 'daily', now() - interval '20 minutes'),"
        " ($1, 'recent', 'daily', now() - interval '5 minutes'),"
        " ($1, 'other', 'hourly', now() - interval '20 minutes')",
        scene.queue,
    )
    return {"reconciliations": [expecting("daily", scene.queue, [])]}


LOST = [f"lost-{n}" for n in range(150)]
MISSING = [f"k-{n}" for n in range(50)]


async def lost_retries(scene: Scene) -> dict[str, Any]:
    await scene.consumer()
    await scene.lost_retries(LOST)
    return {"batch_size": 7, "max_batches": 100, "publish_rate": 5000.0, "grace": 30.0}


async def missing_keys(scene: Scene) -> dict[str, Any]:
    await scene.consumer()
    expected = [Expected(key, {"n": n}) for n, key in enumerate(MISSING)]
    return {"reconciliations": [expecting("all", scene.queue, expected)], "grace": 30.0}


LOSSES = {
    "outbox-row-no-relay-published-is-published": Loss(
        stuck_outbox,
        {"outbox_published": 1},  # out-2 is not late yet: it is the relay's
        published=["out-1"],
        rows=(
            "SELECT message_id, status FROM rabbitretry.outbox ORDER BY id",
            [("out-1", "sent"), ("out-2", "pending")],
        ),
    ),
    "overdue-work-that-expired-is-skipped-not-published": Loss(
        expired_retry,
        {"expired_skipped": 1, "retries_redriven": 1},
        published=["recent"],
        rows=(
            "SELECT status, reason FROM rabbitretry.ledger WHERE message_id = 'stale'",
            [("skipped", "expired")],
        ),
    ),
    "republication-claims-outside-the-window-are-forgotten": Loss(
        old_republication_claims,
        {},
        rows=(
            "SELECT message_id FROM rabbitretry.reconciler_republished ORDER BY message_id",
            [("other",), ("recent",)],
        ),
    ),
    "two-reconcilers-redrive-each-lost-retry-once": Loss(
        lost_retries,
        {"retries_redriven": len(LOST)},
        published=LOST,
        rows=("SELECT DISTINCT redrives FROM rabbitretry.ledger WHERE queue = $1", [(1,)]),
        runs=(0, 1, 0),
        taking_part=2,  # both reconcilers
    ),
    "two-reconcilers-republish-each-missing-key-once": Loss(
        missing_keys, {"republished": len(MISSING)}, published=MISSING, runs=(0, 1)
    ),
}


@pytest.mark.parametrize("loss", LOSSES.values(), ids=LOSSES.keys())
async def test_reconciler_runs_repair_what_was_lost_and_publish_nothing_twice(
    scene: Scene, loss: Loss
) -> None:
    options = await loss.arrange(scene)
    made = [scene.reconciler(**options) for _ in range(max(loss.runs) + 1)]
    reports = await asyncio.gather(*(made[which].run_once() for which in loss.runs))
    counts = [report.counts() for report in reports]
    assert {name: sum(c[name] for c in counts) for name in loss.counts} == loss.counts
    assert all(any(c[name] for name in loss.counts) for c in counts[: loss.taking_part])
    if loss.published is not None:
        assert sorted(await scene.drain()) == sorted(loss.published)
    if loss.rows is not None:
        assert await scene.rows(loss.rows[0]) == loss.rows[1]


async def test_a_row_redriven_again_and_again_waits_longer_each_time(scene: Scene) -> None:
    await scene.consumer()
    await scene.lost_retries(["unlucky"])  # no worker ever takes the copies
    reconciler = scene.reconciler(grace=30.0)
    assert (await reconciler.run_once()).retries_redriven == 1
    # Re-driven that many seconds ago: within the grace period, past it (the second re-drive),
    # within the hold-off that is now 2 x 30 s, past it.
    for seconds_ago, expected in [(10, 0), (45, 1), (45, 0), (75, 1)]:
        await scene.pool.execute(
            "UPDATE rabbitretry.ledger SET redriven_at = now() - make_interval(secs => $1)",
            seconds_ago,
        )
        assert (await reconciler.run_once()).retries_redriven == expected
    assert len(await scene.drain()) == 3


# --- lost copies re-driven to a running worker -------------------------------------------------


async def test_retries_whose_delay_copies_were_lost_are_redriven_and_succeed(
    scene: Scene,
) -> None:
    calls: collections.Counter[str] = collections.Counter()

    async def fail_first(msg: Job, ctx: Context) -> None:
        calls[ctx.message_id] += 1
        if ctx.attempt == 1:
            raise ConnectionError("downstream down")

    consumer = await scene.consumer(fail_first, declared=False)
    keys = ["r-1", "r-2", "r-3"]
    async with running_worker([consumer], scene.amqp_url, scene.database_url):
        for key in keys:
            await publish(scene.amqp_url, scene.queue, {"n": 1}, message_id=key)
        await scene.until(
            "SELECT count(*) = 3 FROM rabbitretry.ledger WHERE queue = $1"
            " AND status = 'retrying' AND retry_copy_confirmed"
        )
        # The broker loses the delay copies (as a classic queue may in a crash): here, at the
        # end of the delay chain, where nothing routes them back to the work queue any more.
        async with scene.channel() as channel:
            work = await channel.declare_queue(scene.queue, passive=True)
            await work.unbind(delays.DELIVER_EXCHANGE, routing_key=delays.deliver_key(scene.queue))
        await scene.until(
            "SELECT count(*) = 3 FROM rabbitretry.ledger WHERE queue = $1"
            " AND status = 'retrying' AND next_retry_at < now() - interval '1 second'"
        )
        reconciler = scene.reconciler()
        assert (await reconciler.run_once()).retries_redriven == len(keys)
        for key in keys:
            await wait_status(scene.pool, scene.queue, key, "succeeded")
        assert (await reconciler.run_once()).retries_redriven == 0

    assert calls == {key: 2 for key in keys}  # the failed attempt and the re-driven one
    outcomes = await scene.rows(
        "SELECT message_id, array_agg(outcome ORDER BY attempt) FROM rabbitretry.attempt_history"
        " WHERE queue = $1 GROUP BY message_id"
    )
    assert dict(outcomes) == {key: ["retry", "succeeded"] for key in keys}
    beat = next(b for b in await heartbeat.read_all(scene.pool) if b.name == "reconciler")
    assert beat.ok and beat.counts["retries_redriven"] == 0 and beat.finished_at is not None


@pytest.mark.slow
async def test_a_dead_workers_lost_delivery_is_redriven_after_its_lease(
    scene: Scene, broker_cleanup: BrokerCleanup, tmp_path: Path
) -> None:
    from tests.integration import crash_consumers

    events = tmp_path / "events.log"
    events.touch()
    env = {
        **os.environ,
        "RABBITRETRY_AMQP_URL": scene.amqp_url,
        "RABBITRETRY_DATABASE_URL": scene.database_url,
        "RR_TEST_QUEUE": scene.queue,
        "RR_EVENTS": str(events),
        "RR_LEASE": "2",
        "RR_MODE": "hang-first",
    }
    work_queue = crash_consumers.Crashy.work_queue().model_copy(update={"name": scene.queue})
    broker_cleanup.topology(Topology(queues=[work_queue]))
    cli = "from rabbitretry.cli import main; main()"
    command = [sys.executable, "-c", cli, "run", "tests.integration.crash_consumers:Crashy"]

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [*command, "--declare"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def lines(kind: str) -> list[str]:
        return [line for line in events.read_text().splitlines() if line.startswith(kind)]

    async def published() -> bool:
        try:
            await publish(scene.amqp_url, scene.queue, {"n": 1}, message_id="held")
        except Exception:
            return False  # the worker has not declared its queue yet
        return True

    async def requeued() -> bool:
        return await queue_depth(scene.amqp_url, scene.queue) == 1

    worker = start()
    try:
        await wait_for(published, timeout=30, interval=0.3)
        # Killed before its start mark, attempt 1 would be forgiven and run again (and hang again).
        await wait_for(lambda: is_marked(scene.pool, scene.queue, "held"))
        worker.kill()  # SIGKILL inside the handler: the lease is left to run out
        worker.wait(10)
        await wait_for(requeued)  # the broker requeues the unacked delivery; then loses it too
        async with scene.channel() as channel:
            purged = await (await channel.declare_queue(scene.queue, passive=True)).purge()
        assert int(purged.message_count or 0) == 1
        await scene.until(
            "SELECT lease_until < now() - interval '1 second' FROM rabbitretry.ledger"
            " WHERE queue = $1 AND message_id = 'held' AND status = 'processing'"
        )
        report = await scene.reconciler().run_once()
        assert (report.leases_redriven, report.retries_redriven) == (1, 0)
        assert await queue_depth(scene.amqp_url, scene.queue) == 1
        worker = start()
        await wait_status(scene.pool, scene.queue, "held", "succeeded")
    finally:
        worker.kill()
        worker.wait(10)
    assert await scene.rows(
        "SELECT attempt, outcome FROM rabbitretry.attempt_history WHERE queue = $1 ORDER BY attempt"
    ) == [(1, "crashed"), (2, "succeeded")]
    assert len(lines("done")) == 1


# --- running on an interval, and failing visibly -----------------------------------------------


async def test_an_embedded_reconciler_keeps_running_until_stopped(scene: Scene) -> None:
    await scene.consumer()
    reconciler = scene.reconciler()
    task = asyncio.create_task(reconciler.run(interval=1.0))

    async def a_run_finished() -> bool:
        beats = await heartbeat.read_all(scene.pool)
        return bool(beats and beats[0].finished_at is not None)

    async def redriven_by_a_later_run() -> bool:
        return await queue_depth(scene.amqp_url, scene.queue) == 1

    try:
        await wait_for(a_run_finished)
        await scene.lost_retries(["later"])  # lost after the first run
        await wait_for(redriven_by_a_later_run)
    finally:
        reconciler.stop()
        await asyncio.wait_for(task, timeout=30)
    (beat,) = await heartbeat.read_all(scene.pool)
    assert beat.ok and beat.expected_every == 1.0


async def test_a_failing_run_is_recorded_in_the_heartbeat(scene: Scene) -> None:
    reconciler = Reconciler(scene.pool, "amqp://guest:guest@127.0.0.1:1/", grace=1.0)
    scene.made.append(reconciler)
    with pytest.raises(ServiceUnavailable):
        await reconciler.run_once()
    (beat,) = await heartbeat.read_all(scene.pool)
    assert beat.failing and beat.error is not None
    assert beat.error.startswith("ServiceUnavailable: cannot connect to RabbitMQ")


async def test_a_stuck_keys_backlog_leaves_in_one_batch_in_order_up_to_a_refused_row(
    scene: Scene,
) -> None:
    """Rows of one ordering key that no relay published: a batch takes the key's oldest row
    and the rows behind it, and publishes them in order; a row the broker refuses ends the
    run, and the row behind it waits untried (one batch took one row of the key before)."""
    await scene.consumer()
    exchanges = ["", "", "", f"{scene.queue}.missing", ""]
    async with scene.pool.acquire() as conn, conn.transaction():
        for n, exchange in enumerate(exchanges, start=1):
            routing_key = scene.queue if exchange == "" else "k"
            await Outbox().enqueue(
                conn, exchange, {"n": n}, routing_key=routing_key, message_id=f"k-{n}",
                ordering_key="k",
            )  # fmt: skip
    await scene.pool.execute("UPDATE rabbitretry.outbox SET next_try_at = now() - interval '1 h'")

    report = await scene.reconciler(max_batches=1).run_once()

    assert report.outbox_published == 3
    assert await scene.drain() == ["k-1", "k-2", "k-3"]
    assert await scene.rows(
        "SELECT message_id, status, tries FROM rabbitretry.outbox ORDER BY id"
    ) == [
        ("k-1", "sent", 1), ("k-2", "sent", 1), ("k-3", "sent", 1), ("k-4", "pending", 1),
        ("k-5", "pending", 0),
    ]  # fmt: skip


async def test_a_failing_step_is_its_own_and_the_other_steps_still_run(scene: Scene) -> None:
    """A refused outbox row and an expectation hook with a bug: the run re-drives the lost
    retries, records the refusal, reports the failed step, and its heartbeat says so."""
    await scene.consumer()
    await scene.lost_retries(["lost"])
    async with scene.pool.acquire() as conn, conn.transaction():
        await Outbox().enqueue(
            conn, f"{scene.queue}.missing", {"n": 1}, routing_key="k", message_id="refused"
        )
    await scene.pool.execute("UPDATE rabbitretry.outbox SET next_try_at = now() - interval '1 h'")

    async def broken(start: datetime, end: datetime) -> AsyncIterator[Expected]:
        raise KeyError("a bug in the application's hook")
        yield  # an async generator

    hook = Reconciliation("broken", scene.queue, broken, lookback=600, settle=0)
    report = await scene.reconciler(reconciliations=[hook]).run_once()
    assert (report.retries_redriven, report.failed_steps) == (1, ["reconciliation broken"])
    assert report.errors == [
        f"outbox row 1: the broker refused message 'refused': exchange '{scene.queue}.missing'"
        " does not exist",
        'reconciliation broken: KeyError: "a bug in the application\'s hook"',
    ]
    assert await scene.drain() == ["lost"]
    (beat,) = await heartbeat.read_all(scene.pool)
    assert beat.error is not None and "reconciliation broken: KeyError" in beat.error
    # The refusal was a counted try of the row (no relay runs here to count it).
    assert await scene.rows("SELECT status, tries FROM rabbitretry.outbox") == [("pending", 1)]


async def test_a_refused_redrive_fails_that_message_alone_and_the_run_goes_on(
    scene: Scene,
) -> None:
    """Three lost retries: one whose stored headers no longer fit in a frame (content: no
    re-drive can ever carry it), one of a queue since deleted (its copy comes back unroutable),
    one fine; and a stuck outbox row. The frame-sized one made RabbitMQ close the connection,
    ending the step as an outage with the rows behind it; then it was reported again on every
    pass. Now it ends dead with the reason, the unroutable one is reported and left for the
    next pass, and everything else is done."""
    await scene.consumer()
    await scene.lost_retries(["huge"])
    gone = Scene(scene.amqp_url, scene.database_url, scene.pool, f"{scene.queue}.gone", [])
    await gone.lost_retries(["orphan"])
    await scene.lost_retries(["fine"])
    await scene.pool.execute(
        "UPDATE rabbitretry.ledger SET headers = $1::jsonb WHERE message_id = 'huge'",
        json.dumps({"big": "x" * 200_000}),
    )
    async with scene.pool.acquire() as conn, conn.transaction():
        await Outbox().enqueue(conn, "", {"n": 2}, routing_key=scene.queue, message_id="outbox")
    await scene.pool.execute("UPDATE rabbitretry.outbox SET next_try_at = now() - interval '1 h'")

    report = await scene.reconciler().run_once()

    assert (report.retries_redriven, report.outbox_published) == (1, 1)
    assert report.failed_steps == []
    orphan, huge = sorted(report.errors)  # in the scan's order, which ties may swap
    assert huge.startswith(
        f"{scene.queue}/huge: message 'huge' cannot be published: its properties and headers"
    )
    assert orphan == (
        f"{gone.queue}/orphan: no queue is bound for exchange '(default)' with routing key "
        f"'{gone.queue}'"
    )
    assert sorted(await scene.drain()) == ["fine", "outbox"]
    rows = await scene.pool.fetch(
        "SELECT message_id, status, reason FROM rabbitretry.ledger ORDER BY message_id"
    )
    assert [tuple(row) for row in rows] == [
        ("fine", "retrying", None),
        ("huge", "dead", "unpublishable"),
        ("orphan", "retrying", None),  # re-driven again once its queue is back
    ]
    # A second pass (past the grace) never tries the dead one again.
    await scene.pool.execute(
        "UPDATE rabbitretry.ledger SET next_retry_at = now() - interval '1 minute',"
        " redriven_at = NULL"
    )
    again = await scene.reconciler().run_once()
    assert [error.split(":")[0] for error in again.errors] == [f"{gone.queue}/orphan"]


# --- business validity -------------------------------------------------------------------------


async def unlucky(self: Any, msg: Job, ctx: Context) -> str | None:
    return "thirteen is unlucky" if msg.n == 13 else None


async def refuse(self: Any, msg: Job, ctx: Context) -> str | None:
    raise Permanent("the account service refused the lookup")


SKIPPED_ROWS = (
    "SELECT l.message_id, l.reason, a.outcome FROM rabbitretry.ledger l"
    " JOIN rabbitretry.attempt_history a USING (queue, message_id) WHERE l.queue = $1"
    " AND l.status = 'skipped' ORDER BY l.message_id"
)


@pytest.mark.parametrize(
    ("attributes", "published", "statuses", "handled", "sql", "rows"),
    [
        pytest.param(
            {"expires_after": 60.0, "should_skip": unlucky},
            [("old", 1, 120), ("unlucky", 13, 0), ("fresh", 2, 0)],  # key, n, age in seconds
            {"old": "skipped", "unlucky": "skipped", "fresh": "succeeded"},
            ["fresh"],
            SKIPPED_ROWS,
            [("old", "expired", "skipped"), ("unlucky", "thirteen is unlucky", "skipped")],
            id="expired-or-unwanted-messages-are-skipped",
        ),
        pytest.param(
            {"should_skip": refuse},
            [("checked", 1, 0)],
            {"checked": "dead"},
            [],
            "SELECT error_message FROM rabbitretry.ledger WHERE message_id = 'checked'",
            [("the account service refused the lookup",)],
            id="a-should-skip-that-raises-fails-the-attempt-like-a-handler",
        ),
    ],
)
async def test_the_worker_never_handles_what_it_should_not(
    scene: Scene,
    attributes: dict[str, Any],
    published: list[tuple[str, int, int]],
    statuses: dict[str, str],
    handled: list[str],
    sql: str,
    rows: list[tuple[Any, ...]],
) -> None:
    seen: list[str] = []

    async def handle(msg: Job, ctx: Context) -> None:
        seen.append(ctx.message_id)

    consumer = await scene.consumer(handle, declared=False, **attributes)
    now = datetime.now(UTC)
    async with running_worker([consumer], scene.amqp_url, scene.database_url):
        for key, n, age in published:
            await scene.publish_at(key, n, now - timedelta(seconds=age))
        for key, status in statuses.items():
            await wait_status(scene.pool, scene.queue, key, status)
    assert seen == handled
    assert await scene.rows(sql) == rows


# --- expected vs actual ------------------------------------------------------------------------


async def test_a_key_never_published_is_republished_once_and_its_late_original_dropped(
    scene: Scene,
) -> None:
    calls: collections.Counter[str] = collections.Counter()

    async def handle(msg: Job, ctx: Context) -> None:
        calls[ctx.message_id] += 1

    consumer = await scene.consumer(handle, declared=False, keep_payload="always")
    orders = [Expected(f"order-{n}", {"n": n}) for n in (1, 2, 3)]
    reconciler = scene.reconciler(reconciliations=[expecting("paid_orders", scene.queue, orders)])
    async with running_worker([consumer], scene.amqp_url, scene.database_url) as worker:
        for key in ("order-1", "order-2", "refund-9"):  # order-3 is never published
            await publish(scene.amqp_url, scene.queue, {"n": 0}, message_id=key)
        for key in ("order-1", "order-2", "refund-9"):
            await wait_status(scene.pool, scene.queue, key, "succeeded")

        (window,) = (await reconciler.run_once()).windows
        assert (window.expected, window.succeeded, window.missing) == (3, 2, 1)
        assert (window.republished, window.orphaned, window.orphan_examples) == (
            1,
            1,
            ["refund-9"],
        )
        await wait_status(scene.pool, scene.queue, "order-3", "succeeded")
        await publish(scene.amqp_url, scene.queue, {"n": 3}, message_id="order-3")  # late

        async def late_original_dropped() -> bool:
            return any(
                o.key is not None and o.key.message_id == "order-3" and o.result == "dropped"
                for o in worker.outcomes
            )

        await wait_for(late_original_dropped)
        (again,) = (await reconciler.run_once()).windows
        assert (again.succeeded, again.missing, again.republished) == (3, 0, 0)
    assert calls == {"order-1": 1, "order-2": 1, "order-3": 1, "refund-9": 1}
    ((body,),) = await scene.rows(
        "SELECT payload FROM rabbitretry.ledger WHERE queue = $1 AND message_id = 'order-3'"
    )
    assert json.loads(body) == {"n": 3}  # the re-published payload came from the expectation


# --- scale: every scan served by its index -----------------------------------------------------

SCALE = """
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
LAST_TEN_MINUTES = (timedelta(minutes=-10), timedelta(0))  # from the time of the test


@pytest.mark.parametrize(
    ("name", "index", "args"),
    [
        pytest.param(
            "reconcile_overdue_retries", "ledger_retry_due_idx", (30.0, 100), id="retries"
        ),
        pytest.param("reconcile_expired_leases", "ledger_lease_idx", (30.0, 100), id="leases"),
        pytest.param("reconcile_stuck_outbox", "outbox_pending_idx", (30.0, 100), id="outbox"),
        pytest.param(
            "reconcile_orphans",
            "ledger_succeeded_idx",
            ("q1", *LAST_TEN_MINUTES, ["m1", "m6"], 20),
            id="orphans",
        ),
    ],
)
async def test_the_scans_use_their_indexes_not_a_sequential_scan(
    pool: asyncpg.Pool, name: str, index: str, args: tuple[Any, ...]
) -> None:
    await pool.execute(SCALE)
    now = datetime.now(UTC)
    args = tuple(now + arg if isinstance(arg, timedelta) else arg for arg in args)
    explained = await pool.fetchval(f"EXPLAIN (FORMAT JSON) {query(name)}", *args)
    plan = json.dumps(json.loads(explained) if isinstance(explained, str) else explained)
    assert index in plan, f"{name} does not use {index}: {plan}"
    assert '"Node Type": "Seq Scan"' not in plan, f"{name} scans a table sequentially: {plan}"
