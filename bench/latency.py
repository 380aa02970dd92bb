"""End-to-end latency at a steady rate, and the worker's peak memory, from a worker process.

A paced publisher sends messages stamped with their send time at a fixed rate (about half of
rabbitretry's peak throughput); the worker, in a subprocess, notes publish-to-ack for each.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aio_pika

from bench.services import AMQP_URL, body, delete_queues, random_name, wait_until
from rabbitretry.delivery.worker import topology_of
from rabbitretry.topology import Topology

STARTUP_TIMEOUT = 60.0


@dataclass
class WorkerReport:
    latencies_ms: list[float]
    peak_rss_mb: float


@contextlib.asynccontextmanager
async def worker_process(
    queue: str, database_url: str, concurrency: int, mode: str
) -> AsyncIterator[asyncio.subprocess.Process]:
    """Start the worker subprocess, wait for it to consume; SIGTERM it at the end."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.worker_proc",
        queue,
        database_url,
        "--concurrency",
        str(concurrency),
        "--mode",
        mode,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), STARTUP_TIMEOUT)
        if line.strip() != b"ready":
            raise RuntimeError(f"the benchmark worker did not start (said {line!r})")
        yield process
    finally:
        if process.returncode is None:
            process.terminate()


async def report_of(process: asyncio.subprocess.Process) -> WorkerReport:
    """SIGTERM the worker and read its closing report."""
    process.terminate()
    assert process.stdout is not None
    out = await asyncio.wait_for(process.stdout.read(), 120)
    await process.wait()
    data: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return WorkerReport(data["latencies_ms"], data["peak_rss_mb"])


async def paced_publish(queue: str, rate: float, count: int, warmup: int) -> None:
    """Publish ``warmup + count`` stamped messages at ``rate`` per second, confirms overlapping.

    The worker leaves the first ``warmup`` out of its figures (its pool is still growing).
    """
    connection = await aio_pika.connect(AMQP_URL)
    try:
        channel = await connection.channel(publisher_confirms=True)
        pending: set[asyncio.Task[Any]] = set()
        started = time.monotonic()
        for i in range(warmup + count):
            delay = started + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            message = aio_pika.Message(
                body(i, warmup=i < warmup),
                message_id=f"{queue}:{i}",
                content_type="application/json",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            task = asyncio.create_task(channel.default_exchange.publish(message, queue))
            pending.add(task)
            task.add_done_callback(pending.discard)
        await asyncio.gather(*pending)
    finally:
        await connection.close()


def _queues(topology: Topology) -> list[str]:
    return [q.name for q in topology.queue_declarations()]


async def run_latency(
    database_url: str, rate: float, count: int, concurrency: int, ledger_count: Any
) -> WorkerReport:
    """Latency at ``rate`` msgs/s over ``count`` messages; ``ledger_count(queue)`` -> done."""
    from bench.throughput import noop_consumer

    queue = random_name("latency")
    topology = topology_of([noop_consumer(queue)])
    connection = await aio_pika.connect(AMQP_URL)
    try:
        async with worker_process(queue, database_url, concurrency, "latency") as process:
            warmup = max(100, count // 5)
            await paced_publish(queue, rate, count, warmup)
            count += warmup

            async def all_done() -> bool:
                return bool(await ledger_count(queue) >= count)

            await wait_until(all_done, timeout=120, interval=0.05)
            return await report_of(process)
    finally:
        await delete_queues(connection, _queues(topology))
        await connection.close()
