"""What the broker dead-letters behind the ledger's back is recorded by the reconciler.

A quorum work queue with a tiny ``delivery_limit`` lets a raw consumer push a message into
``Q.dead`` without rabbitretry ever seeing it; a reconciler run must record it dead (reason
``dead-lettered-by-broker``), keep it on ``Q.dead``, and change nothing on a second run.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import aio_pika
import asyncpg
import pytest
from pydantic import BaseModel

from rabbitretry import Consumer, Context, Permanent, RetryPolicy, amqp, ledger, topology_of
from rabbitretry.errors import ConnectionLost
from rabbitretry.ledger import MISSING_ID_PREFIX as MISSING_ID
from rabbitretry.ledger.failures import describe
from rabbitretry.message import headers
from rabbitretry.operations import Filter, list_messages
from rabbitretry.reconcile import dead_queue as dead_queue_scan
from rabbitretry.reconcile.dead_queue import REASON
from rabbitretry.reconcile.reconciler import Reconciler
from rabbitretry.topology import declare
from tests.integration.harness import publish, queue_depth, running_worker, wait_for, wait_status

pytestmark = pytest.mark.asyncio


class Job(BaseModel):
    n: int


def quorum_consumer(queue: str, *, delivery_limit: int = 1) -> type[Consumer[Job]]:
    class Limited(Consumer[Job]):
        async def handle(self, msg: Job, ctx: Context) -> None:
            raise Permanent(f"job {msg.n} cannot be done")

    Limited.queue = queue
    Limited.queue_type = "quorum"
    Limited.delivery_limit = delivery_limit
    Limited.retry = RetryPolicy(max_attempts=2, initial_delay=1.0, jitter=0.0)
    return Limited


@pytest.fixture
async def reconcilers(pool: asyncpg.Pool, amqp_url: str) -> AsyncIterator[list[Reconciler]]:
    made: list[Reconciler] = []
    yield made
    for reconciler in made:
        await reconciler.close()


def reconciler_for(
    made: list[Reconciler], pool: asyncpg.Pool, amqp_url: str, consumer: type[Consumer[Any]]
) -> Reconciler:
    reconciler = Reconciler(pool, amqp_url, consumers=[consumer], grace=1.0, batch_size=7)
    made.append(reconciler)
    return reconciler


async def declared(amqp_url: str, consumer: type[Consumer[Any]]) -> None:
    connection = await amqp.connect(amqp_url, name="rabbitretry-tests")
    try:
        await declare(connection, topology_of([consumer]))
    finally:
        await connection.close()


async def nack_until_dead_lettered(amqp_url: str, queue: str) -> int:
    """A raw consumer that requeues everything until the broker's delivery limit takes it."""
    connection = await aio_pika.connect(amqp_url)
    nacks = 0
    try:
        channel = await connection.channel()
        work = await channel.declare_queue(queue, passive=True)
        for _ in range(200):
            message = await work.get(no_ack=False, fail=False)
            if message is None:
                if await queue_depth(amqp_url, queue) == 0:
                    break
                await asyncio.sleep(0.02)
                continue
            await message.nack(requeue=True)
            nacks += 1
    finally:
        await connection.close()
    return nacks


async def peek_all(amqp_url: str, queue: str) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """Every message on ``queue``, read by holding them unacked, then all put back."""
    connection = await aio_pika.connect(amqp_url)
    held = []
    try:
        channel = await connection.channel()
        declared_queue = await channel.declare_queue(queue, passive=True)
        while (message := await declared_queue.get(no_ack=False, fail=False)) is not None:
            held.append(message)
    finally:
        await connection.close()  # returns every unacked message to the queue
    return held


async def ledger_rows(pool: asyncpg.Pool, queue: str) -> dict[str, dict[str, Any]]:
    rows = await pool.fetch(
        "SELECT * FROM rabbitretry.ledger WHERE queue = $1 ORDER BY message_id", queue
    )
    return {row["message_id"]: dict(row) for row in rows}


async def test_a_message_the_broker_dead_lettered_is_recorded_once_and_kept(
    pool: asyncpg.Pool,
    amqp_url: str,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    reconcilers: list[Reconciler],
) -> None:
    consumer = quorum_consumer(queue_name, delivery_limit=1)
    cleanup.append(consumer)
    await declared(amqp_url, consumer)
    dead_queue = f"{queue_name}.dead"

    # The broker's delivery limit: rabbitretry never sees this message.
    await publish(amqp_url, queue_name, {"n": 1}, message_id="order-1", headers={"tenant": "t1"})
    assert await nack_until_dead_lettered(amqp_url, queue_name) >= 1
    # An id-less message with a NUL in a header, put on Q.dead by hand (a shovel, say).
    await publish_without_id_to(amqp_url, dead_queue, b'{"n": 2}', {"note": "a\x00b"})
    await wait_for(lambda: _depth_is(amqp_url, dead_queue, 2))
    assert await ledger_rows(pool, queue_name) == {}

    report = await reconciler_for(reconcilers, pool, amqp_url, consumer).run_once()
    assert report.broker_dead_recorded == 2
    assert not report.errors

    rows = await ledger_rows(pool, queue_name)
    assert len(rows) == 2
    limited = rows["order-1"]
    assert (limited["status"], limited["reason"], limited["error_type"]) == (
        "dead",
        REASON,
        REASON,
    )
    assert limited["attempts"] == 0 and limited["finished_at"] is not None
    assert bytes(limited["payload"]) == b'{"n": 1}'
    stored = ledger.snapshot_of(limited).headers
    assert stored["tenant"] == "t1"
    [death] = stored["x-death"]  # the evidence, kept as it arrived
    assert (death["queue"], death["reason"]) == (queue_name, "delivery_limit")
    assert isinstance(death["time"], datetime)
    assert json.loads(limited["properties"])["content_type"] == "application/json"
    assert "delivery_limit" in limited["error_message"]

    [missing_id] = [key for key in rows if key != "order-1"]
    assert missing_id.startswith(MISSING_ID)
    by_hand = rows[missing_id]
    assert (by_hand["status"], by_hand["reason"]) == ("dead", REASON)
    assert ledger.snapshot_of(by_hand).headers == {"note": "a\x00b"}
    assert "no x-death header" in by_hand["error_message"]

    # The operator's view: dead list, and an alert for each dead letter.
    listed = await list_messages(pool, Filter(queue=queue_name, error=REASON))
    assert sorted(row["message_id"] for row in listed) == sorted(rows)
    alerted = await pool.fetchval(
        "SELECT sum(count) FROM rabbitretry.alert WHERE kind = 'dead' AND queue = $1", queue_name
    )
    assert alerted == 2

    # Q.dead is never drained: both messages are still there, now saying why they are dead,
    # the id-less one under the key the ledger gave it.
    copies = {m.message_id: m for m in await peek_all(amqp_url, dead_queue)}
    assert set(copies) == {"order-1", missing_id}
    for message_id, copy in copies.items():
        assert copy.headers[headers.REASON] == REASON
        assert copy.headers[headers.QUEUE] == queue_name
        assert copy.body == bytes(rows[message_id]["payload"])
    assert copies["order-1"].headers["x-death"][0]["reason"] == "delivery_limit"

    # A second run (another instance, say) finds both recorded and changes nothing.
    again = await reconciler_for(reconcilers, pool, amqp_url, consumer).run_once()
    assert again.broker_dead_recorded == 0 and not again.errors
    assert await ledger_rows(pool, queue_name) == rows
    assert await queue_depth(amqp_url, dead_queue) == 2
    alerted_again = await pool.fetchval(
        "SELECT sum(count) FROM rabbitretry.alert WHERE kind = 'dead' AND queue = $1", queue_name
    )
    assert alerted_again == 2


async def test_a_dead_letter_rabbitretry_recorded_itself_is_left_as_it_is(
    pool: asyncpg.Pool,
    amqp_url: str,
    database_url: str,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    reconcilers: list[Reconciler],
) -> None:
    consumer = quorum_consumer(queue_name, delivery_limit=3)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url):
        await publish(amqp_url, queue_name, {"n": 7}, message_id="job-7")
        await wait_status(pool, queue_name, "job-7", "dead")
        await wait_for(lambda: _depth_is(amqp_url, f"{queue_name}.dead", 1))
    before = await ledger_rows(pool, queue_name)
    assert before["job-7"]["reason"] != REASON
    [copy_before] = await peek_all(amqp_url, f"{queue_name}.dead")

    report = await reconciler_for(reconcilers, pool, amqp_url, consumer).run_once()
    assert report.broker_dead_recorded == 0 and not report.errors
    assert await ledger_rows(pool, queue_name) == before
    [copy_after] = await peek_all(amqp_url, f"{queue_name}.dead")
    assert copy_after.message_id == copy_before.message_id == "job-7"
    assert copy_after.body == copy_before.body
    assert copy_after.headers == copy_before.headers
    assert copy_after.content_type == copy_before.content_type


async def test_a_copy_rabbitretry_made_whose_row_was_pruned_is_not_recorded_again(
    pool: asyncpg.Pool,
    amqp_url: str,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    reconcilers: list[Reconciler],
) -> None:
    """A dead letter replayed, handled and pruned from the ledger leaves its old copy on
    Q.dead: it must not come back as a new dead letter (and be replayed into a second run)."""
    consumer = quorum_consumer(queue_name)
    cleanup.append(consumer)
    await declared(amqp_url, consumer)
    own_copy = headers.dead_letter(
        {}, 2, queue=queue_name, reason="attempts-exhausted", error_type="OSError", error="down"
    )
    await publish(amqp_url, f"{queue_name}.dead", {"n": 3}, message_id="job-3", headers=own_copy)

    report = await reconciler_for(reconcilers, pool, amqp_url, consumer).run_once()
    assert report.broker_dead_recorded == 0 and not report.errors
    assert await ledger_rows(pool, queue_name) == {}
    [copy] = await peek_all(amqp_url, f"{queue_name}.dead")
    assert copy.message_id == "job-3" and copy.headers[headers.REASON] == "attempts-exhausted"


async def test_a_message_still_in_flight_in_the_ledger_is_not_killed(
    pool: asyncpg.Pool,
    amqp_url: str,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    reconcilers: list[Reconciler],
) -> None:
    """A retry copy the broker dead-lettered (requeued during an outage, say): the ledger
    still says ``retrying``, so the reconciler's re-drive, not the broker, decides."""
    consumer = quorum_consumer(queue_name)
    cleanup.append(consumer)
    await declared(amqp_url, consumer)
    key = ledger.Key(queue_name, "job-9")
    snapshot = ledger.Snapshot(b'{"n": 9}', {}, {"content_type": "application/json"}, "", "")
    claim = await ledger.claim(
        pool,
        key,
        max_attempts=2,
        lease_seconds=30,
        worker="w",
        copy_attempts=0,
        snapshot=snapshot,
    )
    assert claim.verdict == "claimed"
    await ledger.schedule_retry(pool, key, 1, 3600.0, describe(queue_name, OSError("down")))
    await publish(amqp_url, f"{queue_name}.dead", {"n": 9}, message_id="job-9")
    before = await ledger_rows(pool, queue_name)

    report = await reconciler_for(reconcilers, pool, amqp_url, consumer).run_once()
    assert report.broker_dead_recorded == 0
    assert await ledger_rows(pool, queue_name) == before
    assert before["job-9"]["status"] == "retrying"
    assert await queue_depth(amqp_url, f"{queue_name}.dead") == 1


async def test_reconcilers_running_at_once_record_each_message_once_and_lose_none(
    pool: asyncpg.Pool,
    amqp_url: str,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    reconcilers: list[Reconciler],
) -> None:
    consumer = quorum_consumer(queue_name)
    cleanup.append(consumer)
    await declared(amqp_url, consumer)
    dead_queue = f"{queue_name}.dead"
    for n in range(30):
        await publish(amqp_url, dead_queue, {"n": n}, message_id=f"job-{n}")

    reports = await asyncio.gather(
        *(reconciler_for(reconcilers, pool, amqp_url, consumer).run_once() for _ in range(3))
    )
    assert sum(r.broker_dead_recorded for r in reports) == 30
    assert len(await ledger_rows(pool, queue_name)) == 30
    assert sorted(m.message_id for m in await peek_all(amqp_url, dead_queue)) == sorted(
        f"job-{n}" for n in range(30)
    )


async def _depth_is(amqp_url: str, queue: str, depth: int) -> bool:
    return await queue_depth(amqp_url, queue) == depth


async def publish_without_id_to(
    amqp_url: str, queue: str, body: bytes, header_values: dict[str, Any]
) -> None:
    """Publish with no message_id (aiormq always invents one, so pika), with headers."""
    import pika

    def send() -> None:
        connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
        try:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.basic_publish(
                "", queue, body, pika.BasicProperties(delivery_mode=2, headers=header_values)
            )
        finally:
            connection.close()

    await asyncio.to_thread(send)


async def test_an_id_less_dead_letter_whose_scan_lost_its_connection_is_recorded_once(
    pool: asyncpg.Pool,
    amqp_url: str,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    reconcilers: list[Reconciler],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two identical messages without an id on ``Q.dead``: the first scan records them (two
    records, not one) and loses its connection before putting them back; the broker returns
    them, and the next scan finds both recorded: still two records, not four."""
    consumer = quorum_consumer(queue_name)
    cleanup.append(consumer)
    await declared(amqp_url, consumer)
    dead_queue = f"{queue_name}.dead"
    for _ in range(2):
        await publish_without_id_to(amqp_url, dead_queue, b'{"n": 2}', {"note": "twin"})
    await wait_for(lambda: _depth_is(amqp_url, dead_queue, 2))

    async def connection_lost(*args: Any, **kwargs: Any) -> bool:
        raise ConnectionLost("the connection was lost before the copies went back")

    monkeypatch.setattr(dead_queue_scan, "_rotate", connection_lost)
    first = await reconciler_for(reconcilers, pool, amqp_url, consumer).run_once()
    assert first.failed_steps == ["dead-letter queues"]
    assert len(await ledger_rows(pool, queue_name)) == 2
    monkeypatch.undo()
    await wait_for(lambda: _depth_is(amqp_url, dead_queue, 2))  # back, unacked

    second = await reconciler_for(reconcilers, pool, amqp_url, consumer).run_once()
    assert (second.broker_dead_recorded, second.errors) == (0, [])
    rows = await ledger_rows(pool, queue_name)
    assert len(rows) == 2 and all(key.startswith(MISSING_ID) for key in rows)
    assert all(bytes(row["payload"]) == b'{"n": 2}' for row in rows.values())
    assert await queue_depth(amqp_url, dead_queue) == 2  # rotated, never drained
