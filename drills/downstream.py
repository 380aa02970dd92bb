"""The WMS outage drill: ``python -m drills --downstream`` (``make drill-downstream``).

A stub WMS (:mod:`drills.downstream_stub`) on 127.0.0.1 answers the orders of a steady
publisher (1,500 at 25 a second by default) through ``rabbitretry run`` workers (one, at
concurrency 8, by default) running ``ShipOrder`` (:mod:`drills.downstream_consumer`); a sixth
into the publishing window the WMS answers 500 for 60 s. Then the drill waits until every order
is shipped or dead, and measures what the outage cost (:mod:`drills.downstream_verdict`): lost
and duplicate effects, dead letters, requests to the WMS during the outage, the recovery, the
attempts charged, the alerts.

``--mode plain`` runs the same handler with plain retries (no ``downstreams``, no block): the
"before" column, measured on the same machine. ``--never-recovers`` keeps the WMS down, looks for
``--outage`` seconds, and checks that nothing died and nothing looped. Everything the drill
creates (a scratch database, a random queue, the workers) is removed on the way out, unless the
goal was missed (or ``--keep``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import asyncpg

from drills.clock import Clock
from drills.downstream_consumer import QUEUE_ENV, WMS_URL_ENV
from drills.downstream_stub import LATENCY, StubWms
from drills.downstream_traffic import Outage, Workers, publish_orders, queue_counts
from drills.downstream_verdict import DownstreamVerdict, Timeline, measure
from drills.scratch import Keep, drill_queue, scratch_database
from rabbitretry.settings import DEFAULT_AMQP_URL, DEFAULT_DATABASE_URL

Mode = Literal["breaker", "plain"]
CONSUMERS: dict[Mode, str] = {
    "breaker": "drills.downstream_consumer:ShipOrder",
    "plain": "drills.downstream_consumer:ShipOrderPlain",
}
PROGRESS_EVERY = 10.0  # seconds between two progress lines
REQUEUED_PAUSE = 2.0  # seconds for the broker to put back what killed workers held


@dataclass(frozen=True)
class WmsDrillConfig:
    amqp_url: str
    database_url: str
    """The PostgreSQL server to create the scratch database on (any database on it)."""
    mode: Mode = "breaker"
    workers: int = 1
    concurrency: int = 8
    orders: int = 1500
    rate: float = 25.0
    outage: float = 60.0
    """Seconds the WMS is down (with ``never_recovers``: seconds the drill watches it down)."""
    outage_at: float | None = None
    """Seconds into publishing when the WMS goes down (None: a sixth of the window)."""
    never_recovers: bool = False
    wms_latency: float = LATENCY
    """Seconds the stub WMS takes to answer each request."""
    settle_timeout: float = 120.0
    """Seconds, once the WMS is back and every order published, to wait for every order."""
    keep: bool = False

    @property
    def publish_seconds(self) -> float:
        return self.orders / self.rate

    @property
    def outage_starts(self) -> float:
        return self.publish_seconds / 6 if self.outage_at is None else self.outage_at


@dataclass(frozen=True)
class WmsDrillResult:
    config: WmsDrillConfig
    verdict: DownstreamVerdict
    queue: str
    database: str
    logs: Path
    worker_exits: dict[int, int]
    total_seconds: float

    @property
    def ok(self) -> bool:
        return self.verdict.ok

    def report(self) -> list[str]:
        c = self.config
        outage = (
            f"WMS down for good from {c.outage_starts:g} s (watched {c.outage:g} s)"
            if c.never_recovers
            else f"WMS down {c.outage:g} s from {c.outage_starts:g} s"
        )
        exits = ", ".join(f"{n}x exit {code}" for code, n in sorted(self.worker_exits.items()))
        lines = [
            f"downstream drill: mode {c.mode}, {c.workers} worker(s) x {c.concurrency}, "
            f"{c.orders} orders at {c.rate:g}/s, {outage}; worker exits: {exits or 'none'}; "
            f"{self.total_seconds:.0f} s in all",
            *self.verdict.lines(),
        ]
        if not self.ok:
            missed = "; ".join(row.measure for row in self.verdict.missed)
            lines.append(
                f"drill: goal missed ({missed}); kept for a post-mortem: the worker logs in "
                f"{self.logs} and the database {self.database}"
            )
        else:
            lines.append(f"drill: {'goal met' if self.verdict.judged else 'measured'}")
        return lines


async def run_wms_drill(
    config: WmsDrillConfig, say: Callable[[str], None] = print
) -> WmsDrillResult:
    clock = Clock(say)
    token = secrets.token_hex(4)
    queue, scratch = f"rr-wms-drill-{token}", f"rabbitretry_wms_drill_{token}"
    logs = Path(tempfile.mkdtemp(prefix="rabbitretry-wms-drill-"))
    keep = Keep(config.keep)
    wms = await StubWms(latency=config.wms_latency).start()
    clock.say(
        f"{config.orders} orders at {config.rate:g}/s to {queue} (mode {config.mode}), "
        f"database {scratch}, stub WMS at {wms.url}, worker logs in {logs}"
    )
    try:
        async with contextlib.AsyncExitStack() as stack:
            database_url = await stack.enter_async_context(
                scratch_database(config.database_url, scratch, keep)
            )
            await stack.enter_async_context(drill_queue(config.amqp_url, queue))
            env = {
                **os.environ,
                "RABBITRETRY_AMQP_URL": config.amqp_url,
                "RABBITRETRY_DATABASE_URL": database_url,
                QUEUE_ENV: queue,
                WMS_URL_ENV: wms.url,
            }
            workers = Workers(CONSUMERS[config.mode], env, logs, config.workers, config.concurrency)
            stack.push_async_callback(workers.stop)
            workers.start()
            await workers.consuming(config.amqp_url, queue)
            clock.say(f"{config.workers} worker(s) consuming")
            verdict = await _exercise(config, queue, database_url, wms, workers, clock)
            result = WmsDrillResult(
                config, verdict, queue, scratch, logs, workers.exits, clock.now()
            )
            keep.wanted = keep.wanted or not result.ok
            return result
    finally:
        await wms.close()
        if not keep.wanted:
            shutil.rmtree(logs, ignore_errors=True)


async def _exercise(
    config: WmsDrillConfig,
    queue: str,
    database_url: str,
    wms: StubWms,
    workers: Workers,
    clock: Clock,
) -> DownstreamVerdict:
    conn = await asyncpg.connect(database_url)
    try:
        started = time.time() + 0.5
        outage = Outage(
            wms, started, config.outage_starts, config.outage, config.never_recovers, clock.say
        )
        clock.say(f"publishing starts ({config.publish_seconds:.0f} s)")
        down = asyncio.create_task(outage.run())
        progress = asyncio.create_task(_progress(conn, queue, wms, clock))
        try:
            published = await publish_orders(
                config.amqp_url, queue, config.orders, config.rate, started
            )
            clock.say(f"all {len(published)} orders published")
            await down
            if outage.up_at is not None:
                await _settle(conn, queue, len(published), clock, config.settle_timeout)
        finally:
            progress.cancel()
            down.cancel()
        ended_at = time.time()
        await workers.stop()
        waiting = None
        if config.never_recovers:
            await asyncio.sleep(REQUEUED_PAUSE)
            waiting = (await queue_counts(config.amqp_url, queue))[0]
        verdict = DownstreamVerdict(
            config.mode,
            config.orders,
            never_recovers=config.never_recovers,
            workers=config.workers,
        )
        timeline = Timeline(outage.down_at, outage.up_at, ended_at)
        return await measure(conn, verdict, queue, published, wms.requests, timeline, waiting)
    finally:
        await conn.close()


async def _settle(
    conn: asyncpg.Connection, queue: str, orders: int, clock: Clock, timeout: float
) -> None:
    """Wait until every order is shipped or dead (or ``timeout`` passes)."""
    deadline = time.monotonic() + timeout
    left = orders - await _finished(conn, queue)
    while left and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        left = orders - await _finished(conn, queue)
    clock.say(
        "every order is shipped or dead"
        if not left
        else f"{left} order(s) still unfinished after {timeout:g} s"
    )


async def _finished(conn: asyncpg.Connection, queue: str) -> int:
    finished: int = await conn.fetchval(
        "SELECT count(*) FROM rabbitretry.ledger"
        " WHERE queue = $1 AND status IN ('succeeded', 'dead')",
        queue,
    )
    return finished


async def _progress(conn: asyncpg.Connection, queue: str, wms: StubWms, clock: Clock) -> None:
    """A line every few seconds: what the ledger, the breaker and the WMS say."""
    seen = 0
    while True:
        await asyncio.sleep(PROGRESS_EVERY)
        row = await conn.fetchrow(
            "SELECT count(*) FILTER (WHERE status = 'succeeded') AS succeeded,"
            "       count(*) FILTER (WHERE status = 'dead') AS dead,"
            "       (SELECT state FROM rabbitretry.downstream WHERE name = 'wms') AS breaker"
            " FROM rabbitretry.ledger WHERE queue = $1",
            queue,
        )
        assert row is not None  # an aggregate: always one row
        total = len(wms.requests)
        clock.say(
            f"shipped {row['succeeded']}, dead {row['dead']}, breaker "
            f"{row['breaker'] or 'never tripped'}, WMS {'down' if wms.down else 'up'}: "
            f"{(total - seen) / PROGRESS_EVERY:.1f} requests/s"
        )
        seen = total


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m drills --downstream",
        description=(
            "The WMS outage drill: orders published at a steady rate to `rabbitretry run` "
            "workers whose handler writes its effect in ctx.transaction() and posts the order "
            "to a stub WMS, which answers HTTP 500 during an outage. It measures lost and "
            "duplicate effects, dead letters, requests to the WMS during the outage, the "
            "recovery, the attempts charged and the alerts; exit 1 if the breaker misses its goal."
        ),
    )
    parser.add_argument(
        "--mode",
        choices=["breaker", "plain"],
        default="breaker",
        help="breaker: ShipOrder declares the WMS (default); plain: plain retries, no breaker",
    )
    parser.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument(
        "--concurrency", "-c", type=int, default=8, help="consumers per worker (default 8)"
    )
    parser.add_argument("--orders", "-n", type=int, default=1500, help="default 1500")
    parser.add_argument("--rate", type=float, default=25.0, help="orders a second (default 25)")
    parser.add_argument(
        "--outage",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long the WMS answers 500 (default 60; with --never-recovers: how long to watch)",
    )
    parser.add_argument(
        "--outage-at",
        type=float,
        metavar="SECONDS",
        help="when the WMS goes down, in seconds after publishing starts (default: a sixth "
        "of the publishing window, 10 s for 1,500 orders at 25/s)",
    )
    parser.add_argument(
        "--never-recovers",
        action="store_true",
        help="the WMS stays down: check nothing dies, nothing loops, the orders wait",
    )
    parser.add_argument(
        "--wms-latency",
        type=float,
        default=LATENCY,
        metavar="SECONDS",
        help=f"how long the stub WMS takes to answer (default {LATENCY:g})",
    )
    parser.add_argument(
        "--settle-timeout",
        type=float,
        default=120.0,
        help="seconds to wait, once the WMS is back, for every order (default 120)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the scratch database and the worker logs"
    )
    args = parser.parse_args(argv)
    if args.workers < 1 or args.concurrency < 1 or args.orders < 1 or args.rate <= 0:
        parser.error("--workers, --concurrency, --orders and --rate must be positive")
    if args.wms_latency < 0:
        parser.error("--wms-latency must not be negative")
    if args.outage <= 0:
        parser.error("--outage must be a positive number of seconds")
    return args


def config_from(args: argparse.Namespace) -> WmsDrillConfig:
    return WmsDrillConfig(
        amqp_url=os.environ.get("RABBITRETRY_AMQP_URL", DEFAULT_AMQP_URL),
        database_url=os.environ.get("RABBITRETRY_DATABASE_URL", DEFAULT_DATABASE_URL),
        mode=args.mode,
        workers=args.workers,
        concurrency=args.concurrency,
        orders=args.orders,
        rate=args.rate,
        outage=args.outage,
        outage_at=args.outage_at,
        never_recovers=args.never_recovers,
        wms_latency=args.wms_latency,
        settle_timeout=args.settle_timeout,
        keep=args.keep,
    )


def main(argv: list[str]) -> int:
    """``python -m drills --downstream ARGS``: run the drill, print its verdict; exit 1 if the
    goal is missed (in plain mode, only if an order is lost or its effect duplicated)."""
    config = config_from(parse_args(argv))
    try:
        result = asyncio.run(run_wms_drill(config, say=lambda line: print(line, flush=True)))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("drill: interrupted", flush=True)
        return 130
    for line in result.report():
        print(line, flush=True)
    return 0 if result.ok else 1
