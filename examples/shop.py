"""Paying an order awards points exactly once: the outbox and ``ctx.transaction()`` together.

``pay_order`` marks the order paid and enqueues "order paid" in one transaction, so a paid
order always has its message and a rolled-back payment has none. ``AwardOrderPoints`` writes a
points-flow row and the user's new total in the transaction that also marks the message
``succeeded`` in the ledger, so a redelivered or duplicated message cannot award twice.
"""

from __future__ import annotations

from pydantic import BaseModel

from rabbitretry import Binding, Consumer, Context, RetryPolicy
from rabbitretry.db import Connection
from rabbitretry.outbox import Outbox

SCHEMA = """
CREATE TABLE IF NOT EXISTS shop_order (
    id      text PRIMARY KEY,
    user_id integer NOT NULL,
    amount  integer NOT NULL,
    paid    boolean NOT NULL DEFAULT false
);
CREATE TABLE IF NOT EXISTS shop_points_flow (
    idempotency_key text PRIMARY KEY,
    user_id         integer NOT NULL,
    points          integer NOT NULL,
    at              timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS shop_user_points (
    user_id integer PRIMARY KEY,
    total   integer NOT NULL
);
"""

outbox = Outbox()


class OrderPaid(BaseModel):
    order_id: str
    user_id: int
    points: int


async def create_schema(conn: Connection) -> None:
    await conn.execute(SCHEMA)


async def place_order(conn: Connection, order_id: str, user_id: int, amount: int) -> None:
    await conn.execute(
        "INSERT INTO shop_order (id, user_id, amount) VALUES ($1, $2, $3)",
        order_id,
        user_id,
        amount,
    )


async def pay_order(conn: Connection, order_id: str) -> None:
    """Mark the order paid and enqueue its message, in one transaction."""
    async with conn.transaction():
        order = await conn.fetchrow(
            "UPDATE shop_order SET paid = true WHERE id = $1 AND NOT paid RETURNING *", order_id
        )
        if order is None:
            raise ValueError(f"order {order_id} does not exist or is already paid")
        await outbox.enqueue(
            conn,
            "shop",
            OrderPaid(order_id=order_id, user_id=order["user_id"], points=order["amount"] // 10),
            routing_key="order.paid",
            message_id=f"order-{order_id}-paid",  # a business key: the same fact, the same id
        )


class AwardOrderPoints(Consumer[OrderPaid]):
    queue = "shop.points"
    bindings = [Binding(exchange="shop", routing_key="order.paid")]
    retry = RetryPolicy(max_attempts=5, initial_delay=1.0, max_delay=60.0)

    async def handle(self, msg: OrderPaid, ctx: Context) -> None:
        async with ctx.transaction() as conn:
            await conn.execute(
                "INSERT INTO shop_points_flow (idempotency_key, user_id, points)"
                " VALUES ($1, $2, $3)",
                ctx.idempotency_key,
                msg.user_id,
                msg.points,
            )
            await conn.execute(
                "INSERT INTO shop_user_points (user_id, total) VALUES ($1, $2)"
                " ON CONFLICT (user_id) DO UPDATE SET total = shop_user_points.total + $2",
                msg.user_id,
                msg.points,
            )
