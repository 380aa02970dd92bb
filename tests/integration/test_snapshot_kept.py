"""A succeeded message keeps no snapshot (payload, headers, properties) unless its consumer says
``keep_payload = "always"``; every row that may still be retried, replayed or re-driven keeps
its own, and the console and the CLI say why a succeeded one has none."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from rabbitretry import Consumer, Context, Permanent, RetryPolicy
from rabbitretry.console import Auth, ConsoleConfig
from rabbitretry.monitoring import levels
from tests.integration.console_harness import TOKEN, console_client, log_in
from tests.integration.harness import publish, running_worker, wait_status
from tests.integration.test_pipeline import Job, make_consumer

pytestmark = pytest.mark.asyncio

SNAPSHOT = (
    "SELECT status, payload IS NOT NULL AS payload, headers IS NOT NULL AS headers,"
    " properties IS NOT NULL AS properties FROM rabbitretry.ledger"
    " WHERE queue = $1 AND message_id = $2"
)


async def snapshot_kept(pool: asyncpg.Pool, queue: str, message_id: str) -> tuple[Any, ...]:
    row = await pool.fetchrow(SNAPSHOT, queue, message_id)
    assert row is not None
    return tuple(row)


async def test_a_succeeded_message_drops_its_snapshot_and_the_others_keep_theirs(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    async def handler(msg: Job, ctx: Context) -> None:
        if msg.n == 1:
            raise Permanent("not this one")
        if msg.n == 2:
            raise RuntimeError("try again much later")
        if msg.n == 3:
            async with ctx.transaction() as conn:  # a success mark inside the handler's own
                await conn.execute("SELECT 1")

    consumer = make_consumer(
        queue_name, handler, policy=RetryPolicy(max_attempts=3, initial_delay=300, jitter=0)
    )
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url):
        for n, key in enumerate(["plain", "dead", "retrying", "in-transaction"]):
            await publish(amqp_url, queue_name, {"n": n}, message_id=key, headers={"h": n})
        for key, status in [
            ("plain", "succeeded"),
            ("dead", "dead"),
            ("retrying", "retrying"),
            ("in-transaction", "succeeded"),
        ]:
            await wait_status(pool, queue_name, key, status, timeout=20)
    assert await snapshot_kept(pool, queue_name, "plain") == ("succeeded", False, False, False)
    assert await snapshot_kept(pool, queue_name, "in-transaction") == (
        "succeeded",
        False,
        False,
        False,
    )
    assert await snapshot_kept(pool, queue_name, "dead") == ("dead", True, True, True)
    assert await snapshot_kept(pool, queue_name, "retrying") == ("retrying", True, True, True)
    # Nothing can take the snapshot of a row that may still be sent again.
    with pytest.raises(asyncpg.CheckViolationError):
        await pool.execute(
            "UPDATE rabbitretry.ledger SET payload = NULL WHERE queue = $1 AND message_id = $2",
            queue_name,
            "dead",
        )


async def test_keep_payload_always_keeps_a_succeeded_messages_snapshot(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    async def handler(msg: Job, ctx: Context) -> None:
        return None

    consumer = make_consumer(queue_name, handler, keep_payload="always")
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url):
        await publish(amqp_url, queue_name, {"n": 7}, message_id="kept", headers={"h": 7})
        await wait_status(pool, queue_name, "kept", "succeeded", timeout=20)
    assert await snapshot_kept(pool, queue_name, "kept") == ("succeeded", True, True, True)
    row = await pool.fetchrow(
        "SELECT payload, headers FROM rabbitretry.ledger WHERE queue = $1", queue_name
    )
    assert row is not None
    assert bytes(row["payload"]) == b'{"n": 7}' and '"h": 7' in row["headers"]


async def test_the_console_says_why_a_succeeded_message_has_no_payload(
    database_url: str, amqp_url: str, pool: asyncpg.Pool
) -> None:
    await pool.execute(
        "INSERT INTO rabbitretry.ledger (queue, message_id, status, attempts, max_attempts,"
        " finished_at, payload, headers, properties)"
        " VALUES ('orders', 'done', 'succeeded', 1, 3, now(), NULL, NULL, NULL)"
    )
    config = ConsoleConfig(
        database_url=database_url,
        amqp_url=amqp_url,
        auth=Auth(token=TOKEN),
        allowed_hosts=("console.test",),
    )
    async with console_client(config) as client:
        await log_in(client)
        page = await client.get("/message", params={"queue": "orders", "id": "done"})
    assert page.status_code == 200, page.text
    assert "Not kept: the message succeeded" in page.text
    assert "keep_payload" in page.text


async def test_a_succeeded_message_keeps_its_publish_time_for_the_service_levels(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    """`rabbitretry status` measures latency from the publish time: the success mark keeps it
    (and nothing else of the properties), so a backlog the messages waited in still shows."""

    async def handler(msg: Job, ctx: Context) -> None:
        return None

    consumer = make_consumer(queue_name, handler)
    cleanup.append(consumer)
    published = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=40)
    async with running_worker([consumer], amqp_url, database_url):
        await publish(amqp_url, queue_name, {"n": 1}, message_id="late", timestamp=published)
        await publish(amqp_url, queue_name, {"n": 2}, message_id="unstamped")
        await wait_status(pool, queue_name, "late", "succeeded", timeout=20)
        await wait_status(pool, queue_name, "unstamped", "succeeded", timeout=20)
    properties = dict(
        await pool.fetch(
            "SELECT message_id, properties FROM rabbitretry.ledger WHERE queue = $1", queue_name
        )
    )
    assert properties["unstamped"] is None
    assert json.loads(properties["late"]) == {"timestamp": published.timestamp()}
    (measured,) = await levels.measure(pool, [queue_name], {}, window=300)
    assert measured.finished == 2
    assert measured.p99 is not None and 39 <= measured.p99 < 60  # the 40 s it waited
