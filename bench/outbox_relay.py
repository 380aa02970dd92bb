"""The outbox relay on an outbox whose sent rows no vacuum has reached yet.

    python -m bench.outbox_relay [--sent 1000000] [--rows 20000]

An outbox keeps its sent rows for the retention window, so autovacuum comes after days of
them, and each row sent leaves its entry in the index of pending rows until then. This fills
a scratch outbox with ``--sent`` rows sent an hour ago (autovacuum off for the table), then
has producers enqueue ``--rows`` rows, 50 per transaction, while one relay publishes them:
once with polls that start where the relay's last poll found rows (the relay as it is) and
once with every poll starting at the oldest row (``full_scan_every=0``, as before). It prints
each relay's rate and the pages of that index read a poll: the producers' inserts read the
same pages in both runs (2 to 3 a row), the rest is the polls' walk.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import asyncpg

from bench.services import (
    AMQP_URL,
    declare_plain_queue,
    delete_queues,
    random_name,
    scratch_database,
    wait_until,
)
from rabbitretry import amqp, db
from rabbitretry.outbox import OutboxRelay, ScanFloor

PER_TRANSACTION = 50
# Pages of the index of pending rows read (idx_blks), and scans of it (one per poll).
INDEX_READS = """
SELECT s.idx_blks_hit + s.idx_blks_read AS pages, u.idx_scan AS scans
FROM pg_statio_user_indexes s JOIN pg_stat_user_indexes u USING (indexrelid)
WHERE s.indexrelname = 'outbox_pending_idx'
"""


async def fill_sent(pool: asyncpg.Pool, queue: str, sent: int) -> None:
    await pool.execute("ALTER TABLE rabbitretry.outbox SET (autovacuum_enabled = false)")
    await pool.execute(
        "INSERT INTO rabbitretry.outbox (exchange, routing_key, message_id, payload, next_try_at)"
        " SELECT '', $1, 'old-' || n, '{}', now() - interval '2 hours' + n * interval '1 ms'"
        " FROM generate_series(1, $2) AS n",
        queue,
        sent,
    )
    await pool.execute("UPDATE rabbitretry.outbox SET status = 'sent', sent_at = now()")


async def produce(pool: asyncpg.Pool, queue: str, rows: int) -> None:
    for first in range(0, rows, PER_TRANSACTION):
        await pool.execute(
            "INSERT INTO rabbitretry.outbox (exchange, routing_key, message_id, payload)"
            " SELECT '', $1, 'new-' || n, '{}' FROM generate_series($2::int, $3::int) AS n",
            queue,
            first,
            min(first + PER_TRANSACTION, rows) - 1,
        )
        await pool.execute("SELECT pg_notify('rabbitretry_outbox', '')")


# An idle backend reports its counts within PGSTAT_IDLE_INTERVAL (10 s on PostgreSQL 15), not
# at once: read sooner, the counts of the outbox's fill (100,000 inserts, about 2 index pages
# each) landed among the relay's, as 40 pages a row relayed.
STATS_REPORTED = 11.0


async def index_reads(pool: asyncpg.Pool) -> tuple[int, int]:
    await asyncio.sleep(STATS_REPORTED)
    row = await pool.fetchrow(INDEX_READS)
    return int(row["pages"]), int(row["scans"])


@contextlib.asynccontextmanager
async def scratch_outbox() -> AsyncIterator[tuple[asyncpg.Pool, str]]:
    """A pool on a scratch ledger database and a plain queue of its own, for outbox rows."""
    async with scratch_database() as url:
        pool = await db.create_pool(url, min_size=1, max_size=4)
        connection = await amqp.connect(AMQP_URL, name="rabbitretry-bench")
        queue = random_name("outbox")
        try:
            await declare_plain_queue(connection, queue)
            yield pool, queue
        finally:
            await delete_queues(connection, [queue])
            await connection.close()
            await pool.close()


@contextlib.asynccontextmanager
async def running(relay: OutboxRelay) -> AsyncIterator[asyncio.Task[None]]:
    """``relay`` running until the block ends: its task."""
    task = asyncio.create_task(relay.run())
    try:
        yield task
    finally:
        relay.stop()
        await task


async def run(sent: int, rows: int, scan: ScanFloor) -> tuple[float, float]:
    """(rows relayed a second, index pages read a poll) on a fresh outbox with ``sent`` rows."""
    async with scratch_outbox() as (pool, queue):
        await fill_sent(pool, queue, sent)
        relay = OutboxRelay(pool, AMQP_URL, scan=scan)
        async with running(relay) as task:
            await wait_until(lambda: relay.ready or task.done(), timeout=30)
            # The first poll, which marks the index's dead entries as such.
            await produce(pool, queue, 1)
            await wait_until(lambda: relay.stats.sent == 1 or task.done(), timeout=120)
            pages, scans = await index_reads(pool)
            started = time.monotonic()
            await produce(pool, queue, rows)
            await wait_until(lambda: relay.stats.sent == rows + 1 or task.done(), timeout=600)
            elapsed = time.monotonic() - started
        pages_after, scans_after = await index_reads(pool)
        return rows / elapsed, (pages_after - pages) / max(1, scans_after - scans)


async def main(sent: int, rows: int) -> None:
    print(f"{sent:,} rows sent before, not vacuumed; {rows:,} rows relayed\n")
    print("| polls start | rows/s | pages of the pending index read a poll |")
    print("|---|---:|---:|")
    for label, scan in (
        ("where the last poll found rows", ScanFloor()),
        ("at the oldest row", ScanFloor(full_scan_every=0.0)),
    ):
        rate, read = await run(sent, rows, scan)
        print(f"| {label} | {rate:,.0f} | {read:,.1f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.outbox_relay", description=__doc__)
    parser.add_argument("--sent", type=int, default=1_000_000)
    parser.add_argument("--rows", type=int, default=20_000)
    args = parser.parse_args()
    asyncio.run(main(args.sent, args.rows))
