"""Ledgers in two databases: each consumer's ledger, attempt log and ctx.transaction() effects
in the database its class names (``database_url``), the others in the worker's."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from pydantic import BaseModel

from rabbitretry import Consumer, Context, Permanent
from rabbitretry.delivery.worker import Worker
from rabbitretry.errors import ConfigurationError
from tests.conftest import fresh_database
from tests.integration.harness import publish, running_worker, wait_status

pytestmark = pytest.mark.asyncio

EFFECTS = "CREATE TABLE effect (message_id text NOT NULL, queue text NOT NULL)"


class Note(BaseModel):
    fail: bool = False


def recording_consumer(queue: str, database_url: str | None) -> type[Consumer[Note]]:
    class Recording(Consumer[Note]):
        async def handle(self, msg: Note, ctx: Context) -> None:
            async with ctx.transaction() as conn:
                await conn.execute("INSERT INTO effect VALUES ($1, $2)", ctx.message_id, queue)
            if msg.fail:
                raise Permanent("refused")

    Recording.queue = queue
    Recording.database_url = database_url
    return Recording


async def rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    conn = await asyncpg.connect(url)
    try:
        return [tuple(r) for r in await conn.fetch(sql)]
    finally:
        await conn.close()


async def test_each_consumer_keeps_its_ledger_and_effects_in_its_own_database(
    amqp_url: str,
    database_url: str,
    second_database_url: str,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    for url in (database_url, second_database_url):
        await rows(url, EFFECTS)
    home = recording_consumer(f"{queue_name}-home", None)
    away = recording_consumer(f"{queue_name}-away", second_database_url)
    cleanup += [home, away]
    async with running_worker([home, away], amqp_url, database_url) as worker:
        await publish(amqp_url, home.queue, {}, message_id="h1")
        await publish(amqp_url, away.queue, {}, message_id="a1")
        await publish(amqp_url, away.queue, {"fail": True}, message_id="a2")
        first = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
        second = await asyncpg.create_pool(second_database_url, min_size=1, max_size=1)
        try:
            await wait_status(first, home.queue, "h1", "succeeded")
            await wait_status(second, away.queue, "a1", "succeeded")
            await wait_status(second, away.queue, "a2", "dead")
        finally:
            await first.close()
            await second.close()
        assert worker.health().ok

    ledger = "SELECT queue, message_id, status, attempts FROM rabbitretry.ledger ORDER BY 2"
    assert await rows(database_url, ledger) == [(home.queue, "h1", "succeeded", 1)]
    assert await rows(second_database_url, ledger) == [
        (away.queue, "a1", "succeeded", 1),
        (away.queue, "a2", "dead", 1),
    ]
    attempts = "SELECT queue, message_id FROM rabbitretry.attempt_history ORDER BY 2"
    assert await rows(database_url, attempts) == [(home.queue, "h1")]
    assert await rows(second_database_url, attempts) == [(away.queue, "a1"), (away.queue, "a2")]
    # The failed attempt's effect rolled back with it; the others committed where they belong.
    assert await rows(database_url, "SELECT * FROM effect") == [("h1", home.queue)]
    assert await rows(second_database_url, "SELECT * FROM effect") == [("a1", away.queue)]


async def test_a_consumer_database_not_migrated_stops_the_start_naming_it(
    amqp_url: str, database_url: str, server_database_url: str, queue_name: str
) -> None:
    async with fresh_database(server_database_url, None) as empty:
        away = recording_consumer(queue_name, empty)
        worker = Worker(consumers=[away], amqp_url=amqp_url, database_url=database_url)
        with pytest.raises(ConfigurationError) as raised:
            await worker.run()
    message = str(raised.value)
    assert message.startswith(f"the ledger schema at {empty} is not up to date (")
    assert message.endswith("pending): run `rabbitretry db migrate`")
