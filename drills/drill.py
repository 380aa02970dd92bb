"""One drill from start to verdict: set up, publish while injecting faults, settle, verify.

Everything the drill creates (a private PostgreSQL server when the database crash is on, a
scratch database, a random queue with its delay and dead queues, two proxies, the worker
process) is removed in a ``finally``, and every fault is undone there too, whether the drill
passed, failed, or was interrupted with Ctrl-C. A failed drill (or ``keep``) leaves the scratch
database (with its private server, stopped), the worker log and the handler starts behind for a
post-mortem.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg

from drills.consumer import CREATE_EFFECTS, STARTS_ENV, DrillConsumer
from drills.faults import Faults
from drills.plan import Fault, Message, Plan, make_plan
from drills.private_postgres import PrivatePostgres, private_postgres
from drills.supervisor import Supervisor
from drills.verify import Verdict, read_handler_starts, unfinished, verify
from rabbitretry import amqp, db, urls
from rabbitretry.reconcile.reconciler import Reconciler
from rabbitretry.topology import Topology, declare
from rabbitretry.topology.model import QueueType
from tests.proxy import Proxy

ROOT = Path(__file__).resolve().parents[1]
CONSUMER = "drills.consumer:DrillConsumer"
REPUBLISH_PAUSE = 0.5  # seconds between attempts to publish while the broker is away
# A reconciler runs beside the worker, as in production: it re-drives copies the broker lost
# entirely (a classic queue's dead-lettering is at-most-once across a broker restart).
RECONCILE_EVERY = 5.0
RECONCILE_GRACE = 15.0
DATABASE_CRASH_ENV = "RABBITRETRY_DRILL_DATABASE_CRASH"  # "0": no crash, no private server


@dataclass(frozen=True)
class DrillConfig:
    amqp_url: str
    database_url: str
    """The PostgreSQL server to create the scratch database on (any database on it), unless
    ``crash_database`` puts it on a private server of the drill's own."""
    messages: int = 5000
    seed: int = 0
    publish_seconds: float = 90.0
    concurrency: int = 16
    settle_timeout: float = 300.0
    restart_broker: bool = True
    crash_database: bool = True
    keep: bool = False


@dataclass(frozen=True)
class DrillResult:
    plan: Plan
    verdict: Verdict
    republished: int
    worker_exits: dict[int, int]
    recovered_seconds: float
    total_seconds: float
    worker_log: Path
    database: str
    database_outages: list[float]
    leader_changes: list[float] = field(default_factory=list)
    """The cluster drill: seconds from each stop of the node leading the work queue until
    another node led it."""

    def details(self) -> str:
        exits = ", ".join(f"{n}x exit {code}" for code, n in sorted(self.worker_exits.items()))
        return (
            f"drill: seed {self.plan.seed}; {self.verdict.attempts} attempts; worker exits: "
            f"{exits or 'none'}; {self.republished} publishes sent again; "
            f"{self.total_seconds:.0f} s in all"
            + "".join(f"; database down {s:.1f} s" for s in self.database_outages)
            + "".join(f"; new work queue leader after {s:.1f} s" for s in self.leader_changes)
        )

    def summary(self) -> str:
        v = self.verdict
        return (
            f"drill: {v.sent} sent, {v.succeeded} succeeded, {v.dead} dead, {len(v.lost)} lost, "
            f"{len(v.duplicate_effects)} duplicate effects, "
            f"{'?' if v.handler_runs is None else len(v.charged_without_run)} attempts charged "
            f"without a handler run, recovered in {self.recovered_seconds:.1f} s"
        )


class Injector(Protocol):
    """What strikes the faults of a plan (:class:`drills.faults.Faults` and the cluster's)."""

    async def inject(self, fault: Fault) -> None: ...


Enqueue = Callable[[Message], Awaitable[bool]]
"""Takes a message into the outbox instead of publishing it (True), or leaves it (False)."""


class Clock:
    def __init__(self, say: Callable[[str], None]) -> None:
        self.start = time.monotonic()
        self._say = say

    def now(self) -> float:
        return time.monotonic() - self.start

    def say(self, text: str) -> None:
        self._say(f"[{self.now():6.1f}s] {text}")


async def run_drill(config: DrillConfig, say: Callable[[str], None] = print) -> DrillResult:
    clock = Clock(say)
    plan = make_plan(config.seed, config.messages, publish_seconds=config.publish_seconds)
    if not config.restart_broker:
        plan = plan.without("restart-broker")
    if not config.crash_database:
        plan = plan.without("crash-database")
    queue = f"rr-drill-{secrets.token_hex(4)}"
    scratch = f"rabbitretry_drill_{secrets.token_hex(4)}"
    logs = Path(tempfile.mkdtemp(prefix="rabbitretry-drill-"))
    starts = logs / "handler-starts.txt"
    clock.say(
        f"seed {plan.seed}: {len(plan.messages)} messages ({len(plan.of_kind('transient'))} "
        f"transient, {len(plan.of_kind('poison'))} poison, {len(plan.of_kind('crasher'))} "
        f"crashers, {len(plan.of_kind('slow'))} slow) on queue {queue}, database {scratch}, "
        f"worker log {logs / 'worker.log'}"
    )
    clock.say(
        "faults, in seconds after publishing starts: "
        + ", ".join(f"{f.fault} at {f.at:.1f} s" for f in plan.faults)
    )
    keep = Keep(config.keep)
    try:
        async with contextlib.AsyncExitStack() as stack:
            server_url, server = config.database_url, None
            if config.crash_database:
                server = stack.enter_context(private_postgres())
                stack.callback(_keep_server, server, keep)
                server_url = server.url
                clock.say(f"private PostgreSQL on 127.0.0.1:{server.port} in {server.root}")
            database_url = await stack.enter_async_context(
                scratch_database(server_url, scratch, keep)
            )
            await stack.enter_async_context(drill_queue(config.amqp_url, queue))
            broker_proxy = await stack.enter_async_context(proxied(config.amqp_url))
            database_proxy = await stack.enter_async_context(proxied(database_url))
            supervisor = Supervisor(
                CONSUMER,
                {
                    **os.environ,
                    "RABBITRETRY_AMQP_URL": broker_proxy.url_for(config.amqp_url),
                    "RABBITRETRY_DATABASE_URL": database_proxy.url_for(database_url),
                    "RABBITRETRY_DRILL_QUEUE": queue,
                    STARTS_ENV: str(starts),
                },
                logs / "worker.log",
                concurrency=config.concurrency,
                cwd=ROOT,
            )
            broker = urlsplit(config.amqp_url)
            faults = Faults(
                supervisor,
                broker_proxy,
                database_proxy,
                broker.hostname or "127.0.0.1",
                broker.port or 5672,
                clock.say,
                database_server=server,
            )
            try:
                supervisor.start()
                verdict, republished, recovered = await _exercise(
                    config, plan, queue, database_url, faults, clock, starts
                )
            finally:
                faults.restore()
                await supervisor.stop()
            result = DrillResult(
                plan,
                verdict,
                republished,
                dict(supervisor.exits),
                recovered,
                clock.now(),
                logs / "worker.log",
                _describe(scratch, server),
                faults.database_outages,
            )
            keep.wanted = keep.wanted or not result.verdict.ok
            return result
    finally:
        if not keep.wanted:
            shutil.rmtree(logs, ignore_errors=True)


def _keep_server(server: PrivatePostgres, keep: Keep) -> None:
    if keep.wanted:
        server.keep()


def _describe(scratch: str, server: PrivatePostgres | None) -> str:
    if server is None:
        return scratch
    return (
        f"{scratch} on the private server in {server.root}, port {server.port} "
        f"(start it with: {server.start_command()})"
    )


async def _exercise(
    config: DrillConfig,
    plan: Plan,
    queue: str,
    database_url: str,
    faults: Faults,
    clock: Clock,
    starts: Path,
) -> tuple[Verdict, int, float]:
    """Publish and inject the faults, wait for the work to settle; (verdict, re-sends, recovery)."""
    async with _reconciling(config.amqp_url, database_url):
        return await _publish_and_settle(config, plan, queue, database_url, faults, clock, starts)


@contextlib.asynccontextmanager
async def _reconciling(amqp_url: str, database_url: str) -> AsyncIterator[None]:
    pool = await db.create_pool(database_url, min_size=1, max_size=2)
    reconciler = Reconciler(pool, amqp_url, grace=RECONCILE_GRACE)
    running = asyncio.create_task(reconciler.run(RECONCILE_EVERY))
    try:
        yield
    finally:
        reconciler.stop()
        await asyncio.wait_for(running, 30)
        await pool.close()


async def _publish_and_settle(
    config: DrillConfig,
    plan: Plan,
    queue: str,
    database_url: str,
    faults: Injector,
    clock: Clock,
    starts: Path,
    enqueue: Enqueue | None = None,
) -> tuple[Verdict, int, float]:
    # Fault times count from the start of publishing, as the plan's message times do.
    published_from = clock.now()
    clock.say(f"publishing starts ({plan.publish_seconds:.0f} s)")
    publisher = asyncio.create_task(_publish(config.amqp_url, queue, plan, clock, enqueue))
    try:
        for scheduled in plan.faults:
            await asyncio.sleep(max(0.0, published_from + scheduled.at - clock.now()))
            await faults.inject(scheduled.fault)
        last_fault_restored = clock.now()
        republished = await publisher
    finally:
        publisher.cancel()
    clock.say(f"all {len(plan.messages)} messages published ({republished} sent again)")

    ids = [m.message_id for m in plan.messages]
    conn = await asyncpg.connect(database_url)
    try:
        deadline = clock.now() + config.settle_timeout
        left = await unfinished(conn, queue, ids)
        while left and clock.now() < deadline:
            await asyncio.sleep(0.5)
            left = await unfinished(conn, queue, ids)
        settled = clock.now()
        clock.say(
            "every message is finished"
            if not left
            else f"{left} message(s) still unfinished after {config.settle_timeout:.0f} s"
        )
        redriven = await conn.fetchval(
            "SELECT coalesce(sum(redrives), 0) FROM rabbitretry.ledger WHERE queue = $1", queue
        )
        clock.say(f"the reconciler re-drove {redriven} message(s) the broker had lost")
        verdict = await verify(conn, queue, plan.messages, read_handler_starts(starts))
    finally:
        await conn.close()
    return verdict, republished, max(0.0, settled - last_fault_restored)


async def _publish(
    amqp_url: str, queue: str, plan: Plan, clock: Clock, enqueue: Enqueue | None = None
) -> int:
    """Publish every message with confirms, paced over the window; the count of re-sends.

    A publish that is not confirmed (the broker went away) is sent again with the same
    message_id until it is: a copy may then exist twice, which the ledger must absorb. With
    several URLs (a cluster), each new connection goes to the next node. ``enqueue`` may take
    a message into the outbox instead.
    """
    interval = plan.publish_seconds / max(1, len(plan.messages))
    start = clock.now()
    republished = 0
    nodes = itertools.cycle(urls.split_urls(amqp_url))
    channel: aio_pika.abc.AbstractChannel | None = None
    connection: aio_pika.abc.AbstractConnection | None = None
    try:
        for index, message in enumerate(plan.messages):
            await asyncio.sleep(max(0.0, start + index * interval - clock.now()))
            if enqueue is not None and await enqueue(message):
                continue
            while True:
                try:
                    if channel is None or channel.is_closed:
                        if connection is not None:
                            with contextlib.suppress(Exception):
                                await connection.close()
                        connection = await aio_pika.connect(next(nodes), timeout=5)
                        channel = await connection.channel(
                            publisher_confirms=True, on_return_raises=True
                        )
                    await _send(channel, queue, message)
                    break
                except (aio_pika.exceptions.AMQPError, OSError, RuntimeError, TimeoutError):
                    republished += 1
                    channel = None
                    await asyncio.sleep(REPUBLISH_PAUSE)
    finally:
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()
    return republished


async def _send(channel: aio_pika.abc.AbstractChannel, queue: str, message: Message) -> None:
    await asyncio.wait_for(
        channel.default_exchange.publish(
            aio_pika.Message(
                json.dumps(message.body()).encode(),
                message_id=message.message_id,
                content_type="application/json",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            ),
            routing_key=queue,
            mandatory=True,
        ),
        timeout=10,
    )


@dataclass
class Keep:
    """Whether to leave the scratch database and the worker log behind."""

    wanted: bool


@contextlib.asynccontextmanager
async def scratch_database(server_url: str, name: str, keep: Keep) -> AsyncIterator[str]:
    """A new database, migrated, with the effects table; dropped on the way out unless kept."""
    admin = await asyncpg.connect(server_url)
    try:
        await admin.execute(f"CREATE DATABASE {name}")
    finally:
        await admin.close()
    url = urlunsplit(urlsplit(server_url)._replace(path=f"/{name}"))
    try:
        conn = await asyncpg.connect(url)
        try:
            await db.migrate(conn)
            await conn.execute(CREATE_EFFECTS)
        finally:
            await conn.close()
        yield url
    finally:
        if not keep.wanted:
            admin = await asyncpg.connect(server_url)
            try:
                await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            finally:
                await admin.close()


@contextlib.asynccontextmanager
async def drill_queue(
    amqp_url: str, queue: str, queue_type: QueueType = "classic"
) -> AsyncIterator[Topology]:
    """The drill queue's topology, declared; every queue of it deleted on the way out."""
    work_queue = DrillConsumer.work_queue().model_copy(update={"name": queue, "type": queue_type})
    topology = Topology(queues=[work_queue])
    connection = await amqp.connect(amqp_url, name="rabbitretry-drill")
    try:
        await declare(connection, topology)
    finally:
        await connection.close()
    try:
        yield topology
    finally:
        await _delete_queues(
            amqp_url, [q.name for q in topology.queue_declarations() if not q.shared]
        )


async def _delete_queues(amqp_url: str, names: list[str]) -> None:
    connection = await amqp.connect(amqp_url, name="rabbitretry-drill")
    try:
        for name in names:
            channel = await connection.channel()
            with contextlib.suppress(aio_pika.exceptions.AMQPError):
                await channel.queue_delete(name)
            with contextlib.suppress(aio_pika.exceptions.AMQPError):
                await channel.close()
    finally:
        await connection.close()


@contextlib.asynccontextmanager
async def proxied(url: str) -> AsyncIterator[Proxy]:
    parts = urlsplit(url)
    proxy = await Proxy(parts.hostname or "127.0.0.1", parts.port or 0).start()
    try:
        yield proxy
    finally:
        await proxy.close()
