"""Alerts against the real ledger, broker and a local webhook receiver."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from pydantic import BaseModel

from rabbitretry import (
    Consumer,
    Context,
    Permanent,
    RetryPolicy,
)
from rabbitretry.ledger import retention
from rabbitretry.monitoring import alerts, heartbeat, levels
from tests.integration.conftest import BrokerCleanup
from tests.integration.harness import (
    publish,
    publish_without_id,
    running_worker,
    wait_for,
    wait_status,
)
from tests.webhook import WebhookReceiver


class Order(BaseModel):
    n: int


def failing_consumer(queue: str) -> type[Consumer[Order]]:
    class Missing(Consumer[Order]):
        async def handle(self, msg: Order, ctx: Context) -> None:
            raise Permanent(f"order {msg.n} not found")

    Missing.queue = queue
    Missing.retry = RetryPolicy(max_attempts=1, jitter=0.0)
    return Missing


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    hook = await WebhookReceiver().start()
    yield hook
    await hook.close()


async def alert_rows(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    return await pool.fetch("SELECT * FROM rabbitretry.alert ORDER BY id")


async def test_dead_letters_of_one_error_make_one_alert_delivered_after_the_webhook_recovers(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    receiver: WebhookReceiver,
) -> None:
    consumer = failing_consumer(queue_name)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url):
        for n in range(3):
            await publish(amqp_url, queue_name, {"n": n}, message_id=f"order-{n}")
        for n in range(3):
            await wait_status(pool, queue_name, f"order-{n}", "dead")

    (alert,) = await alert_rows(pool)
    assert alert["kind"] == "dead" and alert["status"] == "open" and alert["count"] == 3
    assert sorted(alert["sample_keys"]) == ["order-0", "order-1", "order-2"]
    assert alert["queue"] == queue_name and alert["error_type"] == "Permanent"

    receiver.fail_first = 2
    deliverer = alerts.AlertDeliverer(pool, receiver.url, window=0, retry_base=0.2)
    first = await deliverer.round()
    assert (first.sent, first.failed) == (0, 1)
    (refused,) = await alert_rows(pool)
    assert refused["status"] == "pending" and refused["last_error"] == "HTTP 503 Refused"

    runner = asyncio.create_task(deliverer.run(interval=0.05))
    try:
        await wait_for(lambda: _delivered(receiver), timeout=20)
    finally:
        deliverer.stop()
        await runner
    (sent,) = await alert_rows(pool)
    assert sent["status"] == "sent" and sent["tries"] == 3 and sent["last_error"] is None
    (body,) = receiver.accepted
    assert body["id"] == sent["id"] and body["count"] == 3 and body["kind"] == "dead"
    assert body["text"] == f"3 messages dead on {queue_name}: Permanent"
    assert re.fullmatch(r"order \d not found", body["error_message"])


async def _delivered(receiver: WebhookReceiver) -> bool:
    return bool(receiver.accepted)


async def test_a_death_after_the_alert_was_taken_opens_a_new_alert(
    pool: asyncpg.Pool, receiver: WebhookReceiver
) -> None:
    await _dead_row(pool, "q", "a", "fp1")
    await alerts.deliver_due(pool, receiver.url, window=0)
    await _dead_row(pool, "q", "b", "fp1")
    await _dead_row(pool, "q", "c", "fp2")
    rows = await alert_rows(pool)
    assert [(r["group_key"], r["status"], r["count"]) for r in rows] == [
        ("fp1", "sent", 1),
        ("fp1", "open", 1),
        ("fp2", "open", 1),
    ]


async def test_a_window_holds_the_alert_until_it_closes(
    pool: asyncpg.Pool, receiver: WebhookReceiver
) -> None:
    await _dead_row(pool, "q", "a", "fp1")
    held = await alerts.deliver_due(pool, receiver.url, window=3600)
    assert (held.sent, held.failed) == (0, 0) and receiver.requests == 0


async def test_several_deliverers_send_each_alert_once(
    pool: asyncpg.Pool, receiver: WebhookReceiver
) -> None:
    for i in range(20):
        await _dead_row(pool, "q", f"m{i}", f"fp{i}")
    rounds = await asyncio.gather(
        *(alerts.deliver_due(pool, receiver.url, window=0, batch_size=5) for _ in range(4))
    )
    while sum(r.sent for r in rounds) < 20:
        rounds.append(await alerts.deliver_due(pool, receiver.url, window=0))
    ids = [body["id"] for body in receiver.accepted]
    assert len(ids) == 20 and len(set(ids)) == 20


async def test_stale_and_failing_heartbeats_alert_once_per_repeat_window(
    pool: asyncpg.Pool, receiver: WebhookReceiver
) -> None:
    for name in ("reconciler", alerts.HEARTBEAT_NAME):  # the deliverer's own is not judged
        await heartbeat.started(pool, name, "host:1", expected_every=1)
        await heartbeat.finished(pool, name)
    await pool.execute("UPDATE rabbitretry.heartbeat SET finished_at = now() - interval '1 minute'")
    await heartbeat.started(pool, "nightly", "host:2", expected_every=3600)
    await heartbeat.finished(pool, "nightly", error="ConnectionError: refused")

    assert await alerts.check_heartbeats(pool, repeat=3600) == 2
    assert await alerts.check_heartbeats(pool, repeat=3600) == 0
    stats = await alerts.deliver_due(pool, receiver.url)
    assert stats.sent == 2
    texts = sorted(body["text"] for body in receiver.accepted)
    assert texts[0] == "nightly heartbeat: failing: ConnectionError: refused"
    assert texts[1].startswith("reconciler heartbeat: stale for")


async def test_backlog_over_the_threshold_alerts(
    amqp_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    amqp_connection: Any,
    broker_cleanup: BrokerCleanup,
    receiver: WebhookReceiver,
) -> None:
    broker_cleanup.queue(queue_name)
    channel = await amqp_connection.channel()
    await channel.declare_queue(queue_name, durable=True)
    await publish(amqp_url, queue_name, {"n": 1}, message_id="m", times=3)
    depths = await levels.queue_depths(amqp_url, [queue_name, f"{queue_name}-missing"])
    assert depths == {queue_name: 3, f"{queue_name}-missing": None}

    assert await alerts.check_backlog(pool, depths, threshold=4) == 0
    assert await alerts.check_backlog(pool, depths, threshold=3) == 1
    await alerts.deliver_due(pool, receiver.url)
    (body,) = receiver.accepted
    assert body["kind"] == "backlog" and body["queue"] == queue_name
    assert body["detail"] == {"depth": 3, "threshold": 3}


async def test_backlog_is_unknown_when_the_broker_is_unreachable() -> None:
    depths = await levels.queue_depths("amqp://guest:guest@127.0.0.1:1/", ["q"])
    assert depths == {"q": None}


async def _dead_row(pool: asyncpg.Pool, queue: str, message_id: str, fingerprint: str) -> None:
    await pool.execute(
        "INSERT INTO rabbitretry.ledger (queue, message_id, status, max_attempts, payload,"
        " error_type, error_message, error_fingerprint, finished_at)"
        " VALUES ($1, $2, 'dead', 1, '\\x'::bytea, 'KeyError', 'boom', $3, now())",
        queue,
        message_id,
        fingerprint,
    )


async def test_every_transition_to_dead_counts_once(pool: asyncpg.Pool) -> None:
    await _dead_row(pool, "q", "a", "fp")
    # another write to a row that is already dead is no new death
    await pool.execute("UPDATE rabbitretry.ledger SET status = 'dead', updated_at = now()")
    # a replayed message that dies again is
    await pool.execute("UPDATE rabbitretry.ledger SET status = 'retrying', next_retry_at = now()")
    await pool.execute("UPDATE rabbitretry.ledger SET status = 'dead', next_retry_at = NULL")
    (alert,) = await alert_rows(pool)
    assert alert["count"] == 2 and alert["sample_keys"] == ["a"]


async def test_a_message_without_id_is_alerted(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    consumer = failing_consumer(queue_name)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url):
        await publish_without_id(amqp_url, queue_name, b'{"n": 1}')
        await wait_for(lambda: _alerted(pool), timeout=20)
    (alert,) = await alert_rows(pool)
    assert alert["error_type"] == "missing-message-id" and alert["queue"] == queue_name


async def _alerted(pool: asyncpg.Pool) -> bool:
    return bool(await alert_rows(pool))


async def test_prune_removes_only_old_sent_alerts(
    pool: asyncpg.Pool, receiver: WebhookReceiver
) -> None:
    await _dead_row(pool, "q", "a", "old")
    await alerts.deliver_due(pool, receiver.url, window=0)
    await _dead_row(pool, "q", "b", "fresh")
    await pool.execute("UPDATE rabbitretry.alert SET sent_at = now() - interval '40 days'")
    pruned = await retention.prune(pool, datetime.now(UTC) - timedelta(days=30))
    assert pruned.alerts == 1
    (kept,) = await alert_rows(pool)
    assert kept["group_key"] == "fresh" and kept["status"] == "open"
