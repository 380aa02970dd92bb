"""Consumer throughput of the four variants, each on a prefilled queue of its own.

Every run prefills ``warmup + messages`` messages, starts the consumers, and times the
``messages`` that come after the warm-up ones: connections, pools and caches are warm, and
the publisher is not competing for the CPU while the clock runs.

* A  raw aio-pika: prefetch 1 per consumer, manual ack, no-op handler (the broker floor);
* B  A plus a naive ledger: insert-or-increment, then mark done, each its own commit;
* C  rabbitretry: a real ``Worker`` with a no-op ``Consumer``;
* D  dramatiq with its RabbitMQ broker (threads, prefetch 2 per thread, no ledger).

The peers E (Celery) and F (FastStream) are measured the same way in :mod:`bench.peers`.
Each run returns its rate and its costs per message (:mod:`bench.costs`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import asyncpg

from bench.costs import NAIVE_TABLES, RABBITRETRY_TABLES, cpu_per_message, database_costs
from bench.services import (
    AMQP_URL,
    body,
    declare_plain_queue,
    delete_queues,
    prefill,
    random_name,
    wait_until,
)
from rabbitretry import Downstream, Worker, amqp, topology_of
from rabbitretry.consumer import Consumer, Context
from rabbitretry.topology import declare

TIMEOUT = 600.0

NAIVE_SCHEMA = """
CREATE TABLE IF NOT EXISTS bench_naive (
    queue text NOT NULL, message_id text NOT NULL, attempts integer NOT NULL,
    status text NOT NULL, finished_at timestamptz, PRIMARY KEY (queue, message_id))
"""
NAIVE_CLAIM = """
INSERT INTO bench_naive AS l (queue, message_id, attempts, status)
VALUES ($1, $2, 1, 'processing')
ON CONFLICT (queue, message_id) DO UPDATE SET attempts = l.attempts + 1, status = 'processing'
"""
NAIVE_DONE = """
UPDATE bench_naive SET status = 'done', finished_at = now() WHERE queue = $1 AND message_id = $2
"""


class Clock:
    """Marks when the warm-up ends and when the measured messages are through, in wall time
    and in the process's CPU time."""

    def __init__(self, warmup: int, messages: int) -> None:
        self.warmup = warmup
        self.total = warmup + messages
        self.count = 0
        self.started = 0.0
        self.cpu_started = self.cpu_ended = 0.0
        self._lock = threading.Lock()  # dramatiq counts from its worker threads

    def tick(self) -> None:
        with self._lock:
            self.count += 1
            if self.count == self.warmup:
                self.started = time.monotonic()
                self.cpu_started = time.process_time()
            if self.count == self.total:
                self.cpu_ended = time.process_time()

    @property
    def done(self) -> bool:
        return self.count >= self.total

    def cpu_us(self) -> float:
        """The process's CPU time per measured message, in microseconds."""
        return cpu_per_message(self.cpu_ended - self.cpu_started, self.total - self.warmup)


@dataclass(frozen=True)
class RunResult:
    rate: float
    """Measured messages per second."""
    costs: dict[str, float] = field(default_factory=dict)
    """Per message: ``cpu_us``, and for a ledger ``wal_bytes``, ``commits``, ``rows`` and
    ``table_bytes`` (:mod:`bench.costs`)."""


def _bodies(queue: str, count: int) -> list[tuple[str, bytes]]:
    return [(f"{queue}:{i}", body(i)) for i in range(count)]


async def raw_consumers(
    queue: str,
    concurrency: int,
    clock: Clock,
    work: Callable[[aio_pika.abc.AbstractIncomingMessage], Awaitable[None]] | None = None,
) -> RunResult:
    """A or B: ``concurrency`` channels with prefetch 1 consuming ``queue``; msgs/s."""
    connection = await aio_pika.connect(AMQP_URL)
    try:
        finished = asyncio.Event()

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            if work is not None:
                await work(message)
            await message.ack()
            clock.tick()
            if clock.done:
                finished.set()

        for _ in range(concurrency):
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=1)
            declared = await channel.declare_queue(queue, passive=True)
            await declared.consume(on_message)
        await asyncio.wait_for(finished.wait(), TIMEOUT)
        ended = time.monotonic()
    finally:
        await connection.close()
    return RunResult(
        (clock.total - clock.warmup) / (ended - clock.started), {"cpu_us": clock.cpu_us()}
    )


async def run_raw(concurrency: int, messages: int, warmup: int) -> RunResult:
    queue = random_name("raw")
    connection = await aio_pika.connect(AMQP_URL)
    try:
        await declare_plain_queue(connection, queue)
        await prefill(connection, queue, _bodies(queue, warmup + messages))
        return await raw_consumers(queue, concurrency, Clock(warmup, messages))
    finally:
        await delete_queues(connection, [queue])
        await connection.close()


async def run_naive(database_url: str, concurrency: int, messages: int, warmup: int) -> RunResult:
    queue = random_name("naive")
    connection = await aio_pika.connect(AMQP_URL)
    try:
        await declare_plain_queue(connection, queue)
        await prefill(connection, queue, _bodies(queue, warmup + messages))
        clock = Clock(warmup, messages)
        # The pool is closed inside the span: a backend that exits flushes its statistics.
        async with database_costs(database_url, NAIVE_TABLES, lambda: clock.total) as costs:
            pool = await asyncpg.create_pool(
                database_url, min_size=concurrency, max_size=concurrency
            )
            assert pool is not None
            try:
                await pool.execute(NAIVE_SCHEMA)

                async def two_commits(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                    async with pool.acquire() as conn:
                        await conn.execute(NAIVE_CLAIM, queue, message.message_id)
                        await conn.execute(NAIVE_DONE, queue, message.message_id)

                result = await raw_consumers(queue, concurrency, clock, two_commits)
            finally:
                await pool.close()
        return RunResult(result.rate, {**result.costs, **costs})
    finally:
        await delete_queues(connection, [queue])
        await connection.close()


def noop_consumer(
    queue_name: str,
    clock: Clock | None = None,
    queue_type: str = "classic",
    downstream: bool = False,
) -> type[Consumer[Any]]:
    """A consumer that does nothing (but tick ``clock``); with ``downstream``, it does so in a
    ``ctx.downstream`` block of a declared downstream (what a closed breaker costs)."""
    queue_kind = queue_type

    class BenchNoop(Consumer[dict[str, Any]]):
        queue = queue_name
        queue_type = queue_kind  # type: ignore[assignment]

        async def handle(self, msg: dict[str, Any], ctx: Context) -> None:
            if clock is not None:
                clock.tick()

    class BenchDownstream(BenchNoop):
        downstreams = (Downstream("bench-downstream"),)

        async def handle(self, msg: dict[str, Any], ctx: Context) -> None:
            async with ctx.downstream("bench-downstream"):
                await super().handle(msg, ctx)

    return BenchDownstream if downstream else BenchNoop


@contextlib.asynccontextmanager
async def prefilled_worker(
    database_url: str, concurrency: int, clock: Clock, prefix: str, downstream: bool = False
) -> AsyncIterator[tuple[str, asyncio.Task[None]]]:
    """A real ``Worker`` with a no-op consumer (ticking ``clock``) over a queue of its own,
    prefilled with ``clock.total`` messages: (the queue, the worker's task). The worker is
    stopped and the queue deleted on the way out."""
    queue = random_name(prefix)
    consumer = noop_consumer(queue, clock, downstream=downstream)
    topology = topology_of([consumer])
    connection = await amqp.connect(AMQP_URL, name="rabbitretry-bench")
    try:
        await declare(connection, topology)
        await prefill(connection, queue, _bodies(queue, clock.total))
        worker = Worker(
            consumers=[consumer],
            amqp_url=AMQP_URL,
            database_url=database_url,
            concurrency=concurrency,
        )
        task = asyncio.create_task(worker.run())
        try:
            yield queue, task
        finally:
            worker.stop()
            await asyncio.wait_for(task, 60)
    finally:
        await delete_queues(
            connection, [q.name for q in topology.queue_declarations() if not q.shared]
        )
        await connection.close()


async def run_rabbitretry(
    database_url: str, concurrency: int, messages: int, warmup: int, downstream: bool = False
) -> RunResult:
    clock = Clock(warmup, messages)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    assert pool is not None
    polls = 0
    try:
        async with (
            database_costs(
                database_url, RABBITRETRY_TABLES, lambda: clock.total, lambda: polls
            ) as costs,
            prefilled_worker(database_url, concurrency, clock, "rr", downstream) as (queue, task),
        ):
            await wait_until(lambda: clock.done or task.done(), timeout=TIMEOUT)
            if task.done():
                task.result()  # the worker failed: re-raise its error

            async def all_succeeded() -> bool:
                nonlocal polls
                polls += 1
                done = await pool.fetchval(
                    "SELECT count(*) FROM rabbitretry.ledger"
                    " WHERE queue = $1 AND status = 'succeeded'",
                    queue,
                )
                return bool(done >= clock.total)

            ended = await wait_until(all_succeeded, timeout=TIMEOUT, interval=0.002)
        return RunResult(messages / (ended - clock.started), {"cpu_us": clock.cpu_us(), **costs})
    finally:
        await pool.close()


async def run_dramatiq(threads: int, messages: int, warmup: int) -> RunResult:
    import dramatiq
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    queue = random_name("dramatiq").replace(".", "_")  # dramatiq's own names use dots
    clock = Clock(warmup, messages)
    broker = RabbitmqBroker(url=AMQP_URL)
    actor_name = f"bench_noop_{queue}"

    def noop(n: int) -> None:
        clock.tick()

    dramatiq.actor(noop, actor_name=actor_name, queue_name=queue, broker=broker)
    broker.declare_queue(queue, ensure=True)
    connection = await aio_pika.connect(AMQP_URL)
    try:
        encoded = [
            (
                f"{queue}:{i}",
                dramatiq.Message(
                    queue_name=queue, actor_name=actor_name, args=(i,), kwargs={}, options={}
                ).encode(),
            )
            for i in range(warmup + messages)
        ]
        await prefill(connection, queue, encoded)
        worker = dramatiq.Worker(broker, worker_threads=threads, worker_timeout=100)
        worker.start()
        try:
            ended = await wait_until(lambda: clock.done, timeout=TIMEOUT, interval=0.002)
        finally:
            await asyncio.to_thread(worker.stop)
            await asyncio.to_thread(broker.close)
        return RunResult(messages / (ended - clock.started), {"cpu_us": clock.cpu_us()})
    finally:
        await delete_queues(connection, [queue, f"{queue}.DQ", f"{queue}.XQ"])
        await connection.close()
