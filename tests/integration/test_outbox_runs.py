"""A relay takes an ordering key's pending rows as a run, and publishes them in order.

Against the real broker and database. Before runs, a relay took one row of a key a poll (the
head: a row waits while an older row of its key is pending), so a key with a backlog left at
about 90 rows a second, each poll walking the rest of the key's rows.
"""

from __future__ import annotations

import json

import asyncpg
import pytest

from rabbitretry import OutboxRelay
from rabbitretry.amqp import ConfirmingPublisher
from rabbitretry.db import query
from tests.integration.test_outbox_unpublishable import LONG_ID, drain, enqueue, rows_by_id

pytestmark = pytest.mark.asyncio


async def backlog(pool: asyncpg.Pool, key: str, count: int, queue: str) -> list[str]:
    """``count`` pending rows of ``key`` in one transaction: their message_ids, in order."""
    ids = await pool.fetch(
        "INSERT INTO rabbitretry.outbox (exchange, routing_key, message_id, ordering_key,"
        " payload) SELECT '', $1, $2 || '-' || n, $2, '{}' FROM generate_series(1, $3) AS n"
        " RETURNING message_id",
        queue,
        key,
        count,
    )
    return [row["message_id"] for row in ids]


def statuses(rows: dict[str, asyncpg.Record]) -> dict[str, tuple[str, int]]:
    return {key: (row["status"], row["tries"]) for key, row in rows.items()}


async def test_a_keys_backlog_leaves_a_run_a_poll_in_order(
    amqp_url: str, pool: asyncpg.Pool, work_queue: str, publisher: ConfirmingPublisher
) -> None:
    sent = await backlog(pool, "order-7", 120, work_queue)
    relay = OutboxRelay(pool, amqp_url, batch_size=50)
    assert [await relay.relay_once(publisher) for _ in range(4)] == [50, 50, 20, 0]
    assert await drain(amqp_url, work_queue) == sent


async def test_keys_with_backlogs_share_a_poll(
    amqp_url: str, pool: asyncpg.Pool, work_queue: str, publisher: ConfirmingPublisher
) -> None:
    first = await backlog(pool, "a", 30, work_queue)
    second = await backlog(pool, "b", 30, work_queue)
    await enqueue(pool, "no-key", work_queue)
    relay = OutboxRelay(pool, amqp_url, batch_size=21)
    # Two keys share the batch: a run of 21 // 2 = 10 rows each, and the row without a key.
    assert await relay.relay_once(publisher) == 21
    while await relay.relay_once(publisher):
        pass
    received = await drain(amqp_url, work_queue)
    assert sorted(received) == sorted([*first, *second, "no-key"])
    assert [m for m in received if m.startswith("a-")] == first
    assert [m for m in received if m.startswith("b-")] == second


async def test_a_row_refused_mid_run_ends_it_and_the_rows_after_it_wait_untried(
    amqp_url: str,
    pool: asyncpg.Pool,
    work_queue: str,
    publisher: ConfirmingPublisher,
    unbound_exchange: str,
) -> None:
    nowhere = unbound_exchange
    await enqueue(pool, "shipped", work_queue, ordering_key="order-7")
    await enqueue(pool, "unroutable", "no.queue", exchange=nowhere, ordering_key="order-7")
    await enqueue(pool, "delivered", work_queue, ordering_key="order-7")
    await enqueue(pool, "other", work_queue)
    relay = OutboxRelay(pool, amqp_url, initial_backoff=60.0)
    assert await relay.relay_once(publisher) == 3
    assert statuses(await rows_by_id(pool)) == {
        "shipped": ("sent", 1),
        "unroutable": ("pending", 1),  # backs off, and holds its key back
        "delivered": ("pending", 0),  # not tried: it would have overtaken the refused row
        "other": ("sent", 1),
    }
    assert await relay.relay_once(publisher) == 0
    assert sorted(await drain(amqp_url, work_queue)) == ["other", "shipped"]


async def test_an_unpublishable_row_mid_run_fails_alone_and_the_run_goes_on(
    amqp_url: str, pool: asyncpg.Pool, work_queue: str, publisher: ConfirmingPublisher
) -> None:
    await enqueue(pool, "shipped", work_queue, ordering_key="order-7")
    await enqueue(pool, LONG_ID, work_queue, ordering_key="order-7")
    await enqueue(pool, "delivered", work_queue, ordering_key="order-7")
    relay = OutboxRelay(pool, amqp_url)
    assert await relay.relay_once(publisher) == 3
    assert statuses(await rows_by_id(pool)) == {
        "shipped": ("sent", 1),
        LONG_ID: ("failed", 1),
        "delivered": ("sent", 1),
    }
    assert await drain(amqp_url, work_queue) == ["shipped", "delivered"]


async def test_a_row_not_due_ends_its_keys_run(
    amqp_url: str, pool: asyncpg.Pool, work_queue: str, publisher: ConfirmingPublisher
) -> None:
    sent = await backlog(pool, "order-7", 4, work_queue)
    # A row that was tried and backed off (it was its key's head until an older row came
    # back to pending, as `outbox retry` does): the rows after it wait with it.
    await pool.execute(
        "UPDATE rabbitretry.outbox SET next_try_at = now() + interval '1 hour'"
        " WHERE message_id = $1",
        sent[2],
    )
    relay = OutboxRelay(pool, amqp_url)
    assert await relay.relay_once(publisher) == 2
    assert [row["status"] for row in (await rows_by_id(pool)).values()] == [
        "sent",
        "sent",
        "pending",
        "pending",
    ]
    assert await drain(amqp_url, work_queue) == sent[:2]


async def poll_buffers(pool: asyncpg.Pool, statement: str, *args: object) -> int:
    """The buffers one run of ``statement`` reads (rolled back: its locks are let go)."""
    async with pool.acquire() as conn, conn.transaction():
        plan = await conn.fetchval(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query(statement), *args
        )
    top = json.loads(plan)[0]["Plan"]
    return int(top["Shared Hit Blocks"] + top["Shared Read Blocks"])


async def test_a_poll_behind_a_keys_backlog_looks_at_a_window_not_at_every_row_of_it(
    amqp_url: str, pool: asyncpg.Pool, work_queue: str, publisher: ConfirmingPublisher
) -> None:
    sent = await backlog(pool, "order-7", 5_000, work_queue)
    await enqueue(pool, "no-key", work_queue)  # due after the whole backlog
    assert await poll_buffers(pool, "outbox_window_heads", 10, None, 40) < 1_000
    assert await poll_buffers(pool, "outbox_take", 10, None) > 10_000
    relay = OutboxRelay(pool, amqp_url, batch_size=10)
    # The window (4 rows a row of the batch) holds the key's head and rows it holds back:
    # the poll takes the key's run, and the row due after the backlog waits its turn.
    assert await relay.relay_once(publisher) == 10
    assert await drain(amqp_url, work_queue) == sent[:10]


async def test_a_window_of_rows_all_held_back_falls_back_to_every_due_row(
    amqp_url: str, pool: asyncpg.Pool, work_queue: str, publisher: ConfirmingPublisher
) -> None:
    await enqueue(pool, "head", work_queue, ordering_key="order-7")
    held = await backlog(pool, "order-7", 10, work_queue)
    # Rows of a transaction that began before the head's (a long one): due before the head,
    # so they fill the window, and all of them wait behind it.
    await pool.execute(
        "UPDATE rabbitretry.outbox SET next_try_at = now() - interval '1 hour'"
        " WHERE message_id <> 'head'"
    )
    await enqueue(pool, "no-key", work_queue)
    relay = OutboxRelay(pool, amqp_url, batch_size=2)  # a window of 8 rows
    assert await relay.relay_once(publisher) == 3  # the head, one row of its run, no-key
    assert sorted(await drain(amqp_url, work_queue)) == sorted(["head", held[0], "no-key"])
