"""A ledger that lives for twenty minutes: a steady offered rate, retries and dead letters in the
mix, ``ledger prune`` on its schedule, and the figures minute by minute.

::

    python -m bench.sustained --minutes 20 --rate 400

A worker (``rabbitretry run bench.sustained_consumer:Sustained -c 8``) runs in a process of its
own, as in production; this process publishes at the offered rate (4 % of the messages fail
once and succeed on a 2 s retry, 1 % are refused for good). The ledger starts with a million
finished rows 35 days old, so that the prune, started every five minutes as cron would start
it (``--older-than 30d``), has work while the traffic flows. Every minute the run samples the
tables' live and dead tuples, their sizes with their indexes, and autovacuum's runs; at the
end it reads from the ledger, by the minute a message finished, how many succeeded and their
p99 from publication to success (first attempts only: a retry's wait is the policy's). It
compares the last five minutes with the first five, and lists the run's slowest seconds with
whether a vacuum or a prune was running then.

A server whose autovacuum is off (``SHOW autovacuum``) would leave every dead tuple of the run
in place, which no production ledger should meet: the run then vacuums the two ledger tables
itself once a minute, as autovacuum would, and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import asyncpg

from bench.big_ledger import load
from bench.services import AMQP_URL, delete_queues, random_name, scratch_database
from bench.sustained_consumer import Sustained
from rabbitretry import topology_of
from rabbitretry.topology import declare

OLD_ROWS = 1_000_000
PRUNE_EVERY = 300.0  # seconds
SAMPLE_EVERY = 60.0
WINDOW = 5  # minutes compared, first against last

TABLES = """
SELECT relname AS table, n_live_tup AS live, n_dead_tup AS dead, autovacuum_count AS autovacuums,
       pg_relation_size(relid) AS heap_bytes, pg_indexes_size(relid) AS index_bytes
FROM pg_stat_user_tables WHERE schemaname = 'rabbitretry' AND relname IN ('ledger', 'attempt')
ORDER BY relname
"""

# Checkpoints of the whole server so far (each one's fsyncs slow every commit a moment, and the
# pages first written after it go to the WAL whole).
CHECKPOINTS = "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
# When the latest checkpoint began: the commits right after it write whole pages to the WAL.
CHECKPOINT_BEGAN = "SELECT extract(epoch FROM checkpoint_time)::float8 FROM pg_control_checkpoint()"

# Autovacuum's pace, for the run's own VACUUM: a manual VACUUM is not throttled by default
# (vacuum_cost_delay 0), autovacuum sleeps autovacuum_vacuum_cost_delay every cost limit.
AS_AUTOVACUUM = """
SELECT set_config('vacuum_cost_delay', current_setting('autovacuum_vacuum_cost_delay'), false),
       set_config('vacuum_cost_limit', CASE current_setting('autovacuum_vacuum_cost_limit')
           WHEN '-1' THEN current_setting('vacuum_cost_limit')
           ELSE current_setting('autovacuum_vacuum_cost_limit') END, false)
"""

# By the minute a message finished: how many succeeded, and the p99 in ms from publication (in
# its message_id, nanoseconds) to success, first attempts only.
MINUTES = """
SELECT date_trunc('minute', finished_at) AS minute, count(*) AS succeeded,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at) * 1000
           - split_part(message_id, '-', 3)::bigint / 1e6)
           FILTER (WHERE attempts = 1 AND message_id LIKE 'ok-%') AS p99_ms
FROM rabbitretry.ledger
WHERE queue = $1 AND status = 'succeeded'
GROUP BY 1 ORDER BY 1
"""

# The seconds whose slowest first-attempt success took longest, as Unix times: what a stall
# looks like from outside, to set beside what the run was doing then.
SLOWEST_SECONDS = """
SELECT extract(epoch FROM date_trunc('second', finished_at))::float8 AS at,
       max(extract(epoch FROM finished_at) * 1000
           - split_part(message_id, '-', 3)::bigint / 1e6) AS worst_ms
FROM rabbitretry.ledger
WHERE queue = $1 AND status = 'succeeded' AND attempts = 1 AND message_id LIKE 'ok-%'
GROUP BY 1 ORDER BY 2 DESC LIMIT $2
"""
SLOWEST = 8

Span = tuple[float, float]  # (Unix time it started, seconds it took)


def fate(n: int) -> str:
    return "dead" if n % 100 == 0 else "retry" if n % 25 == 0 else "ok"


async def publish_steadily(queue: str, rate: float, seconds: float) -> int:
    """Publish to ``queue`` at ``rate`` a second for ``seconds``, confirmed; how many."""
    connection = await aio_pika.connect(AMQP_URL)
    sent = 0
    try:
        channel = await connection.channel(publisher_confirms=True)
        started = time.monotonic()
        tick = 0.05
        while (elapsed := time.monotonic() - started) < seconds:
            due = int(elapsed * rate) + 1
            batch = [
                aio_pika.Message(
                    b'{"n": %d}' % n,
                    message_id=f"{fate(n)}-{n}-{time.time_ns()}",
                    content_type="application/json",
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                )
                for n in range(sent, due)
            ]
            await asyncio.gather(
                *(channel.default_exchange.publish(m, routing_key=queue) for m in batch)
            )
            sent = due
            await asyncio.sleep(max(0.0, tick - (time.monotonic() - started - elapsed)))
    finally:
        await connection.close()
    return sent


@contextlib.asynccontextmanager
async def worker(queue: str, database_url: str, concurrency: int) -> AsyncIterator[None]:
    env = {
        **os.environ,
        "RABBITRETRY_DATABASE_URL": database_url,
        "RABBITRETRY_SUSTAINED_QUEUE": queue,
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rabbitretry", "run", "bench.sustained_consumer:Sustained",
        "--concurrency", str(concurrency), env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield
    finally:
        process.terminate()
        await process.wait()


async def prune_on_schedule(database_url: str, stop: asyncio.Event) -> list[Span]:
    """``ledger prune --older-than 30d`` every PRUNE_EVERY seconds; when each ran."""
    took: list[Span] = []
    env = {**os.environ, "RABBITRETRY_DATABASE_URL": database_url}
    while not stop.is_set():
        began, started = time.time(), time.monotonic()
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "rabbitretry", "ledger", "prune", "--older-than", "30d",
            env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        await process.wait()
        took.append((began, time.monotonic() - started))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, PRUNE_EVERY - took[-1][1]))
    return took


async def sample_tables(database_url: str, stop: asyncio.Event) -> list[dict[str, Any]]:
    samples: list[dict[str, Any]] = []
    conn = await asyncpg.connect(database_url)
    started = time.monotonic()
    try:
        while not stop.is_set():
            rows = await conn.fetch(TABLES)
            tables = {r["table"]: {k: v for k, v in r.items() if k != "table"} for r in rows}
            checkpoints = await conn.fetchval(CHECKPOINTS)
            began = await conn.fetchval(CHECKPOINT_BEGAN)
            samples.append(
                {
                    "minute": round((time.monotonic() - started) / 60),
                    "tables": tables,
                    "checkpoints": checkpoints,
                    "checkpoint_began": began,
                }
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SAMPLE_EVERY)
    finally:
        await conn.close()
    return samples


async def vacuum_if_autovacuum_is_off(database_url: str, stop: asyncio.Event) -> list[Span]:
    """Stand in for autovacuum when the server has it off: VACUUM the ledger tables every
    SAMPLE_EVERY seconds, at autovacuum's pace; when each ran (none when autovacuum is on)."""
    took: list[Span] = []
    conn = await asyncpg.connect(database_url)
    try:
        if await conn.fetchval("SHOW autovacuum") == "on":
            return took
        await conn.execute(AS_AUTOVACUUM)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SAMPLE_EVERY)
            began, started = time.time(), time.monotonic()
            await conn.execute("VACUUM (ANALYZE) rabbitretry.ledger, rabbitretry.attempt")
            took.append((began, time.monotonic() - started))
    finally:
        await conn.close()
    return took


async def run(minutes: float, rate: float, concurrency: int) -> dict[str, Any]:
    queue = random_name("sustained")
    async with scratch_database() as database_url:
        await load(database_url, OLD_ROWS, youngest=35, spread=10)  # all past the window

        Sustained.queue = queue
        topology = topology_of([Sustained])
        connection = await aio_pika.connect(AMQP_URL)
        await declare(connection, topology)
        stop = asyncio.Event()
        try:
            async with worker(queue, database_url, concurrency):
                pruning = asyncio.create_task(prune_on_schedule(database_url, stop))
                sampling = asyncio.create_task(sample_tables(database_url, stop))
                vacuuming = asyncio.create_task(vacuum_if_autovacuum_is_off(database_url, stop))
                sent = await publish_steadily(queue, rate, minutes * 60)
                await asyncio.sleep(10)  # the last retries
                stop.set()
                prunes, samples, vacuums = await pruning, await sampling, await vacuuming
            conn = await asyncpg.connect(database_url)
            try:
                per_minute = [dict(r) for r in await conn.fetch(MINUTES, queue)]
                slowest = [dict(r) for r in await conn.fetch(SLOWEST_SECONDS, queue, SLOWEST)]
            finally:
                await conn.close()
        finally:
            names = [q.name for q in topology.queue_declarations() if not q.shared]
            await delete_queues(connection, names)
            await connection.close()
    return {
        "minutes": minutes, "rate": rate, "concurrency": concurrency, "sent": sent,
        "prunes": prunes, "vacuums": vacuums, "samples": samples, "per_minute": per_minute,
        "slowest": slowest,
    }  # fmt: skip


def comparison(found: dict[str, Any]) -> dict[str, float]:
    """Last WINDOW full minutes against the first WINDOW (the first and last, partial, left out)."""
    full = [m for m in found["per_minute"][1:-1] if m["p99_ms"] is not None]
    if len(full) < 2:
        return {}  # too short a run to compare
    first, last = full[:WINDOW], full[-WINDOW:]
    return {
        "rate": statistics.median(m["succeeded"] for m in last)
        / statistics.median(m["succeeded"] for m in first),
        "p99": statistics.median(m["p99_ms"] for m in last)
        / statistics.median(m["p99_ms"] for m in first),
    }


def running_at(at: float, spans: list[Span], margin: float = 1.0) -> bool:
    """Whether one of ``spans`` ran during the second that starts at ``at`` (give or take
    ``margin`` seconds: a stall is seen when the messages it held finish)."""
    return any(began - margin <= at + 1 and at <= began + took + margin for began, took in spans)


def since_checkpoint(at: float, began: list[float]) -> float | None:
    """Seconds from the latest checkpoint that began before ``at`` (None: none known; a
    checkpoint shows only once it has ended)."""
    earlier = [b for b in began if b <= at]
    return at - max(earlier) if earlier else None


def slowest_seconds(found: dict[str, Any]) -> list[str]:
    """The slowest seconds of the run, each with what else was running then."""
    if not found["slowest"]:
        return []
    first = found["per_minute"][0]["minute"].timestamp()  # the run's first minute
    checkpoints = sorted({s["checkpoint_began"] for s in found["samples"]})
    out = [
        "",
        "| second of the run | slowest success (ms) | vacuum running | prune running "
        "| since a checkpoint began (s) |",
        "|---:|---:|---|---|---:|",
    ]
    for second in found["slowest"]:
        at = second["at"]
        since = since_checkpoint(at, checkpoints)
        out.append(
            f"| {at - first:,.0f} | {second['worst_ms']:,.0f} | "
            f"{'yes' if running_at(at, found['vacuums']) else 'no'} | "
            f"{'yes' if running_at(at, found['prunes']) else 'no'} | "
            f"{'' if since is None else f'{since:,.0f}'} |"
        )
    return out


def lines(found: dict[str, Any]) -> list[str]:
    out = ["| minute | succeeded/s | p99 (ms) |", "|---:|---:|---:|"]
    for i, m in enumerate(found["per_minute"]):
        out.append(f"| {i} | {m['succeeded'] / 60:,.0f} | {m['p99_ms'] or 0:,.1f} |")
    out += ["", "| minute | table | live | dead | heap MB | index MB | autovacuums | checkpoints |"]
    out.append("|---:|---|---:|---:|---:|---:|---:|---:|")
    first = found["samples"][0]["checkpoints"] if found["samples"] else 0
    for s in found["samples"]:
        for name, t in s["tables"].items():
            out.append(
                f"| {s['minute']} | {name} | {t['live']:,} | {t['dead']:,} | "
                f"{t['heap_bytes'] / 2**20:,.0f} | {t['index_bytes'] / 2**20:,.0f} | "
                f"{t['autovacuums']} | {s['checkpoints'] - first} |"
            )
    ratio = comparison(found)
    out += [
        "",
        f"sent {found['sent']:,} at {found['rate']:,.0f}/s over {found['minutes']:g} min; "
        f"prunes took {', '.join(f'{took:.0f} s' for _, took in found['prunes'])}",
    ]
    if found["vacuums"]:
        out.append(
            f"autovacuum is off on this server: the run vacuumed the ledger tables "
            f"{len(found['vacuums'])} times itself, "
            f"{max(took for _, took in found['vacuums']):.1f} s at the longest "
            "(the autovacuums column stays 0)"
        )
    out += slowest_seconds(found)
    if ratio:
        out.append(
            f"last {WINDOW} min / first {WINDOW} min: rate {ratio['rate']:.2f}, "
            f"p99 {ratio['p99']:.2f}"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=400.0, help="messages offered a second")
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    found = asyncio.run(run(args.minutes, args.rate, args.concurrency))
    print("\n".join(lines(found)))


if __name__ == "__main__":
    main()
