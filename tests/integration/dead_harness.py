"""Dead letters made the real way: a consumer that fails permanently until it is mended."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import asyncpg
from pydantic import BaseModel

from rabbitretry import Consumer, Context, Permanent, RetryPolicy
from tests.integration.harness import publish, running_worker, wait_status


class Order(BaseModel):
    order: int
    note: str = ""


class Switch:
    """Whether the consumer is broken; a test mends it before replaying."""

    broken = True


def orders_consumer(queue: str, switch: type[Switch]) -> type[Consumer[Order]]:
    class Orders(Consumer[Order]):
        failing: ClassVar[type[Switch]] = switch

        async def handle(self, msg: Order, ctx: Context) -> None:
            if self.failing.broken or msg.order < 0:
                raise Permanent(f"order {msg.order} not found")

    Orders.queue = queue
    Orders.retry = RetryPolicy(max_attempts=1, initial_delay=1.0, jitter=0.0)
    return Orders


@contextlib.asynccontextmanager
async def dead_letters(
    consumer: type[Consumer[Any]],
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    bodies: dict[str, dict[str, Any] | bytes],
) -> AsyncIterator[None]:
    """Run a worker, publish ``bodies`` by message_id, wait until all are dead; keep running."""
    async with running_worker([consumer], amqp_url, database_url):
        for message_id, body in bodies.items():
            await publish(amqp_url, consumer.queue, body, message_id=message_id)
        for message_id in bodies:
            await wait_status(pool, consumer.queue, message_id, "dead")
        yield
