"""One consumer variant in a process of its own, for latency, retry timing and scaling runs.

``python -m bench.worker_proc QUEUE DATABASE_URL --variant A|B|C --concurrency N
--mode latency|retry [--expect N]`` prints ``ready`` once consuming, runs until it has
handled ``--expect`` messages (or until SIGTERM), then prints one JSON line: the end-to-end
latencies it saw (publish to ack, from the ``sent`` stamp in each body, warm-up messages
left out), the copies that reached it before they were due (``parked``, rabbitretry only)
and its peak resident memory.

A is raw aio-pika and B the naive two-commit ledger, as in :mod:`bench.throughput`; C is a
real rabbitretry ``Worker``. In ``retry`` mode (C only) every message fails its first attempt
with ``Retry(delay=body["delay"])``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import resource
import signal
import sys
import time
from typing import Any

import aio_pika
import asyncpg

import rabbitretry.delivery.worker
from bench.services import AMQP_URL, wait_until
from bench.throughput import NAIVE_CLAIM, NAIVE_DONE, NAIVE_SCHEMA
from rabbitretry import Retry
from rabbitretry.amqp import IncomingMessage
from rabbitretry.consumer import Consumer, Context
from rabbitretry.delivery.outcome import Outcome
from rabbitretry.delivery.pipeline import Pipeline
from rabbitretry.retry import RetryPolicy


class Tally:
    """What this process saw: latencies, early copies, and when it has seen enough."""

    def __init__(self, expect: int | None) -> None:
        self.latencies_ms: list[float] = []
        self.parked = 0
        self.handled = 0
        self.expect = expect
        self.enough = asyncio.Event()

    def acked(self, body: bytes) -> None:
        data = json.loads(body)
        if "sent" in data and not data.get("warmup"):
            self.latencies_ms.append((time.time() - data["sent"]) * 1000)
        self.handled += 1
        if self.expect is not None and self.handled >= self.expect:
            self.enough.set()

    def report(self) -> str:
        return json.dumps(
            {
                "latencies_ms": self.latencies_ms,
                "parked": self.parked,
                "peak_rss_mb": peak_rss_kb() / 1024,
            }
        )


def peak_rss_kb() -> int:
    """This process's own peak resident set. Linux's ``ru_maxrss`` is no good here: it keeps
    the peak of the process that forked this one (the benchmark, holding every earlier run),
    across ``exec``; ``VmHWM`` is the peak of this program's own memory."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def consumer_for(queue_name: str, mode: str, queue_kind: str) -> type[Consumer[Any]]:
    class BenchConsumer(Consumer[dict[str, Any]]):
        queue = queue_name
        queue_type = queue_kind  # type: ignore[assignment]
        retry = RetryPolicy(max_attempts=3, max_delay=3600)

        async def handle(self, msg: dict[str, Any], ctx: Context) -> None:
            if mode == "retry" and ctx.attempt == 1:
                raise Retry("scheduled by the benchmark", delay=float(msg["delay"]))

    return BenchConsumer


async def run_rabbitretry(
    queue: str, database_url: str, concurrency: int, mode: str, queue_type: str, tally: Tally
) -> None:
    class TimedPipeline(Pipeline):
        """Notes, for each delivery, the time from its publish to its ack."""

        async def process(self, message: IncomingMessage, probe: str | None = None) -> Outcome:
            outcome = await super().process(message, probe)
            if outcome.result == "succeeded":
                tally.acked(message.body)
            elif outcome.result == "parked":
                tally.parked += 1
            return outcome

    rabbitretry.delivery.worker.Pipeline = TimedPipeline  # type: ignore[misc]
    worker = rabbitretry.delivery.worker.Worker(
        consumers=[consumer_for(queue, mode, queue_type)],
        amqp_url=AMQP_URL,
        database_url=database_url,
        concurrency=concurrency,
        declare_topology=True,
    )
    task = asyncio.create_task(worker.run(install_signal_handlers=True))
    await wait_until(lambda: worker.started or task.done(), timeout=60, interval=0.05)
    print("ready", flush=True)
    enough = asyncio.create_task(tally.enough.wait())
    await asyncio.wait([task, enough], return_when=asyncio.FIRST_COMPLETED)
    worker.stop()
    await task
    enough.cancel()


async def run_raw(
    queue: str, database_url: str, concurrency: int, naive_ledger: bool, tally: Tally
) -> None:
    """A (or B, with ``naive_ledger``): channels with prefetch 1, manual ack."""
    connection = await aio_pika.connect(AMQP_URL)
    pool = None
    if naive_ledger:
        pool = await asyncpg.create_pool(database_url, min_size=concurrency, max_size=concurrency)
        assert pool is not None
        await pool.execute(NAIVE_SCHEMA)
    try:

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            if pool is not None:
                async with pool.acquire() as conn:
                    await conn.execute(NAIVE_CLAIM, queue, message.message_id)
                    await conn.execute(NAIVE_DONE, queue, message.message_id)
            await message.ack()
            tally.acked(message.body)

        for _ in range(concurrency):
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=1)
            declared = await channel.declare_queue(queue, durable=True)
            await declared.consume(on_message)
        print("ready", flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await asyncio.wait(
            [asyncio.create_task(tally.enough.wait()), asyncio.create_task(stop.wait())],
            return_when=asyncio.FIRST_COMPLETED,
        )
    finally:
        if pool is not None:
            await pool.close()
        await connection.close()


async def main(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.ERROR)  # the retries a benchmark asks for are no news
    tally = Tally(args.expect)
    if args.variant == "C":
        await run_rabbitretry(
            args.queue, args.database_url, args.concurrency, args.mode, args.queue_type, tally
        )
    else:
        naive = args.variant == "B"
        await run_raw(args.queue, args.database_url, args.concurrency, naive, tally)
    print(tally.report(), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.worker_proc", description=__doc__)
    parser.add_argument("queue")
    parser.add_argument("database_url")
    parser.add_argument("--variant", choices=["A", "B", "C"], default="C")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--mode", choices=["latency", "retry"], default="latency")
    parser.add_argument("--expect", type=int, help="stop after this many handled messages")
    parser.add_argument("--queue-type", choices=["classic", "quorum"], default="classic")
    asyncio.run(main(parser.parse_args()))
    sys.exit(0)
