"""ctx.transaction(): the handler's database effects commit with the ledger's success mark."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from pydantic import BaseModel

from rabbitretry import Consumer, Context, RetryPolicy
from tests.integration.harness import (
    publish,
    running_worker,
    wait_for,
    wait_status,
)
from tests.proxy import Proxy

pytestmark = pytest.mark.asyncio


class Award(BaseModel):
    user_id: int
    points: int


EFFECTS = """
CREATE TABLE points_flow (key text NOT NULL, user_id int NOT NULL, points int NOT NULL);
CREATE TABLE user_points (user_id int PRIMARY KEY, total int NOT NULL);
"""


@pytest.fixture
async def effects_pool(pool: asyncpg.Pool) -> asyncpg.Pool:
    await pool.execute(EFFECTS)
    return pool


def awarding_consumer(
    queue: str, before_commit: Any = None, fail_first: int = 0
) -> type[Consumer[Award]]:
    """A consumer that awards points in ctx.transaction(); hooks to misbehave."""

    class AwardPoints(Consumer[Award]):
        retry = RetryPolicy(max_attempts=4, initial_delay=1.0, jitter=0.0)

        async def handle(self, msg: Award, ctx: Context) -> None:
            async with ctx.transaction() as conn:
                await conn.execute(
                    "INSERT INTO points_flow VALUES ($1, $2, $3)",
                    ctx.idempotency_key,
                    msg.user_id,
                    msg.points,
                )
                await conn.execute(
                    "INSERT INTO user_points VALUES ($1, $2) ON CONFLICT (user_id)"
                    " DO UPDATE SET total = user_points.total + $2",
                    msg.user_id,
                    msg.points,
                )
                if ctx.attempt <= fail_first:
                    raise ConnectionError("the downstream call after the writes failed")
            if before_commit is not None:
                await before_commit(ctx)

    AwardPoints.queue = queue
    return AwardPoints


async def flow_rows(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    return await pool.fetch("SELECT * FROM points_flow")


async def total(pool: asyncpg.Pool, user_id: int) -> int | None:
    value: int | None = await pool.fetchval(
        "SELECT total FROM user_points WHERE user_id = $1", user_id
    )
    return value


async def test_failed_attempt_rolls_its_writes_back(
    amqp_url: str,
    database_url: str,
    effects_pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    consumer = awarding_consumer(queue_name, fail_first=2)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url):
        await publish(amqp_url, queue_name, {"user_id": 1, "points": 10}, message_id="o-1")
        await wait_status(effects_pool, queue_name, "o-1", "succeeded", timeout=20)
    assert len(await flow_rows(effects_pool)) == 1  # two failed attempts left nothing behind
    assert await total(effects_pool, 1) == 10


async def test_twenty_duplicates_award_once(
    amqp_url: str,
    database_url: str,
    effects_pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    consumer = awarding_consumer(queue_name)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url, concurrency=4) as worker:
        await publish(amqp_url, queue_name, {"user_id": 2, "points": 5}, message_id="o-2", times=20)
        await wait_status(effects_pool, queue_name, "o-2", "succeeded")

        async def every_copy_handled() -> bool:
            return sum(o.result in ("succeeded", "dropped") for o in worker.outcomes) == 20

        await wait_for(every_copy_handled, timeout=40)
    assert len(await flow_rows(effects_pool)) == 1
    assert await total(effects_pool, 2) == 5


async def test_commit_then_lost_ack_awards_once(
    amqp_url: str,
    database_url: str,
    effects_pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    broker_proxy: Proxy,
) -> None:
    """The effect commits, the ack never reaches the broker, the worker dies: once."""
    proxy = broker_proxy
    in_handler = asyncio.Event()
    release = asyncio.Event()

    async def hold(ctx: Context) -> None:
        in_handler.set()
        await release.wait()

    consumer = awarding_consumer(queue_name, before_commit=hold)
    cleanup.append(consumer)
    async with running_worker([consumer], proxy.url_for(amqp_url), database_url):
        await publish(amqp_url, queue_name, {"user_id": 3, "points": 7}, message_id="o-3")
        await asyncio.wait_for(in_handler.wait(), 10)
        await proxy.cut(refuse=True)  # from here on, no ack can reach the broker
        release.set()
        await wait_status(effects_pool, queue_name, "o-3", "succeeded")
    # That worker is gone without acking; the broker still holds the delivery.

    second = awarding_consumer(queue_name)
    async with running_worker([second], amqp_url, database_url) as worker:

        async def redelivery_dropped() -> bool:
            return any(o.result == "dropped" for o in worker.outcomes)

        await wait_for(redelivery_dropped, timeout=20)
    assert len(await flow_rows(effects_pool)) == 1
    assert await total(effects_pool, 3) == 7


async def test_swallowed_rollback_is_not_a_success(
    amqp_url: str,
    database_url: str,
    effects_pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    class Swallower(Consumer[Award]):
        retry = RetryPolicy(max_attempts=2, initial_delay=1.0, jitter=0.0)

        async def handle(self, msg: Award, ctx: Context) -> None:
            try:
                async with ctx.transaction() as conn:
                    await conn.execute("INSERT INTO points_flow VALUES ('k', 1, 1)")
                    raise LookupError("user not found")
            except LookupError:
                pass  # the classic "fake success"

    Swallower.queue = queue_name
    cleanup.append(Swallower)
    async with running_worker([Swallower], amqp_url, database_url):
        await publish(amqp_url, queue_name, {"user_id": 1, "points": 1}, message_id="o-4")
        await wait_status(effects_pool, queue_name, "o-4", "dead", timeout=20)
    row = await effects_pool.fetchrow(
        "SELECT error_type, error_message FROM rabbitretry.ledger WHERE message_id = 'o-4'"
    )
    assert row is not None and row["error_type"] == "TransactionRolledBack"
    assert "LookupError" in row["error_message"]
    assert await flow_rows(effects_pool) == []
