"""A downstream's rate limits hold across workers, and a call that gets no turn costs nothing."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import pytest
from pydantic import BaseModel

from rabbitretry import Consumer, Context, Downstream, RetryPolicy
from tests.integration.harness import publish, running_worker, wait_for

pytestmark = pytest.mark.asyncio


class Order(BaseModel):
    order_id: int


def limited_consumer(
    queue: str, calls: list[float], hold: float = 0.0, timeout: float = 60.0, **limits: Any
) -> type[Consumer[Order]]:
    class ShipOrder(Consumer[Order]):
        retry = RetryPolicy(max_attempts=2, initial_delay=0.1, jitter=0.0)
        downstreams = (Downstream("wms", **limits),)

        async def handle(self, msg: Order, ctx: Context) -> None:
            async with ctx.downstream("wms"):
                calls.append(time.monotonic())
                await asyncio.sleep(hold)

    ShipOrder.queue = queue
    ShipOrder.timeout = timeout
    return ShipOrder


async def succeeded(pool: asyncpg.Pool, queue: str, count: int) -> None:
    async def done() -> bool:
        n = await pool.fetchval(
            "SELECT count(*) FROM rabbitretry.ledger WHERE queue = $1 AND status = 'succeeded'",
            queue,
        )
        return bool(n == count)

    await wait_for(done, timeout=40)


def busiest_second(calls: list[float], after: float) -> int:
    """The most calls in any one-second window that starts ``after`` s past the first call."""
    start = calls[0] + after
    return max(
        (sum(1 for c in calls if begin <= c < begin + 1.0) for begin in calls if begin >= start),
        default=0,
    )


async def test_two_workers_share_calls_a_second(
    pool: asyncpg.Pool,
    amqp_url: str,
    database_url: str,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    calls: list[float] = []
    consumer = limited_consumer(queue_name, calls, max_per_second=10)
    cleanup.append(consumer)
    async with (
        running_worker([consumer], amqp_url, database_url, concurrency=4, name="one"),
        running_worker([consumer], amqp_url, database_url, concurrency=4, name="two"),
    ):
        await asyncio.sleep(1.5)  # each worker has seen the other (they note themselves every s)
        for order_id in range(50):
            await publish(amqp_url, queue_name, {"order_id": order_id}, message_id=f"o-{order_id}")
        await succeeded(pool, queue_name, 50)

    calls.sort()
    assert len(calls) == 50
    # Five calls a second each: 50 calls take at least 4.8 s, and no second holds more than 10
    # (one more at a window's edge, as both workers may start a call at its first instant).
    assert calls[-1] - calls[0] >= 4.8
    assert busiest_second(calls, after=0.0) <= 11
    charged = await pool.fetchval(
        "SELECT max(attempts - attempts_forgiven) FROM rabbitretry.ledger WHERE queue = $1",
        queue_name,
    )
    assert charged == 1


async def test_a_call_that_gets_no_turn_in_time_is_deferred_not_charged(
    pool: asyncpg.Pool,
    amqp_url: str,
    database_url: str,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    calls: list[float] = []
    # One call at once, each holding it 0.6 s; a call waits at most half the 1 s timeout.
    consumer = limited_consumer(queue_name, calls, hold=0.6, timeout=1.0, max_at_once=1)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url, concurrency=2):
        for order_id in range(2):
            await publish(amqp_url, queue_name, {"order_id": order_id}, message_id=f"o-{order_id}")
        await succeeded(pool, queue_name, 2)

    assert len(calls) == 2
    deferred = await pool.fetch(
        "SELECT error_message FROM rabbitretry.attempt_history"
        " WHERE queue = $1 AND outcome = 'deferred' AND downstream = 'wms'",
        queue_name,
    )
    assert deferred and all("no turn under its rate limit" in d["error_message"] for d in deferred)
    charged = await pool.fetch(
        "SELECT attempts - attempts_forgiven AS n FROM rabbitretry.ledger WHERE queue = $1",
        queue_name,
    )
    assert [row["n"] for row in charged] == [1, 1]
