"""Award loyalty points when an order is paid: the consumer of the README and of the demo.

The handler calls a points service, then records the award in the table ``points_flow``, in
the transaction that also marks the message ``succeeded`` in the ledger: an order's points are
recorded exactly once however often its message arrives. ``setup()`` creates the table if it
is missing, so the example needs nothing but a migrated ledger.

The points service here is a stand-in that misbehaves on purpose, the way real ones do: some
calls time out and work on a later try, a suspended account refuses every call, and an order
over the per-order limit is simply wrong.
"""

from __future__ import annotations

import logging

import asyncpg
from pydantic import BaseModel, Field

from rabbitretry import Binding, Consumer, Context, Permanent, RetryPolicy
from rabbitretry.settings import Settings

log = logging.getLogger("examples.points")

SUSPENDED_USERS: set[int] = {13}
POINTS_LIMIT = 10_000

SCHEMA = """
CREATE TABLE IF NOT EXISTS points_flow (
    idempotency_key text PRIMARY KEY,
    user_id         integer NOT NULL,
    points          integer NOT NULL,
    at              timestamptz NOT NULL DEFAULT now()
)
"""


class OrderPaid(BaseModel):
    order_id: str
    user_id: int
    points: int = Field(gt=0)
    flaky: int = Field(default=0, ge=0, description="calls that time out before one succeeds")


class AwardPoints(Consumer[OrderPaid]):
    queue = "points.award"
    bindings = [Binding(exchange="orders", routing_key="order.paid")]
    retry = RetryPolicy(
        max_attempts=4,
        initial_delay=1.0,
        multiplier=2.0,
        max_delay=30.0,
        jitter=0.2,
        retry_on=(TimeoutError, ConnectionError),
        permanent_on=(ValueError,),
    )

    async def setup(self) -> None:  # once per worker, before the first message
        conn = await asyncpg.connect(Settings().database_url)
        try:
            await conn.execute(SCHEMA)  # CREATE TABLE IF NOT EXISTS points_flow ...
        finally:
            await conn.close()

    async def handle(self, msg: OrderPaid, ctx: Context) -> None:
        await award(msg, ctx)  # the points service: outside the database, at least once
        async with ctx.transaction() as conn:  # commits with the ledger's success mark
            await conn.execute(
                "INSERT INTO points_flow (idempotency_key, user_id, points) VALUES ($1, $2, $3)",
                ctx.idempotency_key,
                msg.user_id,
                msg.points,
            )


async def award(msg: OrderPaid, ctx: Context) -> None:
    """The call to the points service (pass ``ctx.idempotency_key`` to a real one)."""
    if msg.user_id in SUSPENDED_USERS:
        raise Permanent(f"user {msg.user_id} is suspended; points cannot be awarded")
    if msg.points > POINTS_LIMIT:
        raise ValueError(f"{msg.points} points is over the per-order limit of {POINTS_LIMIT}")
    if ctx.attempt <= msg.flaky:
        raise TimeoutError(f"points service timed out (attempt {ctx.attempt})")
    log.info("order %s: %d points to user %d", msg.order_id, msg.points, msg.user_id)
