"""A ledger that has lived: C on a ledger bulk-loaded with millions of finished rows against C
on an empty one, and C while ``rabbitretry ledger prune`` deletes them.

::

    python -m bench.big_ledger --rows 10000000 --messages 8000 --repeats 3

The rows are what succeeded messages leave in a ledger pruned with the defaults (a 30-day window,
compaction after 7 days): 23 in 30 as compacted keys (``rabbitretry.succeeded_key``), the others
as ledger rows without their snapshot, spread over queues and over the 31st to the 40th day
before the run, so that a prune with the default 30-day window deletes all of them. C runs at
concurrency 8 with a queue of its own; the prune runs in a process of its own, as cron would
start it. Rates are medians of alternating rounds (empty, loaded) so that a noisy minute hits
both.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from typing import Any

import asyncpg

from bench.report import big_ledger_summary
from bench.services import scratch_database
from bench.throughput import run_rabbitretry
from rabbitretry.ledger.retention import REST

CONCURRENCY = 8
QUEUES = 4
CHUNK = 500_000  # rows per load statement: a transaction of seconds, not minutes
# The share of a 30-day ledger that is compacted (successes older than 7 days) at the defaults.
COMPACTED = 23 / 30

# Message n of rows $4, in queue n mod $3, ended $5 to $5 + $6 days ago, the lowest n oldest.
MESSAGES = """
FROM generate_series($1::bigint, $2::bigint - 1) AS n,
     LATERAL (SELECT now() - make_interval(secs => 86400 * ($5 + $6 * (1 - n::float8 / $4))))
         AS t(at)
"""
LOAD = (
    """
INSERT INTO rabbitretry.ledger (queue, message_id, status, attempts, max_attempts,
                                first_seen, updated_at, finished_at, payload, headers,
                                properties, worker, attempt_started_at)
SELECT 'history-' || (n % $3), 'order-' || n, 'succeeded', 1, 5, at, at, at, NULL, NULL, NULL,
       'w', at"""
    + MESSAGES
)
# The same messages, compacted (the oldest of a ledger are).
LOAD_COMPACTED = (
    """
INSERT INTO rabbitretry.succeeded_key (key_hash, finished_at, attempts)
SELECT rabbitretry.key_hash('history-' || (n % $3), 'order-' || n), at, 1"""
    + MESSAGES
)


async def load(
    database_url: str,
    rows: int,
    youngest: float = 31,
    spread: float = 9,
    compacted: float = COMPACTED,
) -> float:
    """Fill the ledger with ``rows`` finished messages, which ended from ``youngest`` to
    ``youngest + spread`` days ago, oldest first (as a ledger fills), the oldest ``compacted``
    share of them compacted; seconds it took."""
    started = time.monotonic()
    conn = await asyncpg.connect(database_url)
    try:
        for low in range(0, rows, CHUNK):
            high = min(low + CHUNK, rows)
            split = min(max(int(rows * compacted), low), high)
            if split > low:
                await conn.execute(LOAD_COMPACTED, low, split, QUEUES, rows, youngest, spread)
            if high > split:
                await conn.execute(LOAD, split, high, QUEUES, rows, youngest, spread)
            print(f"  loaded {high:,} of {rows:,} rows", flush=True)
        for table in ("ledger", "attempt", "succeeded_key"):
            await conn.execute(f"VACUUM ANALYZE rabbitretry.{table}")
    finally:
        await conn.close()
    return time.monotonic() - started


SIZES = """
SELECT pg_total_relation_size('rabbitretry.ledger')
       + pg_total_relation_size('rabbitretry.attempt') AS whole,
       (SELECT count(*) FROM rabbitretry.ledger) AS rows,
       pg_total_relation_size('rabbitretry.succeeded_key') AS compacted,
       (SELECT count(*) FROM rabbitretry.succeeded_key) AS keys
"""


async def sizes(database_url: str) -> dict[str, float]:
    """Bytes per message, indexes included: in all, as a whole ledger row, as a compacted key."""
    conn = await asyncpg.connect(database_url)
    try:
        found = await conn.fetchrow(SIZES)
    finally:
        await conn.close()
    assert found is not None
    return {
        "bytes_per_row": (found["whole"] + found["compacted"])
        / max(1, found["rows"] + found["keys"]),
        "bytes_per_whole_row": found["whole"] / max(1, found["rows"]),
        "bytes_per_compacted_key": found["compacted"] / max(1, found["keys"]),
    }


async def rate(database_url: str, messages: int) -> float:
    return (await run_rabbitretry(database_url, CONCURRENCY, messages, messages // 10)).rate


@contextlib.asynccontextmanager
async def pruning(database_url: str, rest: float) -> Any:
    """``rabbitretry ledger prune --older-than 30d --rest REST`` running in its own process
    meanwhile."""
    env = {**os.environ, "RABBITRETRY_DATABASE_URL": database_url}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "rabbitretry",
        "ledger",
        "prune",
        "--older-than",
        "30d",
        "--rest",
        str(rest),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    started = time.monotonic()
    try:
        yield process
    finally:
        output, _ = await process.communicate()
        print(f"  prune: {output.decode().strip()} ({time.monotonic() - started:.0f} s)")


async def run(rows: int, messages: int, repeats: int, rest: float = REST) -> dict[str, Any]:
    async with scratch_database() as empty, scratch_database() as loaded:
        print(f"loading {rows:,} finished rows", flush=True)
        seconds = await load(loaded, rows)
        found: dict[str, Any] = {
            "rows": rows,
            "load_seconds": seconds,
            "concurrency": CONCURRENCY,
            "rest": rest,
        }
        found.update(await sizes(loaded))
        empty_rates, loaded_rates = [], []
        for _ in range(repeats):
            empty_rates.append(await rate(empty, messages))
            loaded_rates.append(await rate(loaded, messages))
            print(
                f"  C({CONCURRENCY}) empty {empty_rates[-1]:,.0f}/s, "
                f"loaded {loaded_rates[-1]:,.0f}/s",
                flush=True,
            )
        found["empty"] = empty_rates
        found["loaded"] = loaded_rates
        during: list[float] = []
        async with pruning(loaded, rest) as prune:
            while prune.returncode is None and len(during) < repeats * 3:
                during.append(await rate(loaded, messages))
                print(f"  C({CONCURRENCY}) while pruning {during[-1]:,.0f}/s", flush=True)
        found["while_pruning"] = during
        found["after_prune"] = [await rate(loaded, messages) for _ in range(repeats)]
        return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--messages", type=int, default=8_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rest", type=float, default=REST, help="the prune's --rest")
    args = parser.parse_args()
    found = asyncio.run(run(args.rows, args.messages, args.repeats, args.rest))
    print("\n".join(big_ledger_summary(found)))


if __name__ == "__main__":
    main()
