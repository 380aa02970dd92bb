"""The broker and database the benchmarks run against: scratch databases, queues, prefilling."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import time
from collections.abc import AsyncIterator, Iterable
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg

from rabbitretry.ledger import migrations

AMQP_URL = os.environ.get("RABBITRETRY_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
DATABASE_URL = os.environ.get(
    "RABBITRETRY_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
PUBLISH_WINDOW = 500  # publishes in flight at once while prefilling (their confirms overlap)


def random_name(prefix: str) -> str:
    return f"bench.{prefix}.{secrets.token_hex(4)}"


def with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


@contextlib.asynccontextmanager
async def scratch_database(server_url: str = DATABASE_URL) -> AsyncIterator[str]:
    """A fresh, migrated database for this run, dropped afterwards; yields its URL."""
    name = f"rabbitretry_bench_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(server_url)
    try:
        await admin.execute(f"CREATE DATABASE {name}")
    finally:
        await admin.close()
    url = with_database(server_url, name)
    try:
        conn = await asyncpg.connect(url)
        try:
            await migrations.migrate(conn)
        finally:
            await conn.close()
        yield url
    finally:
        admin = await asyncpg.connect(server_url)
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        finally:
            await admin.close()


def body(index: int, **extra: object) -> bytes:
    return json.dumps({"n": index, "sent": time.time(), **extra}).encode()


async def declare_plain_queue(connection: aio_pika.abc.AbstractConnection, name: str) -> None:
    channel = await connection.channel()
    await channel.declare_queue(name, durable=True)
    await channel.close()


async def prefill(
    connection: aio_pika.abc.AbstractConnection,
    queue: str,
    bodies: Iterable[tuple[str, bytes]],
) -> None:
    """Publish (message_id, body) pairs, persistent and confirmed, a window at a time."""
    await prefill_messages(
        connection,
        queue,
        (
            aio_pika.Message(
                raw,
                message_id=message_id,
                content_type="application/json",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            for message_id, raw in bodies
        ),
    )


async def prefill_messages(
    connection: aio_pika.abc.AbstractConnection,
    queue: str,
    messages: Iterable[aio_pika.Message],
) -> None:
    """Publish messages (a peer's own format: headers, encoding) to ``queue`` through the
    default exchange, confirmed, a window at a time; :func:`prefill` for plain JSON bodies."""
    channel = await connection.channel(publisher_confirms=True)
    try:
        pending: list[asyncio.Future[object]] = []
        for message in messages:
            pending.append(
                asyncio.ensure_future(channel.default_exchange.publish(message, routing_key=queue))
            )
            if len(pending) >= PUBLISH_WINDOW:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await channel.close()


async def delete_queues(connection: aio_pika.abc.AbstractConnection, names: Iterable[str]) -> None:
    for name in names:
        channel = await connection.channel()
        with contextlib.suppress(Exception):
            await channel.queue_delete(name)
        with contextlib.suppress(Exception):
            await channel.close()


async def wait_until(condition: object, *, timeout: float, interval: float = 0.005) -> float:
    """Poll a zero-argument callable until it is truthy; the monotonic time it became so."""
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(f"benchmark condition not met within {timeout:.0f} s")
        await asyncio.sleep(interval)
