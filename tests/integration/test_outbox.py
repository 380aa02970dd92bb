"""The outbox and its relay, and the Publisher, against the real broker and database."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import asyncpg
import pytest

from examples import shop
from rabbitretry import Consumer, UnroutableError, topology_of
from rabbitretry.amqp import ConfirmingPublisher, Connection
from rabbitretry.db import query
from rabbitretry.outbox import Outbox, OutboxRelay, ScanFloor
from rabbitretry.publisher import Publisher
from rabbitretry.topology import Binding, declare
from tests.integration.conftest import BrokerCleanup
from tests.integration.harness import queue_depth, running_worker, wait_for
from tests.proxy import Proxy

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def shop_db(pool: asyncpg.Pool) -> asyncpg.Pool:
    await pool.execute(shop.SCHEMA)
    return pool


@pytest.fixture
async def shop_consumer(queue_name: str, broker_cleanup: BrokerCleanup) -> type[Consumer[Any]]:
    """AwardOrderPoints on a queue of this test's own, bound to a test-only exchange."""
    exchange = f"{queue_name}.shop"

    class Award(shop.AwardOrderPoints):
        queue = queue_name
        bindings = [Binding(exchange=exchange, routing_key="order.paid")]

    broker_cleanup.topology(topology_of([Award]))
    return Award


def exchange_of(consumer: type[Consumer[Any]]) -> str:
    return consumer.bindings[0].exchange


async def pay(pool: asyncpg.Pool, exchange: str, order_id: str, user_id: int, amount: int) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await shop.place_order(conn, order_id, user_id, amount)
        order = await conn.fetchrow(
            "UPDATE shop_order SET paid = true WHERE id = $1 RETURNING *", order_id
        )
        assert order is not None
        await Outbox().enqueue(
            conn,
            exchange,
            shop.OrderPaid(order_id=order_id, user_id=user_id, points=amount // 10),
            routing_key="order.paid",
            message_id=f"order-{order_id}-paid",
        )


async def outbox_counts(pool: asyncpg.Pool) -> dict[str, int]:
    rows = await pool.fetch("SELECT status, count(*) AS n FROM rabbitretry.outbox GROUP BY status")
    return {row["status"]: row["n"] for row in rows}


@contextlib.asynccontextmanager
async def running_relay(
    pool: asyncpg.Pool, amqp_url: str, **options: Any
) -> AsyncIterator[OutboxRelay]:
    relay = OutboxRelay(pool, amqp_url, **options)
    task = asyncio.create_task(relay.run())
    try:
        await wait_for(lambda: _ready(relay, task), timeout=15)
        yield relay
    finally:
        relay.stop()
        await asyncio.wait_for(task, 30)


async def points_total(pool: asyncpg.Pool) -> int:
    return int(await pool.fetchval("SELECT coalesce(sum(points), 0) FROM shop_points_flow"))


async def test_paid_orders_award_points_once_end_to_end(
    amqp_url: str,
    database_url: str,
    shop_db: asyncpg.Pool,
    shop_consumer: type[Consumer[Any]],
) -> None:
    async with running_worker([shop_consumer], amqp_url, database_url, concurrency=2):
        for n in range(10):
            await pay(shop_db, exchange_of(shop_consumer), f"o{n}", user_id=n % 3, amount=100)
        async with running_relay(shop_db, amqp_url):
            await wait_for(lambda: _eq(points_total(shop_db), 100))
    assert await outbox_counts(shop_db) == {"sent": 10}
    totals = {
        r["user_id"]: r["total"] for r in await shop_db.fetch("SELECT * FROM shop_user_points")
    }
    assert totals == {0: 40, 1: 30, 2: 30}


async def test_rolled_back_business_transaction_publishes_nothing(
    amqp_url: str,
    shop_db: asyncpg.Pool,
    shop_consumer: type[Consumer[Any]],
    publisher: ConfirmingPublisher,
    amqp_connection: Connection,
) -> None:
    await declare(amqp_connection, topology_of([shop_consumer]))
    with pytest.raises(RuntimeError, match="card declined"):
        async with shop_db.acquire() as conn, conn.transaction():
            await shop.place_order(conn, "o-rb", 1, 100)
            await Outbox().enqueue(
                conn, exchange_of(shop_consumer), {"order_id": "o-rb"}, message_id="rb"
            )
            raise RuntimeError("card declined")
    async with running_relay(shop_db, amqp_url) as relay:
        assert await relay.relay_once(publisher) == 0
    assert await outbox_counts(shop_db) == {}
    assert await queue_depth(amqp_url, shop_consumer.queue) == 0


async def test_broker_outage_holds_messages_until_it_returns(
    amqp_url: str,
    database_url: str,
    shop_db: asyncpg.Pool,
    shop_consumer: type[Consumer[Any]],
    broker_proxy: Proxy,
) -> None:
    proxy = broker_proxy
    exchange = exchange_of(shop_consumer)
    async with (
        running_worker([shop_consumer], amqp_url, database_url),
        running_relay(shop_db, proxy.url_for(amqp_url), poll_interval=0.2),
    ):
        await proxy.cut(refuse=True)  # the relay's broker is gone
        for n in range(20):
            await pay(shop_db, exchange, f"out{n}", user_id=1, amount=10)
        await asyncio.sleep(1.0)  # the relay tries and fails while the broker is away
        assert (await outbox_counts(shop_db)).get("pending") == 20
        assert await points_total(shop_db) == 0
        proxy.restore()
        await wait_for(lambda: _eq(points_total(shop_db), 20), timeout=40)
    counts = await outbox_counts(shop_db)
    assert counts == {"sent": 20}
    tries = await shop_db.fetchval("SELECT max(tries) FROM rabbitretry.outbox")
    assert tries == 1  # the outage did not use up the rows' tries


async def test_relay_dying_after_publish_duplicate_is_dropped_by_the_ledger(
    amqp_url: str,
    database_url: str,
    shop_db: asyncpg.Pool,
    shop_consumer: type[Consumer[Any]],
    publisher: ConfirmingPublisher,
) -> None:
    """A relay killed between the broker's confirm and its `sent` mark leaves the row pending
    with the message already on the broker. The next relay publishes it again."""
    exchange = exchange_of(shop_consumer)
    await pay(shop_db, exchange, "dup", user_id=5, amount=500)
    row = await shop_db.fetchrow("SELECT * FROM rabbitretry.outbox")
    async with running_worker([shop_consumer], amqp_url, database_url) as worker:
        # What the dead relay had already done: the message is on the broker, the row pending.
        await publisher.publish(
            bytes(row["payload"]),
            exchange=exchange,
            routing_key="order.paid",
            message_id=row["message_id"],
            properties={"content_type": "application/json"},
        )
        async with running_relay(shop_db, amqp_url):
            await wait_for(lambda: _eq(outbox_counts(shop_db), {"sent": 1}))

            async def duplicate_dropped() -> bool:
                return [o.result for o in worker.outcomes].count("dropped") == 1

            await wait_for(duplicate_dropped, timeout=20)
    assert await points_total(shop_db) == 50
    assert await shop_db.fetchval("SELECT count(*) FROM shop_points_flow") == 1


async def test_unroutable_destination_raises_and_fails_the_row(
    amqp_url: str,
    shop_db: asyncpg.Pool,
    publisher: ConfirmingPublisher,
    unbound_exchange: str,
) -> None:
    exchange = unbound_exchange
    async with Publisher(amqp_url) as public:
        with pytest.raises(UnroutableError, match="no queue is bound"):
            await public.publish(exchange, {"x": 1}, routing_key="no.such.key", message_id="x-1")
    async with shop_db.acquire() as conn:
        await Outbox().enqueue(conn, exchange, {"x": 1}, routing_key="no.such.key")
    relay = OutboxRelay(shop_db, amqp_url, max_tries=2, initial_backoff=0.05)
    await relay.relay_once(publisher)
    await asyncio.sleep(0.15)  # past the first backoff
    await relay.relay_once(publisher)
    row = await shop_db.fetchrow("SELECT status, tries, last_error FROM rabbitretry.outbox")
    assert row is not None
    assert (row["status"], row["tries"]) == ("failed", 2)
    assert "no queue is bound" in row["last_error"]


async def test_two_relays_publish_each_row_once_and_keep_per_key_order(
    amqp_url: str,
    shop_db: asyncpg.Pool,
    work_queue: str,
) -> None:
    async with shop_db.acquire() as conn:
        for n in range(60):
            await Outbox().enqueue(
                conn,
                "",
                {"key": f"k{n % 3}", "seq": n},
                routing_key=work_queue,
                message_id=f"m{n}",
                ordering_key=f"k{n % 3}",
            )
    async with (
        running_relay(shop_db, amqp_url, batch_size=7),
        running_relay(shop_db, amqp_url, batch_size=5),
    ):
        await wait_for(lambda: _eq(outbox_counts(shop_db), {"sent": 60}), timeout=30)
    bodies = await _drain(amqp_url, work_queue)
    assert sorted(b["seq"] for b in bodies) == list(range(60))  # each row exactly once
    for key in ("k0", "k1", "k2"):
        sequence = [b["seq"] for b in bodies if b["key"] == key]
        assert sequence == sorted(sequence), f"{key} out of order: {sequence}"


async def test_a_poll_walks_the_rows_sent_lately_not_all_those_sent_since_the_last_vacuum(
    amqp_url: str,
    pool: asyncpg.Pool,
    work_queue: str,
) -> None:
    # 20,000 rows sent an hour ago (an outbox keeps its sent rows for weeks; autovacuum comes
    # after days).
    await sent_not_vacuumed(pool, 20_000, work_queue)
    async with pool.acquire() as conn:
        for n in range(5):
            await Outbox().enqueue(conn, "", {"n": n}, routing_key=work_queue, message_id=f"m{n}")
    async with running_relay(pool, amqp_url) as relay:
        await wait_for(lambda: _eq(outbox_counts(pool), {"sent": 20005}), timeout=30)
    assert relay.scan.floor is not None
    # The pages of that index the relay's next poll reads, and a poll from the oldest entry.
    assert await pages_read(pool, relay.scan.floor) < 10
    assert await pages_read(pool, None) > 50


async def test_a_row_committed_below_the_floor_waits_for_a_scan_of_every_row(
    amqp_url: str,
    pool: asyncpg.Pool,
    work_queue: str,
) -> None:
    scan = ScanFloor(full_scan_every=3600)
    async with running_relay(pool, amqp_url, scan=scan):
        async with pool.acquire() as conn:
            await Outbox().enqueue(conn, "", {"n": "first"}, routing_key=work_queue)
        await wait_for(lambda: _eq(outbox_counts(pool), {"sent": 1}), timeout=15)
        # A row whose transaction began an hour before it committed: due first, but before
        # the floor, so the polls that follow pass it over.
        due = await pool.fetchval(
            "INSERT INTO rabbitretry.outbox (exchange, routing_key, message_id, payload,"
            " next_try_at) VALUES ('', $1, 'late', '{\"n\": \"late\"}',"
            " now() - interval '1 hour') RETURNING next_try_at",
            work_queue,
        )
        assert scan.floor is not None and due < scan.floor
        async with pool.acquire() as conn:
            await Outbox().enqueue(conn, "", {"n": "after"}, routing_key=work_queue)
        await wait_for(lambda: _eq(outbox_counts(pool), {"sent": 2, "pending": 1}), timeout=15)
    # A relay's first poll (and every full_scan_every seconds, one) scans every pending row.
    async with running_relay(pool, amqp_url):
        await wait_for(lambda: _eq(outbox_counts(pool), {"sent": 3}), timeout=15)
    bodies = await _drain(amqp_url, work_queue)
    assert [b["n"] for b in bodies] == ["first", "after", "late"]


async def test_a_row_due_at_minus_infinity_is_relayed_and_the_relay_goes_on(
    amqp_url: str, pool: asyncpg.Pool, work_queue: str
) -> None:
    # Written by hand: the relay reads its due time as a naive datetime.min.
    await pool.execute(
        "INSERT INTO rabbitretry.outbox (exchange, routing_key, message_id, payload,"
        " next_try_at) VALUES ('', $1, 'ancient', '{\"n\": \"ancient\"}', '-infinity')",
        work_queue,
    )
    async with pool.acquire() as conn:
        await Outbox().enqueue(conn, "", {"n": "now"}, routing_key=work_queue)
    async with running_relay(pool, amqp_url):
        await wait_for(lambda: _eq(outbox_counts(pool), {"sent": 2}), timeout=15)
    assert sorted(b["n"] for b in await _drain(amqp_url, work_queue)) == ["ancient", "now"]


async def test_the_pending_rows_of_a_key_with_many_rows_sent_are_held_back_cheaply(
    pool: asyncpg.Pool,
) -> None:
    # One ordering key: 10,000 rows sent, whose index entries no vacuum has removed yet, and
    # 50 pending. Each pending row asks whether an older row of its key is still pending;
    # walking the sent rows' entries from the oldest for each of them read 2,100 pages a poll.
    await sent_not_vacuumed(pool, 10_000, "q", ordering_key="hot")
    await pool.execute(
        "INSERT INTO rabbitretry.outbox (exchange, routing_key, message_id, ordering_key,"
        " payload) SELECT '', 'q', 'pending-' || n, 'hot', '{}' FROM generate_series(1, 50) n"
    )
    await pages_read(pool, None)  # the first poll marks the sent rows' entries dead
    assert await pages_read(pool, None) < 600  # 230 or so


async def test_a_database_outage_is_said_once_and_its_end_once(
    amqp_url: str,
    database_url: str,
    database_proxy: Proxy,
    pool: asyncpg.Pool,
    work_queue: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="rabbitretry.outbox")
    proxied = await asyncpg.create_pool(database_proxy.url_for(database_url), min_size=1)
    try:
        async with running_relay(proxied, amqp_url, poll_interval=0.05) as relay:
            await database_proxy.cut(refuse=True)
            await wait_for(lambda: _said(caplog, "the database is unreachable"), timeout=15)
            await asyncio.sleep(0.5)  # ten polls or so meet the outage
            database_proxy.restore()
            async with pool.acquire() as conn:
                await Outbox().enqueue(conn, "", {"n": 1}, routing_key=work_queue)
            await wait_for(lambda: _eq(outbox_counts(pool), {"sent": 1}), timeout=15)
            assert relay.stats.sent == 1
    finally:
        await proxied.close()
    said = [r for r in caplog.records if r.name == "rabbitretry.outbox" and r.levelno > 10]
    assert [(r.levelname, r.getMessage().partition(" (")[0]) for r in said] == [
        ("ERROR", "outbox relay: the database is unreachable"),
        ("INFO", "outbox relay: the database answers again"),
    ]


async def _said(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in record.getMessage() for record in caplog.records)


async def sent_not_vacuumed(
    pool: asyncpg.Pool, rows: int, routing_key: str, ordering_key: str | None = None
) -> None:
    """``rows`` outbox rows, due an hour ago and sent, whose entries in the indexes of pending
    rows no vacuum has removed (autovacuum is off for the table from then on)."""
    await pool.execute("ALTER TABLE rabbitretry.outbox SET (autovacuum_enabled = false)")
    await pool.execute(
        "INSERT INTO rabbitretry.outbox (exchange, routing_key, message_id, ordering_key,"
        " payload, next_try_at) SELECT '', $1, 'sent-' || n, $2, '{}',"
        " now() - interval '1 hour' + n * interval '1 ms' FROM generate_series(1, $3) AS n",
        routing_key,
        ordering_key,
        rows,
    )
    await pool.execute("UPDATE rabbitretry.outbox SET status = 'sent', sent_at = now()")


async def pages_read(pool: asyncpg.Pool, start: Any) -> int:
    """Buffers the relay's poll reads, starting at ``start`` (None: at the oldest row)."""
    async with pool.acquire() as conn:
        poll = conn.transaction()
        await poll.start()
        try:
            explained = await conn.fetchval(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query("outbox_take"), 100, start
            )
        finally:
            await poll.rollback()  # whatever it locked
    plan = (json.loads(explained) if isinstance(explained, str) else explained)[0]["Plan"]
    return int(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"])


async def _ready(relay: OutboxRelay, task: asyncio.Task[None]) -> bool:
    if task.done():
        task.result()  # re-raises why the relay could not start
    return relay.ready


async def _eq(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


async def _drain(amqp_url: str, queue: str) -> list[dict[str, Any]]:
    connection = await aio_pika.connect(amqp_url)
    bodies = []
    try:
        channel = await connection.channel()
        source = await channel.declare_queue(queue, passive=True)
        while (message := await source.get(fail=False)) is not None:
            bodies.append(json.loads(message.body))
            await message.ack()
    finally:
        await connection.close()
    return bodies
