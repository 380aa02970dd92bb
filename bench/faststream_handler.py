"""F's no-op handler, in a module of its own: it imports FastStream (the ``bench`` extra),
whose dependency injection reads the handler's annotations from this module's names."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from faststream.rabbit.annotations import RabbitMessage

from bench.throughput import Clock


def noop(clock: Clock) -> Callable[..., Awaitable[None]]:
    """A handler that takes the decoded body, acks the message itself (the subscriber's
    ``AckPolicy.MANUAL``) and ticks ``clock``."""

    async def handle(body: dict[str, Any], message: RabbitMessage) -> None:
        await message.ack()
        clock.tick()

    return handle
