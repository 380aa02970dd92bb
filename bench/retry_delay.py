"""How close retries come to their due time, from the ledger's attempt rows.

Messages arrive at a steady ``RATE``; each fails its first attempt with ``Retry(delay=d)``,
``d`` drawn log-uniformly between 0.1 s and a few minutes, and succeeds on the second. A
retry's lateness is the second attempt's ``started_at`` minus the first attempt's
``retry_at`` (both database time). A copy that reaches the worker before it is due is parked
again by the ledger's not-due check, so it can never start early; the worker counts those
passes (``parked``).
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass

import aio_pika
import asyncpg

from bench.latency import report_of, worker_process
from bench.services import AMQP_URL, body, delete_queues, random_name, wait_until
from bench.throughput import noop_consumer
from rabbitretry import topology_of

MIN_DELAY = 0.1
SEED = 6
RATE = 40.0  # first attempts per second: the queue never backs up, so a copy that comes back
# is not queued behind first attempts (that wait is the queue's, not the delay's)

LATENESS = """
SELECT extract(epoch FROM second.started_at - first.retry_at)::float8 AS lateness,
       extract(epoch FROM first.retry_at - first.finished_at)::float8 AS scheduled
FROM rabbitretry.attempt_history first
JOIN rabbitretry.attempt_history second
  ON second.queue = first.queue AND second.message_id = first.message_id
 AND second.attempt = 2
WHERE first.queue = $1 AND first.attempt = 1 AND first.outcome = 'retry'
"""


@dataclass
class RetryTiming:
    lateness_s: list[float]
    scheduled_s: list[float]
    parked: int  # copies that reached a worker before they were due


def sample_delays(count: int, max_delay: float, seed: int = SEED) -> list[float]:
    """``count`` delays, log-uniform over ``MIN_DELAY .. max_delay``, to the millisecond."""
    rng = random.Random(seed)
    low, high = math.log(MIN_DELAY), math.log(max_delay)
    return [round(math.exp(rng.uniform(low, high)), 3) for _ in range(count)]


async def run_retry_delays(database_url: str, count: int, max_delay: float) -> RetryTiming:
    queue = random_name("retry")
    topology = topology_of([noop_consumer(queue)])
    connection = await aio_pika.connect(AMQP_URL)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    assert pool is not None
    try:
        async with worker_process(queue, database_url, 8, "retry") as process:
            messages = [
                (f"{queue}:{i}", body(i, delay=delay))
                for i, delay in enumerate(sample_delays(count, max_delay))
            ]
            channel = await connection.channel(publisher_confirms=True)
            for message_id, raw in messages:
                message = aio_pika.Message(
                    raw, message_id=message_id, delivery_mode=aio_pika.DeliveryMode.PERSISTENT
                )
                await channel.default_exchange.publish(message, routing_key=queue)
                await asyncio.sleep(1 / RATE)
            await channel.close()

            async def all_succeeded() -> bool:
                done = await pool.fetchval(
                    "SELECT count(*) FROM rabbitretry.ledger"
                    " WHERE queue = $1 AND status = 'succeeded'",
                    queue,
                )
                return bool(done >= count)

            await wait_until(all_succeeded, timeout=max_delay + 300, interval=0.2)
            report = await report_of(process)
        rows = await pool.fetch(LATENESS, queue)
        return RetryTiming(
            [row["lateness"] for row in rows], [row["scheduled"] for row in rows], report.parked
        )
    finally:
        await pool.close()
        await delete_queues(
            connection, [q.name for q in topology.queue_declarations() if not q.shared]
        )
        await connection.close()
