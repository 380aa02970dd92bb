"""A rabbitretry worker in a process of its own, for latency, retry timing and peak memory.

``python -m bench.worker_proc QUEUE DATABASE_URL --concurrency N --mode latency|retry``
prints ``ready`` once consuming, runs until SIGTERM, then prints one JSON line: the
end-to-end latencies it saw (publish to ack, from the ``sent`` stamp in each body) and its
peak resident memory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import resource
import sys
import time
from typing import Any

import rabbitretry.delivery.worker
from bench.services import AMQP_URL, wait_until
from rabbitretry import Retry
from rabbitretry.amqp import IncomingMessage
from rabbitretry.consumer import Consumer, Context
from rabbitretry.delivery.outcome import Outcome
from rabbitretry.delivery.pipeline import Pipeline
from rabbitretry.retry import RetryPolicy

latencies_ms: list[float] = []


class TimedPipeline(Pipeline):
    """Notes, for each delivery, the time from its publish to its ack."""

    async def process(self, message: IncomingMessage) -> Outcome:
        outcome = await super().process(message)
        if outcome.result == "succeeded":
            data = json.loads(message.body)
            if "sent" in data and not data.get("warmup"):
                latencies_ms.append((time.time() - data["sent"]) * 1000)
        return outcome


def consumer_for(queue_name: str, mode: str) -> type[Consumer[Any]]:
    class BenchConsumer(Consumer[dict[str, Any]]):
        queue = queue_name
        retry = RetryPolicy(max_attempts=3, max_delay=16)

        async def handle(self, msg: dict[str, Any], ctx: Context) -> None:
            if mode == "retry" and ctx.attempt == 1:
                raise Retry("scheduled by the benchmark", delay=float(msg["delay"]))

    return BenchConsumer


async def main(queue: str, database_url: str, concurrency: int, mode: str) -> None:
    logging.basicConfig(level=logging.ERROR)  # the retries a benchmark asks for are no news
    rabbitretry.delivery.worker.Pipeline = TimedPipeline  # type: ignore[misc]
    worker = rabbitretry.delivery.worker.Worker(
        consumers=[consumer_for(queue, mode)],
        amqp_url=AMQP_URL,
        database_url=database_url,
        concurrency=concurrency,
        declare_topology=True,
    )
    task = asyncio.create_task(worker.run(install_signal_handlers=True))
    await wait_until(lambda: worker.started or task.done(), timeout=60, interval=0.05)
    print("ready", flush=True)
    await task
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"latencies_ms": latencies_ms, "peak_rss_mb": peak_kb / 1024}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("queue")
    parser.add_argument("database_url")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--mode", choices=["latency", "retry"], default="latency")
    args = parser.parse_args()
    asyncio.run(main(args.queue, args.database_url, args.concurrency, args.mode))
    sys.exit(0)
