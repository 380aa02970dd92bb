"""Throughput with several rabbitretry worker processes on one queue and one ledger.

Each process is a real ``Worker`` at concurrency 8 (:mod:`bench.worker_proc`); they share a
prefilled queue and the scratch database. The rate counts the messages the ledger marks
succeeded after the warm-up; the commit rate is PostgreSQL's own count of committed
transactions in that database over the same window (less this module's polling), so the
report shows how the rate grows with processes and where the database stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import asyncpg

from bench.latency import worker_process
from bench.services import AMQP_URL, delete_queues, prefill, random_name
from bench.throughput import _bodies, noop_consumer
from rabbitretry import amqp
from rabbitretry.delivery.worker import topology_of
from rabbitretry.topology import declare

CONCURRENCY = 8
POLL = 0.1  # seconds between two looks at the ledger
TIMEOUT = 600.0

SUCCEEDED = "SELECT count(*) FROM rabbitretry.ledger WHERE queue = $1 AND status = 'succeeded'"
COMMITS = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"


async def run_processes(
    database_url: str, processes: int, messages: int, warmup: int
) -> dict[str, float]:
    queue = random_name(f"procs{processes}")
    topology = topology_of([noop_consumer(queue)])
    connection = await amqp.connect(AMQP_URL, name="rabbitretry-bench")
    conn = await asyncpg.connect(database_url)
    try:
        await declare(connection, topology)
        await prefill(connection, queue, _bodies(queue, warmup + messages))
        async with _workers(queue, database_url, processes):
            polls = 0

            async def reached(count: int) -> tuple[float, int]:
                nonlocal polls
                deadline = time.monotonic() + TIMEOUT
                while time.monotonic() < deadline:
                    polls += 2
                    if await conn.fetchval(SUCCEEDED, queue) >= count:
                        return time.monotonic(), await conn.fetchval(COMMITS)
                    await asyncio.sleep(POLL)
                raise TimeoutError(f"{processes} workers did not finish within {TIMEOUT:.0f} s")

            started, commits_before = await reached(warmup)
            polls_before = polls
            ended, commits_after = await reached(warmup + messages)
        elapsed = ended - started
        commits = commits_after - commits_before - (polls - polls_before)
        return {"msgs_per_s": messages / elapsed, "commits_per_s": commits / elapsed}
    finally:
        await conn.close()
        await delete_queues(
            connection, [q.name for q in topology.queue_declarations() if not q.shared]
        )
        await connection.close()


@contextlib.asynccontextmanager
async def _workers(queue: str, database_url: str, count: int) -> AsyncIterator[None]:
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(count):
            await stack.enter_async_context(
                worker_process(queue, database_url, CONCURRENCY, "latency")
            )
        yield
