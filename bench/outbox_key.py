"""The outbox relay on a backlog of one ordering key, against a backlog of rows without one.

    python -m bench.outbox_key [--rows 1000,3000,20000]

Rows of one ``ordering_key`` leave in order, each once the one before it is confirmed. This
enqueues ``--rows`` pending rows (one transaction), once with no key and once all of one key,
and times one relay publishing them all, with its default batch.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from bench.outbox_relay import running, scratch_outbox
from bench.services import AMQP_URL, wait_until
from rabbitretry.outbox import OutboxRelay


async def relay_rate(rows: int, ordering_key: str | None) -> float:
    """Rows a second one relay publishes of ``rows`` pending rows of ``ordering_key``."""
    async with scratch_outbox() as (pool, queue):
        await pool.execute(
            "INSERT INTO rabbitretry.outbox (exchange, routing_key, message_id, payload,"
            " ordering_key) SELECT '', $1, 'm-' || n, '{}', $3"
            " FROM generate_series(1, $2) AS n",
            queue,
            rows,
            ordering_key,
        )
        relay = OutboxRelay(pool, AMQP_URL)
        started = time.monotonic()
        async with running(relay) as task:
            await wait_until(lambda: relay.stats.sent == rows or task.done(), timeout=1800)
            return rows / (time.monotonic() - started)


async def main(backlogs: list[int]) -> None:
    print("| pending rows | rows/s, no key | rows/s, one key |")
    print("|---:|---:|---:|")
    for rows in backlogs:
        none, one = await relay_rate(rows, None), await relay_rate(rows, "order-7")
        print(f"| {rows:,} | {none:,.0f} | {one:,.0f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.outbox_key", description=__doc__)
    parser.add_argument("--rows", default="1000,3000,20000", help="comma-separated backlogs")
    args = parser.parse_args()
    asyncio.run(main([int(n) for n in args.rows.split(",")]))
