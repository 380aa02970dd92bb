"""What a drill creates for itself and removes on the way out: a scratch database (migrated,
with the effects table), the drill queue's topology, and TCP proxies that faults can cut.

A failed drill (or ``keep``) leaves the scratch database behind for a post-mortem.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg

from drills.consumer import CREATE_EFFECTS, DrillConsumer
from rabbitretry import amqp
from rabbitretry.ledger import migrations
from rabbitretry.topology import Topology, declare
from rabbitretry.topology.model import QueueType
from tests.proxy import Proxy


@dataclass
class Keep:
    """Whether to leave the scratch database and the worker log behind."""

    wanted: bool


@contextlib.asynccontextmanager
async def scratch_database(server_url: str, name: str, keep: Keep) -> AsyncIterator[str]:
    """A new database, migrated, with the effects table; dropped on the way out unless kept."""
    admin = await asyncpg.connect(server_url)
    try:
        await admin.execute(f"CREATE DATABASE {name}")
    finally:
        await admin.close()
    url = urlunsplit(urlsplit(server_url)._replace(path=f"/{name}"))
    try:
        conn = await asyncpg.connect(url)
        try:
            await migrations.migrate(conn)
            await conn.execute(CREATE_EFFECTS)
        finally:
            await conn.close()
        yield url
    finally:
        if not keep.wanted:
            admin = await asyncpg.connect(server_url)
            try:
                await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            finally:
                await admin.close()


@contextlib.asynccontextmanager
async def drill_queue(
    amqp_url: str, queue: str, queue_type: QueueType = "classic"
) -> AsyncIterator[Topology]:
    """The drill queue's topology, declared; every queue of it deleted on the way out."""
    work_queue = DrillConsumer.work_queue().model_copy(update={"name": queue, "type": queue_type})
    topology = Topology(queues=[work_queue])
    connection = await amqp.connect(amqp_url, name="rabbitretry-drill")
    try:
        await declare(connection, topology)
    finally:
        await connection.close()
    try:
        yield topology
    finally:
        await _delete_queues(
            amqp_url, [q.name for q in topology.queue_declarations() if not q.shared]
        )


async def _delete_queues(amqp_url: str, names: list[str]) -> None:
    connection = await amqp.connect(amqp_url, name="rabbitretry-drill")
    try:
        for name in names:
            channel = await connection.channel()
            with contextlib.suppress(aio_pika.exceptions.AMQPError):
                await channel.queue_delete(name)
            with contextlib.suppress(aio_pika.exceptions.AMQPError):
                await channel.close()
    finally:
        await connection.close()


@contextlib.asynccontextmanager
async def proxied(url: str) -> AsyncIterator[Proxy]:
    parts = urlsplit(url)
    proxy = await Proxy(parts.hostname or "127.0.0.1", parts.port or 0).start()
    try:
        yield proxy
    finally:
        await proxy.close()
