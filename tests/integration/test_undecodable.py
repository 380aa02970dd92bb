"""A delivery whose header table the client cannot decode is one dead letter, and stops nothing.

A table nested about 800 levels deep is routed by the broker without complaint. The client's
codec decoded it recursively until the stack ran out, inside the reader task of the connection
that carries every consumer of the worker: the connection died, the broker requeued the
message, the connection came back and died again, and every queue of that worker stalled. Now
the decoding is bounded: the message is dead, reason ``undecodable``, with the table's raw
bytes, and the messages behind it on its queue and on the worker's other queue go on.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import asyncpg
import pika  # type: ignore[import-untyped]
import pytest

from rabbitretry import Consumer, Context
from rabbitretry.ledger import snapshot_of
from rabbitretry.message import headers
from tests.integration.harness import running_worker, wait_status
from tests.integration.test_hostile import FAST, healthy_messages_succeed, nothing_left_on
from tests.integration.test_pipeline import Job, entry, make_consumer


def deep_table(depth: int) -> bytes:
    """A header table ``{"x": {"x": ... {"ok": true}}}`` ``depth`` tables deep, built without
    recursion (the client's own encoder would recurse as its decoder does)."""
    table = b"\x02okt\x01"
    for _ in range(depth):
        table = b"\x01xF" + struct.pack(">I", len(table)) + table
    return struct.pack(">I", len(table)) + table


class RawHeaders(pika.BasicProperties):  # type: ignore[misc]
    """Properties whose header table is sent as the bytes given, with a message_id."""

    def __init__(self, table: bytes, message_id: str) -> None:
        super().__init__()
        self.table, self.id = table, message_id

    def encode(self) -> list[bytes]:
        flags = self.FLAG_HEADERS | self.FLAG_DELIVERY_MODE | self.FLAG_MESSAGE_ID
        encoded_id = self.id.encode()
        return [struct.pack(">H", flags), self.table, b"\x02", bytes([len(encoded_id)]), encoded_id]


def publish_deep(amqp_url: str, queue: str, message_id: str, depth: int) -> bytes:
    table = deep_table(depth)
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("", queue, b'{"n": 1}', RawHeaders(table, message_id))
    finally:
        connection.close()
    return table


async def _ok(msg: Job, ctx: Context) -> None:
    pass


@pytest.mark.parametrize("depth", [800, 18_000], ids=["800-deep", "near-the-frame-limit"])
async def test_a_header_table_too_deep_to_decode_is_dead_and_stops_nothing(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    depth: int,
) -> None:
    consumer = make_consumer(queue_name, _ok, policy=FAST)
    neighbour = make_consumer(f"{queue_name}.neighbour", _ok, policy=FAST)
    cleanup.extend([consumer, neighbour])
    async with running_worker([consumer, neighbour], amqp_url, database_url):
        table = await asyncio.to_thread(publish_deep, amqp_url, queue_name, "deep", depth)
        await wait_status(pool, queue_name, "deep", "dead", timeout=20)
        await healthy_messages_succeed(amqp_url, pool, queue_name)
        await healthy_messages_succeed(amqp_url, pool, neighbour.queue)
        await nothing_left_on(amqp_url, queue_name)
    row = await entry(pool, queue_name, "deep")
    assert (row["reason"], row["attempts"]) == ("undecodable", 0)
    assert "nested deeper than" in row["error_message"]
    assert snapshot_of(row).headers[headers.RAW_HEADERS] == table[4:]
