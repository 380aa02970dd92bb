"""How fast the console's pages answer on a ledger of 100,000 dead letters.

    python -m bench.console_pages [--rows 100000] [--repeats 15]

Builds a scratch database (100,000 dead letters in 6,000 groups over four queues, and as many
succeeded messages for the overview's chart), serves the console in-process and asks each
list page ``--repeats`` times after one warm-up, then prints the median and the slowest
answer of each. The console's goal: every list page under 300 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import asyncpg

from bench.services import AMQP_URL, scratch_database
from rabbitretry.console import Auth, ConsoleConfig
from tests.integration.console_harness import BASE, console_client, insert_many_dead

TOKEN = "bench-console-token"
GOAL_MS = 300.0
PAGES = (
    ("overview", "/"),
    ("messages, newest first", "/messages"),
    ("messages, last page", "/messages?page=last"),
    ("messages by key", "/messages?sort=key"),
    ("messages by attempts", "/messages?sort=attempts"),
    ("messages of one queue", "/messages?queue=bench-1"),
    ("messages, text search", "/messages?q=order+4242"),
    ("messages, all statuses", "/messages?status=all"),
    ("groups, largest first", "/groups"),
    ("groups, last page", "/groups?page=last"),
    ("groups by last seen", "/groups?sort=last_seen"),
    ("audit", "/audit"),
)


async def fill(url: str, rows: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        await insert_many_dead(conn, rows, queues=4, groups=6_000, prefix="bench-")
        await conn.execute(
            "INSERT INTO rabbitretry.ledger (queue, message_id, status, attempts, max_attempts,"
            " first_seen, finished_at, updated_at, payload)"
            " SELECT 'bench-' || (n % 4), 'ok-' || n, 'succeeded', 1, 5, t, t, t, '{}'"
            " FROM generate_series(1, $1) AS n,"
            " LATERAL (SELECT now() - make_interval(secs => n % 10800) AS t) AS at",
            rows,
        )
        await conn.execute("ANALYZE rabbitretry.ledger")
    finally:
        await conn.close()


async def measure(url: str, repeats: int) -> list[tuple[str, str, float, float]]:
    config = ConsoleConfig(
        database_url=url, amqp_url=AMQP_URL, auth=Auth(token=TOKEN), allowed_hosts=("console.test",)
    )
    results = []
    async with console_client(config, BASE) as client:
        client.headers["authorization"] = f"Bearer {TOKEN}"
        for name, path in PAGES:
            timings = []
            for attempt in range(repeats + 1):
                started = time.perf_counter()
                response = await client.get(path)
                elapsed = (time.perf_counter() - started) * 1000
                response.raise_for_status()
                if attempt:  # the first answer also warms the pool and the plan cache
                    timings.append(elapsed)
            results.append((name, path, statistics.median(timings), max(timings)))
    return results


def table(results: list[tuple[str, str, float, float]], rows: int) -> str:
    lines = [
        f"Console pages on a ledger of {rows:,} dead letters (and {rows:,} succeeded)",
        "",
        "| page | path | median ms | slowest ms |",
        "|---|---|---:|---:|",
    ]
    for name, path, median, slowest in results:
        flag = "" if slowest < GOAL_MS else f" (over {GOAL_MS:g} ms)"
        lines.append(f"| {name} | `{path}` | {median:.0f} | {slowest:.0f}{flag} |")
    return "\n".join(lines)


async def main(rows: int, repeats: int) -> None:
    async with scratch_database() as url:
        started = time.perf_counter()
        await fill(url, rows)
        print(f"filled the ledger in {time.perf_counter() - started:.1f} s")
        print(table(await measure(url, repeats), rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=15)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.rows, arguments.repeats))
