"""The reconciler's scan for overdue retries, timed over 10k, 100k and 1M ledger rows.

Rows are bulk-loaded with ``generate_series`` into the run's scratch database: most of them
finished, 2 % retrying (half of those overdue), a few processing, as in a ledger that has
been running for a while. The scan is the reconciler's own statement when it exists.
"""

from __future__ import annotations

import statistics
import time

import asyncpg

from rabbitretry import db

FALLBACK_SCAN = """
SELECT queue, message_id FROM rabbitretry.ledger
WHERE status = 'retrying' AND next_retry_at < now() - make_interval(secs => $1)
ORDER BY next_retry_at LIMIT $2 FOR UPDATE SKIP LOCKED
"""
SIZES = (10_000, 100_000, 1_000_000)
TOLERANCE_SECONDS = 30.0
BATCH = 100
REPEATS = 7

LOAD = """
INSERT INTO rabbitretry.ledger (queue, message_id, status, attempts, max_attempts,
                                next_retry_at, lease_until, finished_at, payload)
SELECT 'bench.scan.' || (i % 20), 'm' || i,
       CASE WHEN i % 50 = 0 THEN 'retrying' WHEN i % 997 = 0 THEN 'processing'
            WHEN i % 211 = 0 THEN 'dead' ELSE 'succeeded' END,
       1, 5,
       CASE WHEN i % 50 = 0 THEN now() + make_interval(secs => (i % 7200) - 3600) END,
       CASE WHEN i % 997 = 0 AND i % 50 <> 0 THEN now() + interval '15 seconds' END,
       CASE WHEN i % 50 <> 0 AND i % 997 <> 0 THEN now() - make_interval(secs => i % 86400) END,
       '\\x7b7d'::bytea
FROM generate_series($1::bigint, $2::bigint - 1) AS i
"""


def scan_statement() -> tuple[str, str]:
    """The statement timed, and where it came from."""
    named = db.queries().get("reconcile_overdue_retries")
    if named is not None:
        return named, "reconcile_overdue_retries"
    return FALLBACK_SCAN.strip(), "the reference text (no reconcile_overdue_retries query yet)"


async def time_scan(conn: asyncpg.Connection, statement: str) -> float:
    """Median milliseconds of the scan, each run in a transaction rolled back afterwards."""
    timings = []
    for _ in range(REPEATS):
        transaction = conn.transaction()
        await transaction.start()
        try:
            started = time.perf_counter()
            await conn.fetch(statement, TOLERANCE_SECONDS, BATCH)
            timings.append((time.perf_counter() - started) * 1000)
        finally:
            await transaction.rollback()
    return statistics.median(timings)


async def run_due_scan(database_url: str) -> dict[str, float]:
    """Milliseconds of the scan at each ledger size, keyed by row count."""
    statement, _ = scan_statement()
    conn = await asyncpg.connect(database_url)
    try:
        results: dict[str, float] = {}
        loaded = 0
        for size in SIZES:
            await conn.execute(LOAD, loaded, size)
            loaded = size
            await conn.execute("ANALYZE rabbitretry.ledger")
            await conn.fetch(statement, TOLERANCE_SECONDS, BATCH)  # warm the cache and plan
            results[str(size)] = await time_scan(conn, statement)
        return results
    finally:
        await conn.close()
