"""The outbox demo: `python -m examples.shop_demo` (`make demo-shop`).

Pays ten orders (one payment rolls back), relays the outbox, runs the points consumer, then
publishes every "order paid" message again, and shows that points were awarded exactly once.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable

from rich.console import Console

from examples import shop
from rabbitretry import OutboxRelay, Publisher, Worker, amqp, db, topology_of
from rabbitretry.ledger import migrations
from rabbitretry.settings import Settings
from rabbitretry.topology import declare

console = Console()


async def wait_until(check: Callable[[], Awaitable[bool]], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise RuntimeError("the demo did not settle in time")
        await asyncio.sleep(0.2)


async def main() -> None:
    config = Settings()
    run = secrets.token_hex(3)
    pool = await db.create_pool(config.database_url, max_size=6)
    connection = await amqp.connect(config.amqp_url, name="rabbitretry-shop-demo")
    try:
        async with pool.acquire() as conn:
            await migrations.migrate(conn)
            await shop.create_schema(conn)
            for n in range(10):
                await shop.place_order(conn, f"{run}-{n}", user_id=n % 2 + 1, amount=100)
        await declare(connection, topology_of([shop.AwardOrderPoints]))

        async with pool.acquire() as conn:
            for n in range(9):
                await shop.pay_order(conn, f"{run}-{n}")
            try:
                async with conn.transaction():
                    await shop.pay_order(conn, f"{run}-9")
                    raise RuntimeError("card declined")
            except RuntimeError:
                pass
        console.print("9 orders paid; the 10th payment rolled back, and so did its message")

        worker = Worker([shop.AwardOrderPoints], config.amqp_url, pool=pool, concurrency=2)
        relay = OutboxRelay(pool, config.amqp_url)
        tasks = [asyncio.create_task(worker.run()), asyncio.create_task(relay.run())]

        async def awarded() -> bool:
            count = await pool.fetchval(
                "SELECT count(*) FROM shop_points_flow WHERE idempotency_key LIKE $1",
                f"%order-{run}-%",
            )
            return bool(count == 9)

        await wait_until(awarded)
        console.print("the relay published 9 messages; the consumer awarded points for 9 orders")

        async with Publisher(config.amqp_url) as publisher:
            for n in range(9):
                await publisher.publish(
                    "shop",
                    shop.OrderPaid(order_id=f"{run}-{n}", user_id=n % 2 + 1, points=10),
                    routing_key="order.paid",
                    message_id=f"order-{run}-{n}-paid",
                )

        async def duplicates_dropped() -> bool:
            return sum(o.result == "dropped" for o in worker.outcomes) >= 9

        await wait_until(duplicates_dropped)
        flows = await pool.fetchval(
            "SELECT count(*) FROM shop_points_flow WHERE idempotency_key LIKE $1", f"%order-{run}-%"
        )
        console.print(
            f"9 duplicates published again: dropped by the ledger, points rows still {flows}"
        )
        worker.stop()
        relay.stop()
        await asyncio.gather(*tasks)
    finally:
        await connection.close()
        await pool.close()


if __name__ == "__main__":
    asyncio.run(main())
