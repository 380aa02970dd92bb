"""Helpers for integration tests: run a worker in-process, publish, wait on the ledger."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

import aio_pika
import asyncpg

from rabbitretry.consumer import Consumer
from rabbitretry.delivery.worker import Worker


async def publish(
    amqp_url: str,
    routing_key: str,
    body: bytes | dict[str, Any],
    *,
    message_id: str | None,
    exchange: str = "",
    headers: dict[str, Any] | None = None,
    times: int = 1,
    timestamp: datetime | None = None,
) -> None:
    raw = json.dumps(body).encode() if isinstance(body, dict) else body
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        target = channel.default_exchange if not exchange else await channel.get_exchange(exchange)
        for _ in range(times):
            await target.publish(
                aio_pika.Message(
                    raw,
                    message_id=message_id,
                    headers=headers or {},
                    content_type="application/json",
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    timestamp=timestamp,
                ),
                routing_key=routing_key,
            )
    finally:
        await connection.close()


async def publish_without_id(amqp_url: str, routing_key: str, body: bytes) -> None:
    """Publish with no message_id property: aiormq always invents one, so use pika."""
    import pika

    def send() -> None:
        connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
        try:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.basic_publish("", routing_key, body, pika.BasicProperties(delivery_mode=2))
        finally:
            connection.close()

    await asyncio.to_thread(send)


async def wait_for(
    condition: Callable[[], Awaitable[Any]], *, timeout: float = 30.0, interval: float = 0.1
) -> Any:
    """Poll ``condition`` until it returns something truthy; fail with a clear message."""
    deadline = time.monotonic() + timeout
    while True:
        result = await condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s: {condition.__name__}")
        await asyncio.sleep(interval)


def lock_waited_by(pool: asyncpg.Pool, statement: str) -> Callable[[], Awaitable[bool]]:
    """A condition for :func:`wait_for`: a session of this database runs a statement with
    ``statement`` in its text and waits for a lock."""

    async def waits_for_the_lock() -> bool:
        return bool(
            await pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE $1 AND datname = current_database()",
                f"%{statement}%",
            )
        )

    return waits_for_the_lock


async def status_of(pool: asyncpg.Pool, queue: str, message_id: str) -> str | None:
    status: str | None = await pool.fetchval(
        "SELECT status FROM rabbitretry.ledger WHERE queue = $1 AND message_id = $2",
        queue,
        message_id,
    )
    return status


async def wait_status(
    pool: asyncpg.Pool, queue: str, message_id: str, status: str, *, timeout: float = 30.0
) -> None:
    async def reached() -> bool:
        return await status_of(pool, queue, message_id) == status

    reached.__name__ = f"{queue}/{message_id} is {status}"
    await wait_for(reached, timeout=timeout)


async def is_marked(db: asyncpg.Pool | asyncpg.Connection, queue: str, key: str) -> bool:
    """Whether ``key``'s open attempt is marked started (its handler has run a while)."""
    return bool(
        await db.fetchval(
            "SELECT handler_started_at IS NOT NULL FROM rabbitretry.attempt_history"
            " WHERE queue = $1 AND message_id = $2 AND outcome IS NULL",
            queue,
            key,
        )
    )


@contextlib.asynccontextmanager
async def running_worker(
    consumers: Sequence[type[Consumer[Any]]],
    amqp_url: str,
    database_url: str,
    **options: Any,
) -> AsyncIterator[Worker]:
    worker = Worker(
        consumers=consumers,
        amqp_url=amqp_url,
        database_url=database_url,
        declare_topology=True,
        **options,
    )
    task = asyncio.create_task(worker.run())
    try:
        await wait_for(_consuming(worker, task), timeout=15)
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, timeout=60)


def _consuming(worker: Worker, task: asyncio.Task[None]) -> Callable[[], Awaitable[bool]]:
    async def started() -> bool:
        if task.done():
            task.result()  # re-raises the startup error
        return worker.started

    return started


async def queue_depth(amqp_url: str, queue: str) -> int:
    """Messages ready in ``queue`` (a passive declare: the queue must exist)."""
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        return int(declared.declaration_result.message_count or 0)
    finally:
        await connection.close()
