"""Publish a few "order paid" messages for ``examples.points:AwardPoints`` (the README's path).

``python -m examples.publish`` sends five orders to the exchange ``orders``: three that
succeed, one whose first call to the points service times out (retried after about a second,
then it succeeds) and one for a suspended user (dead: ``order-1005-paid``).

Each message's ``message_id`` is a business key (``order-1001-paid``): the same fact always
carries the same id, so running this twice publishes five duplicates that the worker's ledger
drops. Connects to ``RABBITRETRY_AMQP_URL``.
"""

from __future__ import annotations

import asyncio

from examples.points import OrderPaid
from rabbitretry import Publisher, RabbitRetryError
from rabbitretry.settings import Settings

ORDERS = [
    OrderPaid(order_id="1001", user_id=1, points=10),
    OrderPaid(order_id="1002", user_id=2, points=25),
    OrderPaid(order_id="1003", user_id=1, points=5),
    OrderPaid(order_id="1004", user_id=3, points=40, flaky=1),
    OrderPaid(order_id="1005", user_id=13, points=50),  # suspended: a dead letter
]


async def main() -> None:
    async with Publisher(Settings().amqp_url) as publisher:
        for order in ORDERS:
            message_id = await publisher.publish(
                "orders",
                order,
                routing_key="order.paid",
                message_id=f"order-{order.order_id}-paid",  # the same fact, the same id
            )
            print(f"published {message_id}")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except RabbitRetryError as error:
        raise SystemExit(f"error: {error}") from None
