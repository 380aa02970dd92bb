"""The peers a user would pick instead, measured like the anchors of :mod:`bench.throughput`.

* E  Celery with RabbitMQ, the settings its documentation gives for reliable delivery
  (``task_acks_late``, ``worker_prefetch_multiplier=1``, ``task_reject_on_worker_lost``), the
  prefork pool with N processes (Celery's default pool), a no-op task;
* F  FastStream's ``RabbitBroker``, a subscriber with manual acknowledgement whose no-op
  handler acks, concurrency N as its channel's prefetch (each delivery runs as a task of its
  own, so N deliveries are handled at once).

As for the others: a queue of its own, prefilled with ``warmup + messages`` messages in the
peer's own format (persistent, confirmed), then the consumer starts; the clock runs from the
last warm-up message handled to the last measured one, and the rate is the measured messages
over that time. F runs in the benchmark's process (as A to D do) with a
:class:`bench.throughput.Clock`. E cannot: its pool is made of processes, so its worker runs
in a process of its own (:mod:`bench.celery_proc`), which marks the times and the CPU of
itself and its pool processes. Celery and FastStream (the ``bench`` extra) are imported only
when a peer runs.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from typing import Any

import aio_pika

from bench.costs import cpu_per_message
from bench.services import (
    AMQP_URL,
    body,
    declare_plain_queue,
    delete_queues,
    prefill,
    prefill_messages,
    random_name,
    wait_until,
)
from bench.throughput import TIMEOUT, Clock, RunResult

STOP_TIMEOUT = 60.0  # seconds for a Celery worker's warm shutdown


async def assert_drained(connection: aio_pika.abc.AbstractConnection, queue: str) -> None:
    """Every message was acked: with the consumer gone, an unacked one would be back."""
    channel = await connection.channel()
    try:
        declared = await channel.declare_queue(queue, passive=True)
        left = declared.declaration_result.message_count
    finally:
        await channel.close()
    if left:
        raise RuntimeError(f"{left} messages left on {queue} after the run")


async def run_celery(concurrency: int, messages: int, warmup: int) -> RunResult:
    """E: a Celery worker (prefork, ``concurrency`` processes) drains a prefilled queue."""
    from bench import celery_proc

    if warmup < 1 or messages < 1:
        raise ValueError("a run needs a warm-up and measured messages")
    queue = random_name("celery")
    connection = await aio_pika.connect(AMQP_URL)
    try:
        await declare_plain_queue(connection, queue)
        await prefill_messages(
            connection, queue, celery_proc.task_messages(queue, warmup + messages)
        )
        found = await _celery_worker(queue, concurrency, messages, warmup)
        await assert_drained(connection, queue)
        return RunResult(
            messages / found["seconds"], {"cpu_us": cpu_per_message(found["cpu_s"], messages)}
        )
    finally:
        await delete_queues(connection, [queue])
        await connection.close()


async def _celery_worker(
    queue: str, concurrency: int, messages: int, warmup: int
) -> dict[str, float]:
    """Runs :mod:`bench.celery_proc` until it reports; its figures. Its log goes to a file,
    shown if it fails."""
    from bench.celery_proc import RESULT

    with tempfile.TemporaryFile() as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.celery_proc",
            queue,
            f"--concurrency={concurrency}",
            f"--warmup={warmup}",
            f"--messages={messages}",
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
        )
        assert process.stdout is not None
        try:
            async with asyncio.timeout(TIMEOUT):
                while line := await process.stdout.readline():
                    if line.startswith(RESULT.encode()):
                        found: dict[str, float] = json.loads(line[len(RESULT) :])
                        break
                else:
                    raise RuntimeError("the Celery worker ended before it reported")
            # It stops itself (Celery's warm shutdown); the rest of its output is drained.
            await asyncio.wait_for(process.communicate(), STOP_TIMEOUT)
            return found
        except BaseException:
            if process.returncode is None:
                process.kill()
                await process.communicate()
            log.seek(0)
            tail = log.read()[-4000:].decode(errors="replace")
            print(f"  the Celery worker's log:\n{tail}", file=sys.stderr, flush=True)
            raise


async def run_faststream(concurrency: int, messages: int, warmup: int) -> RunResult:
    """F: FastStream's RabbitBroker, a manual-ack subscriber, prefetch ``concurrency``."""
    queue = random_name("faststream")
    connection = await aio_pika.connect(AMQP_URL)
    try:
        await declare_plain_queue(connection, queue)
        total = warmup + messages
        await prefill(connection, queue, [(f"{queue}:{i}", body(i)) for i in range(total)])
        clock = Clock(warmup, messages)
        broker = faststream_broker(queue, concurrency, clock)
        await broker.start()
        try:
            ended = await wait_until(lambda: clock.done, timeout=TIMEOUT, interval=0.002)
        finally:
            await broker.stop()
        await assert_drained(connection, queue)
        return RunResult(messages / (ended - clock.started), {"cpu_us": clock.cpu_us()})
    finally:
        await delete_queues(connection, [queue])
        await connection.close()


def faststream_broker(queue: str, concurrency: int, clock: Clock) -> Any:
    """The broker with its one subscriber on the benchmark's queue (FastStream declares it
    durable by default, as the benchmark did), with manual acks, ``concurrency`` deliveries at
    once (the channel's prefetch: FastStream's default sets none, and the broker would push the
    whole queue at once), and no log line per message (by default it logs two, "Received" and
    "Processed", which none of the other variants does)."""
    from faststream import AckPolicy
    from faststream.rabbit import Channel, RabbitBroker

    from bench import faststream_handler

    broker = RabbitBroker(
        AMQP_URL, default_channel=Channel(prefetch_count=concurrency), logger=None
    )
    subscriber = broker.subscriber(queue, ack_policy=AckPolicy.MANUAL)
    subscriber(faststream_handler.noop(clock))
    return broker
