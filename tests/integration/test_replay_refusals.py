"""A replay the broker refuses fails that message alone: left dead, its reason reported.

Against the real broker and ledger. A replay publishes a dead letter to its work queue through
the default exchange, mandatory: a work queue deleted since returns it (unroutable), and a
stored header table too large for one frame is refused before it is sent. Either named one
message, yet ended the whole batch with an exception, the messages after it never replayed.
"""

from __future__ import annotations

import json
import re
from typing import Any

import aio_pika
import asyncpg
import pytest

from rabbitretry import Consumer, operations
from rabbitretry.errors import UnroutableError
from rabbitretry.ledger import Key
from tests.integration.dead_harness import Switch, dead_letters, orders_consumer
from tests.integration.harness import queue_depth, status_of

pytestmark = pytest.mark.asyncio

OVER_A_FRAME = {"big": "x" * 200_000}  # RabbitMQ's default frame_max is 131,072 bytes


class Broken(Switch):
    broken = True


async def delete_queue(amqp_url: str, queue: str) -> None:
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        await channel.queue_delete(queue)
    finally:
        await connection.close()


async def replays_of(pool: asyncpg.Pool, queue: str, message_id: str) -> int:
    replays: int = await pool.fetchval(
        "SELECT replays FROM rabbitretry.ledger WHERE queue = $1 AND message_id = $2",
        queue,
        message_id,
    )
    return replays


async def test_a_refused_replay_fails_that_message_alone_and_the_batch_goes_on(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    kept = orders_consumer(queue_name, Broken)
    gone = orders_consumer(f"{queue_name}.gone", Broken)
    cleanup += [kept, gone]
    async with dead_letters(kept, amqp_url, database_url, pool, {"k-1": {"order": 1}}):
        pass
    async with dead_letters(gone, amqp_url, database_url, pool, {"g-1": {"order": 2}}):
        pass
    async with dead_letters(
        kept, amqp_url, database_url, pool, {"huge": {"order": 3}, "k-2": {"order": 4}}
    ):
        pass
    # Its stored headers no longer fit in a frame (another writer, a larger frame_max once).
    await pool.execute(
        "UPDATE rabbitretry.ledger SET headers = $2::jsonb"
        " WHERE queue = $1 AND message_id = 'huge'",
        queue_name,
        json.dumps(OVER_A_FRAME),
    )
    await delete_queue(amqp_url, gone.queue)  # its replay comes back unroutable

    targets = await operations.replay_targets(pool)
    assert [str(key) for key in targets] == [
        f"{queue_name}/k-1",
        f"{gone.queue}/g-1",
        f"{queue_name}/huge",
        f"{queue_name}/k-2",
    ]
    async with operations.sender(amqp_url) as sender:
        report = await operations.replay(pool, sender, targets, actor="test")

    assert (report.replayed, report.failed, report.stopped) == (2, 2, None)
    assert report.keys == [f"{queue_name}/k-1", f"{queue_name}/k-2"]
    unroutable, too_large = report.failures
    assert unroutable == (
        f"{gone.queue}/g-1: no queue is bound for exchange '(default)' with routing key "
        f"'{gone.queue}'"
    )
    assert re.fullmatch(
        rf"{queue_name}/huge: message 'huge' cannot be published: its properties and headers "
        r"take 2000\d\d bytes, more than one frame of this connection holds \(131072 bytes, "
        r"the frame_max the broker set\); RabbitMQ would close the connection",
        too_large,
    ), too_large
    assert report.summary() == "replayed 2 of 4, 2 refused by the broker (left dead)"
    # The refused ones are still dead, as they were (replayable once the cause is fixed).
    for key in (Key(gone.queue, "g-1"), Key(queue_name, "huge")):
        assert await status_of(pool, key.queue, key.message_id) == "dead"
        assert await replays_of(pool, key.queue, key.message_id) == 0
    for message_id in ("k-1", "k-2"):
        assert await status_of(pool, queue_name, message_id) == "retrying"
    assert await queue_depth(amqp_url, queue_name) == 2
    batch = await pool.fetchrow(
        "SELECT messages, detail FROM rabbitretry.audit WHERE action = 'replay-batch'"
    )
    assert batch is not None and batch["messages"] == 2
    assert json.loads(batch["detail"])["failures"] == report.failures


async def test_a_refused_canary_stops_the_replay_with_the_brokers_reason(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    consumer = orders_consumer(queue_name, Broken)
    cleanup.append(consumer)
    bodies: dict[str, Any] = {"c-1": {"order": 1}, "c-2": {"order": 2}}
    async with dead_letters(consumer, amqp_url, database_url, pool, bodies):
        pass
    await delete_queue(amqp_url, queue_name)
    targets = await operations.replay_targets(pool, queue=queue_name)
    async with operations.sender(amqp_url) as sender:
        report = await operations.replay(pool, sender, targets, actor="test", canary=True)
    assert (report.replayed, report.failed) == (0, 1)
    assert report.stopped == (
        f"the canary {queue_name}/c-1 was refused by the broker: no queue is bound for exchange "
        f"'(default)' with routing key '{queue_name}'; 1 left dead"
    )
    for message_id in ("c-1", "c-2"):
        assert await status_of(pool, queue_name, message_id) == "dead"


async def test_a_refused_edit_and_replay_says_why_and_changes_nothing(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    consumer = orders_consumer(queue_name, Broken)
    cleanup.append(consumer)
    async with dead_letters(consumer, amqp_url, database_url, pool, {"e-1": {"order": 1}}):
        pass
    await delete_queue(amqp_url, queue_name)
    async with operations.sender(amqp_url) as sender:
        with pytest.raises(UnroutableError, match="no queue is bound"):
            await operations.edit_and_replay(
                pool, sender, Key(queue_name, "e-1"), '{"order": 5}', actor="test"
            )
    row = await pool.fetchrow(
        "SELECT status, payload, replays FROM rabbitretry.ledger WHERE message_id = 'e-1'"
    )
    assert row is not None
    assert (row["status"], json.loads(row["payload"]), row["replays"]) == ("dead", {"order": 1}, 0)
