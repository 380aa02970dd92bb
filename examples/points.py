"""Award loyalty points when an order is paid: the consumer the README and the demo use.

The points service here is a stand-in that misbehaves on purpose, the way real ones do:
some calls time out and work on a later try, a suspended account refuses every call, and
an order over the per-order limit is simply wrong.
"""

from __future__ import annotations

import logging

from pydantic import BaseModel, Field

from rabbitretry import Binding, Consumer, Context, Permanent, RetryPolicy

log = logging.getLogger("examples.points")

SUSPENDED_USERS: set[int] = {13}
POINTS_LIMIT = 10_000
TOTALS: dict[int, int] = {}
"""user_id -> points awarded: the stand-in service's state."""


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

    async def handle(self, msg: OrderPaid, ctx: Context) -> None:
        await award(msg, ctx)


async def award(msg: OrderPaid, ctx: Context) -> None:
    """The call to the points service (pass ``ctx.idempotency_key`` to a real one)."""
    if msg.user_id in SUSPENDED_USERS:
        raise Permanent(f"user {msg.user_id} is suspended; points cannot be awarded")
    if msg.points > POINTS_LIMIT:
        raise ValueError(f"{msg.points} points is over the per-order limit of {POINTS_LIMIT}")
    if ctx.attempt <= msg.flaky:
        raise TimeoutError(f"points service timed out (attempt {ctx.attempt})")
    TOTALS[msg.user_id] = TOTALS.get(msg.user_id, 0) + msg.points
    log.info("order %s: %d points to user %d", msg.order_id, msg.points, msg.user_id)
