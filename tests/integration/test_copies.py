"""Every copy rabbitretry republishes is made by one recipe (``rabbitretry.message.headers``).

A dead letter whose producer sent a ``correlation_id`` that is not UTF-8 and a ``CC`` header is
replayed: the copy must reach the work queue (it was refused as unencodable when the replay
built its properties its own way), with the text escaped, the producer's timestamp and headers
kept, no ``CC`` (which would route it to other queues too) and the ledger's attempt count.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import aio_pika
import asyncpg
import pika  # type: ignore[import-untyped]

from rabbitretry import Consumer, Context, Permanent, RetryPolicy, operations
from rabbitretry.ledger import Key
from rabbitretry.message import headers
from rabbitretry.operations import dead_letter
from tests.integration.harness import running_worker, wait_status
from tests.integration.test_pipeline import Job, make_consumer

PUBLISHED_AT = 1_700_000_000


def publish_with_pika(amqp_url: str, queue: str, **properties: Any) -> None:
    """pika sends a property as the bytes it is given, as a foreign producer may."""
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("", queue, b'{"n": 1}', pika.BasicProperties(**properties))
    finally:
        connection.close()


async def take_one(amqp_url: str, queue: str) -> aio_pika.abc.AbstractIncomingMessage:
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        work = await channel.declare_queue(queue, passive=True)
        message = await work.get(timeout=10)
        await message.ack()
        return message
    finally:
        await connection.close()


async def test_a_replayed_copy_is_made_by_the_recipe(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    async def refuse(msg: Job, ctx: Context) -> None:
        raise Permanent("refused")

    consumer = make_consumer(queue_name, refuse, policy=RetryPolicy(max_attempts=1))
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url):
        await asyncio.to_thread(
            publish_with_pika,
            amqp_url,
            queue_name,
            message_id="odd",
            correlation_id=b"c\xffid",
            timestamp=PUBLISHED_AT,
            headers={"CC": [f"{queue_name}.elsewhere"], "x-tenant": "t1"},
        )
        await wait_status(pool, queue_name, "odd", "dead")

    async with operations.sender(amqp_url) as sender:
        assert await dead_letter.replay_one(pool, sender, Key(queue_name, "odd"), actor="test")

    copy = await take_one(amqp_url, queue_name)
    assert copy.message_id == "odd"
    assert copy.correlation_id == "c\\udcffid"  # the lone surrogate, escaped as it is stored
    assert copy.timestamp == datetime.fromtimestamp(PUBLISHED_AT, tz=UTC)
    assert copy.headers == {"x-tenant": "t1", headers.ATTEMPTS: 1}
