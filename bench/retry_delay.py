"""How close retries come to their scheduled time, from the ledger's attempt rows.

Each message fails its first attempt with ``Retry(delay=d)``, ``d`` drawn between 1 and 8 s,
and succeeds on the second. The error of one retry is the second attempt's ``started_at``
minus the first attempt's ``retry_at`` (both database time).
"""

from __future__ import annotations

import random

import aio_pika
import asyncpg

from bench.latency import report_of, worker_process
from bench.services import AMQP_URL, body, delete_queues, prefill, random_name, wait_until
from bench.throughput import noop_consumer
from rabbitretry.delivery.worker import topology_of

MIN_DELAY, MAX_DELAY = 1.0, 8.0
SEED = 6

ERRORS = """
SELECT extract(epoch FROM second.started_at - first.retry_at)::float8 AS error,
       extract(epoch FROM first.retry_at - first.finished_at)::float8 AS scheduled
FROM rabbitretry.attempt first
JOIN rabbitretry.attempt second
  ON second.queue = first.queue AND second.message_id = first.message_id
 AND second.attempt = 2
WHERE first.queue = $1 AND first.attempt = 1 AND first.outcome = 'retry'
"""


async def run_retry_delays(database_url: str, count: int) -> list[tuple[float, float]]:
    """(error, scheduled delay) in seconds for ``count`` retries."""
    rng = random.Random(SEED)
    queue = random_name("retry")
    topology = topology_of([noop_consumer(queue)])
    connection = await aio_pika.connect(AMQP_URL)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    assert pool is not None
    try:
        async with worker_process(queue, database_url, 8, "retry") as process:
            messages = [
                (f"{queue}:{i}", body(i, delay=round(rng.uniform(MIN_DELAY, MAX_DELAY), 3)))
                for i in range(count)
            ]
            await prefill(connection, queue, messages)

            async def all_succeeded() -> bool:
                done = await pool.fetchval(
                    "SELECT count(*) FROM rabbitretry.ledger"
                    " WHERE queue = $1 AND status = 'succeeded'",
                    queue,
                )
                return bool(done >= count)

            await wait_until(all_succeeded, timeout=120, interval=0.2)
            await report_of(process)
        rows = await pool.fetch(ERRORS, queue)
        return [(row["error"], row["scheduled"]) for row in rows]
    finally:
        await pool.close()
        await delete_queues(connection, [q.name for q in topology.queue_declarations()])
        await connection.close()
