"""C in several processes: ``rabbitretry run --processes P --concurrency N``, as a user runs it.

The variant C at setting ``PxN`` (P processes of N consumers each, P x N in all): the real
command line in a process of its own, with a no-op consumer (:mod:`bench.supervised_consumer`),
on a queue prefilled with ``warmup + messages`` messages. The ledger says how far the workers
are: the clock starts once it counts the warm-up succeeded, and the rate counts what succeeded
after that. The CPU is the supervisor's and its worker processes' (``/proc``); the database's
costs are those of the same stretch.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import time
from typing import Any

import asyncpg

from bench.costs import RABBITRETRY_TABLES, cpu_per_message, database_costs, process_tree_cpu
from bench.processes import SUCCEEDED
from bench.services import AMQP_URL, delete_queues, prefill, random_name
from bench.supervised_consumer import Noop
from bench.throughput import TIMEOUT, RunResult, _bodies
from rabbitretry import amqp, topology_of
from rabbitretry.topology import declare

POLL = 0.02  # seconds between two counts of the ledger


async def run_supervised(
    database_url: str, processes: int, concurrency: int, messages: int, warmup: int
) -> RunResult:
    queue = random_name(f"rr{processes}x{concurrency}")
    consumer: Any = type("Noop", (Noop,), {"queue": queue})
    topology = topology_of([consumer])
    total = warmup + messages
    connection = await amqp.connect(AMQP_URL, name="rabbitretry-bench")
    conn = await asyncpg.connect(database_url)
    try:
        await declare(connection, topology)
        await prefill(connection, queue, _bodies(queue, total))
        with tempfile.TemporaryFile() as log:
            worker = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "rabbitretry",
                "run",
                "bench.supervised_consumer:Noop",
                f"--processes={processes}",
                f"--concurrency={concurrency}",
                env={
                    **os.environ,
                    "RABBITRETRY_AMQP_URL": AMQP_URL,
                    "RABBITRETRY_DATABASE_URL": database_url,
                    "RABBITRETRY_BENCH_QUEUE": queue,
                },
                stdout=asyncio.subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )
            try:
                return await _measure(conn, database_url, queue, worker, warmup, total)
            except BaseException:
                log.seek(0)
                print(log.read().decode(errors="replace")[-4000:], file=sys.stderr)
                raise
            finally:
                if worker.returncode is None:
                    worker.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(worker.wait(), 60)
                except TimeoutError:  # the supervisor and its worker processes, all of them
                    os.killpg(worker.pid, signal.SIGKILL)
                    raise
    finally:
        await conn.close()
        await delete_queues(
            connection, [q.name for q in topology.queue_declarations() if not q.shared]
        )
        await connection.close()


async def _measure(
    conn: asyncpg.Connection,
    database_url: str,
    queue: str,
    worker: asyncio.subprocess.Process,
    warmup: int,
    total: int,
) -> RunResult:
    polls = 0

    async def succeeded_reaches(count: int) -> int:
        nonlocal polls
        deadline = time.monotonic() + TIMEOUT
        while (done := await conn.fetchval(SUCCEEDED, queue)) < count:
            polls += 1
            if worker.returncode is not None:
                raise RuntimeError(f"rabbitretry run exited with code {worker.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{done} of {count} messages in {TIMEOUT:.0f} s")
            await asyncio.sleep(POLL)
        return int(done)

    done_before = await succeeded_reaches(warmup)
    measured = total - done_before
    polls = 0  # the reads in the stretch measured
    async with database_costs(
        database_url, RABBITRETRY_TABLES, lambda: measured, lambda: polls
    ) as costs:
        started, cpu_started = time.monotonic(), process_tree_cpu(worker.pid)
        await succeeded_reaches(total)
        elapsed, cpu = time.monotonic() - started, process_tree_cpu(worker.pid) - cpu_started
    return RunResult(measured / elapsed, {"cpu_us": cpu_per_message(cpu, measured), **costs})
