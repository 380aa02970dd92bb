"""One drill from start to verdict: set up, publish while injecting faults, settle, verify.

Everything the drill creates (a private PostgreSQL server when the database crash is on, a
scratch database, a random queue with its delay and dead queues, two proxies, the worker
process) is removed in a ``finally``, and every fault is undone there too, whether the drill
passed, failed, or was interrupted with Ctrl-C. A failed drill (or ``keep``) leaves the scratch
database (with its private server, stopped), the worker log and the handler starts behind for a
post-mortem.

This module wires the single-broker drill together; the pieces it shares with the cluster drill
live beside it: :mod:`drills.scratch` (what a drill creates), :mod:`drills.settle` (publish,
strike, settle, verify) and :mod:`drills.sending`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from drills.clock import Clock
from drills.consumer import STARTS_ENV
from drills.faults import BROKER_HEARTBEAT, Faults
from drills.plan import Plan, make_plan
from drills.private_postgres import PrivatePostgres, private_postgres
from drills.scratch import Keep, drill_queue, proxied, scratch_database
from drills.settle import Settled, publish_and_settle
from drills.supervisor import Supervisor
from drills.verify import Verdict
from rabbitretry import db, urls
from rabbitretry.reconcile.reconciler import Reconciler

ROOT = Path(__file__).resolve().parents[1]
CONSUMER = "drills.consumer:DrillConsumer"
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
            # A short heartbeat, so that a silent broker is noticed within the drill's time.
            broker_url = urls.with_heartbeat(
                broker_proxy.url_for(config.amqp_url), BROKER_HEARTBEAT
            )
            supervisor = _worker(
                config, queue, broker_url, database_proxy.url_for(database_url), logs, starts
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
                settled = await _exercise(
                    config, plan, queue, broker_url, database_url, faults, clock, starts
                )
            finally:
                faults.restore()
                await supervisor.stop()
            result = DrillResult(
                plan,
                settled.verdict,
                settled.republished,
                dict(supervisor.exits),
                settled.recovered_seconds,
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


def _worker(
    config: DrillConfig, queue: str, amqp_url: str, database_url: str, logs: Path, starts: Path
) -> Supervisor:
    """The supervised worker, connected to the broker and the database through the proxies."""
    env = {
        **os.environ,
        "RABBITRETRY_AMQP_URL": amqp_url,
        "RABBITRETRY_DATABASE_URL": database_url,
        "RABBITRETRY_DRILL_QUEUE": queue,
        STARTS_ENV: str(starts),
    }
    return Supervisor(CONSUMER, env, logs / "worker.log", concurrency=config.concurrency, cwd=ROOT)


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
    broker_url: str,
    database_url: str,
    faults: Faults,
    clock: Clock,
    starts: Path,
) -> Settled:
    """Publish and inject the faults with a reconciler running (its broker through the proxy,
    as the worker's), wait for the work to settle."""
    async with _reconciling(broker_url, database_url):
        return await publish_and_settle(
            config.amqp_url,
            plan,
            queue,
            database_url,
            faults,
            clock,
            starts,
            config.settle_timeout,
        )


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
