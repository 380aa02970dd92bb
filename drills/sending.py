"""Publishing a drill's messages: paced over the window, with confirms, sent again until taken.

Both drills publish this way; the cluster drill hands some messages to the outbox instead
(``enqueue``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import Awaitable, Callable

import aio_pika

from drills.clock import Clock
from drills.plan import Message, Plan
from rabbitretry import urls

REPUBLISH_PAUSE = 0.5  # seconds between attempts to publish while the broker is away

Enqueue = Callable[[Message], Awaitable[bool]]
"""Takes a message into the outbox instead of publishing it (True), or leaves it (False)."""


async def publish(
    amqp_url: str, queue: str, plan: Plan, clock: Clock, enqueue: Enqueue | None = None
) -> int:
    """Publish every message with confirms, paced over the window; the count of re-sends.

    A publish that is not confirmed (the broker went away) is sent again with the same
    message_id until it is: a copy may then exist twice, which the ledger must absorb. With
    several URLs (a cluster), each new connection goes to the next node. ``enqueue`` may take
    a message into the outbox instead.
    """
    interval = plan.publish_seconds / max(1, len(plan.messages))
    start = clock.now()
    republished = 0
    nodes = itertools.cycle(urls.split_urls(amqp_url))
    channel: aio_pika.abc.AbstractChannel | None = None
    connection: aio_pika.abc.AbstractConnection | None = None
    try:
        for index, message in enumerate(plan.messages):
            await asyncio.sleep(max(0.0, start + index * interval - clock.now()))
            if enqueue is not None and await enqueue(message):
                continue
            while True:
                try:
                    if channel is None or channel.is_closed:
                        if connection is not None:
                            with contextlib.suppress(Exception):
                                await connection.close()
                        connection = await aio_pika.connect(next(nodes), timeout=5)
                        channel = await connection.channel(
                            publisher_confirms=True, on_return_raises=True
                        )
                    await _send(channel, queue, message)
                    break
                except (aio_pika.exceptions.AMQPError, OSError, RuntimeError, TimeoutError):
                    republished += 1
                    channel = None
                    await asyncio.sleep(REPUBLISH_PAUSE)
    finally:
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()
    return republished


async def _send(channel: aio_pika.abc.AbstractChannel, queue: str, message: Message) -> None:
    await asyncio.wait_for(
        channel.default_exchange.publish(
            aio_pika.Message(
                json.dumps(message.body()).encode(),
                message_id=message.message_id,
                content_type="application/json",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            ),
            routing_key=queue,
            mandatory=True,
        ),
        timeout=10,
    )
