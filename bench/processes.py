"""Throughput with several rabbitretry worker processes on one queue and one ledger.

Each process is a real ``Worker`` at concurrency 8 (:mod:`bench.worker_proc`); they share a
prefilled queue and the scratch database, and start together. The rate counts the messages
the ledger marks succeeded from the moment the last process consumes to the end; the commit
rate is PostgreSQL's own count of committed transactions in that database over the same window
(less this module's polling), so the report shows how the rate grows with processes and where
the database stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import asyncpg

from bench.latency import start_worker
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
    total = warmup + messages
    connection = await amqp.connect(AMQP_URL, name="rabbitretry-bench")
    conn = await asyncpg.connect(database_url)
    try:
        await declare(connection, topology)
        await prefill(connection, queue, _bodies(queue, total))
        async with _workers(queue, database_url, processes):
            started = time.monotonic()
            done_before = await conn.fetchval(SUCCEEDED, queue)
            commits_before = await conn.fetchval(COMMITS)
            if done_before > total - messages // 2:
                raise RuntimeError("the workers took too long to start: measure more messages")
            polls = 0
            deadline = started + TIMEOUT
            while await conn.fetchval(SUCCEEDED, queue) < total:
                polls += 1
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{processes} workers did not finish in {TIMEOUT:.0f} s")
                await asyncio.sleep(POLL)
            elapsed = time.monotonic() - started
            commits = await conn.fetchval(COMMITS) - commits_before - polls - 1
        return {
            "msgs_per_s": (total - done_before) / elapsed,
            "commits_per_s": commits / elapsed,
        }
    finally:
        await conn.close()
        await delete_queues(
            connection, [q.name for q in topology.queue_declarations() if not q.shared]
        )
        await connection.close()


@contextlib.asynccontextmanager
async def _workers(queue: str, database_url: str, count: int) -> AsyncIterator[None]:
    """``count`` worker processes, started together and all consuming; stopped afterwards."""
    started = await asyncio.gather(
        *(start_worker(queue, database_url, CONCURRENCY, "latency") for _ in range(count)),
        return_exceptions=True,
    )
    processes = [p for p in started if isinstance(p, asyncio.subprocess.Process)]
    try:
        for outcome in started:
            if isinstance(outcome, BaseException):
                raise outcome
        yield
    finally:
        for process in processes:
            if process.returncode is None:
                process.terminate()
        await asyncio.gather(*(p.wait() for p in processes))
