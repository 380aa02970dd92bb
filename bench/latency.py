"""End-to-end latency of A, B and C at the same steady rates, each consumer in a process.

A paced publisher, in a process of its own, sends messages stamped with their send time at a
fixed rate; the consumer variant, in another process, notes publish-to-ack for each
(:mod:`bench.worker_proc`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aio_pika

from bench.services import AMQP_URL, body, delete_queues, random_name
from rabbitretry import topology_of

STARTUP_TIMEOUT = 60.0


@dataclass
class WorkerReport:
    latencies_ms: list[float]
    peak_rss_mb: float
    parked: int = 0


async def start_worker(
    queue: str,
    database_url: str,
    concurrency: int,
    mode: str,
    variant: str = "C",
    expect: int | None = None,
    amqp_url: str | None = None,
    queue_type: str = "classic",
) -> asyncio.subprocess.Process:
    """A consumer process, once it consumes (it said ``ready``); ``amqp_url`` overrides
    ``RABBITRETRY_AMQP_URL`` for it."""
    more = ["--expect", str(expect)] if expect is not None else []
    env = {**os.environ, "RABBITRETRY_AMQP_URL": amqp_url} if amqp_url else None
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.worker_proc",
        queue,
        database_url,
        "--variant",
        variant,
        "--concurrency",
        str(concurrency),
        "--mode",
        mode,
        "--queue-type",
        queue_type,
        *more,
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )
    assert process.stdout is not None
    try:
        line = await asyncio.wait_for(process.stdout.readline(), STARTUP_TIMEOUT)
    except BaseException:
        process.terminate()
        raise
    if line.strip() != b"ready":
        process.terminate()
        raise RuntimeError(f"the benchmark worker did not start (said {line!r})")
    return process


@contextlib.asynccontextmanager
async def worker_process(
    queue: str,
    database_url: str,
    concurrency: int,
    mode: str,
    variant: str = "C",
    expect: int | None = None,
) -> AsyncIterator[asyncio.subprocess.Process]:
    """A consumer process while the block runs; SIGTERMed at the end if still running."""
    process = await start_worker(queue, database_url, concurrency, mode, variant, expect)
    try:
        yield process
    finally:
        if process.returncode is None:
            process.terminate()


async def report_of(process: asyncio.subprocess.Process, stop: bool = True) -> WorkerReport:
    """The worker's closing report; SIGTERM it first unless it stops by itself."""
    if stop:
        process.terminate()
    assert process.stdout is not None
    out = await asyncio.wait_for(process.stdout.read(), 300)
    await process.wait()
    data: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return WorkerReport(data["latencies_ms"], data["peak_rss_mb"], data["parked"])


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


async def publisher_process(queue: str, rate: float, count: int, warmup: int) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.publisher_proc",
        queue,
        str(rate),
        str(count),
        str(warmup),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(process.communicate(), count / rate + 300)
    if process.returncode != 0 or b"sent" not in out:
        raise RuntimeError(f"the paced publisher failed (exit {process.returncode})")


async def run_latency(
    database_url: str, variant: str, rate: float, count: int, concurrency: int
) -> WorkerReport:
    """``variant``'s publish-to-ack latency at ``rate`` msgs/s over ``count`` messages."""
    from bench.throughput import noop_consumer

    queue = random_name(f"latency.{variant}")
    topology = topology_of([noop_consumer(queue)])
    warmup = max(100, count // 5)
    connection = await aio_pika.connect(AMQP_URL)
    try:
        async with worker_process(
            queue, database_url, concurrency, "latency", variant, expect=warmup + count
        ) as process:
            await publisher_process(queue, rate, count, warmup)
            return await report_of(process, stop=False)
    finally:
        await delete_queues(
            connection, [q.name for q in topology.queue_declarations() if not q.shared]
        )
        await connection.close()
