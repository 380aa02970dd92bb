"""Every death is logged once, at ERROR, with its key and reason: one real worker, one message
down each road to ``dead``, and second copies of some of them that must not log again."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg
import pytest

from rabbitretry import Consumer, Context, Permanent, RetryPolicy, UnpublishableError
from rabbitretry.amqp import ConfirmingPublisher
from rabbitretry.ledger import AttemptLedger, ClaimRequest, Key, Snapshot
from rabbitretry.ledger.failures import rejection
from rabbitretry.topology import delays
from tests.integration.harness import (
    publish,
    publish_without_id,
    running_worker,
    wait_for,
)
from tests.integration.test_hostile import healthy_messages_succeed, nothing_left_on, publish_raw
from tests.integration.test_pipeline import Job, make_consumer

pytestmark = pytest.mark.asyncio

POLICY = RetryPolicy(max_attempts=2, initial_delay=0.2, max_delay=1.0, jitter=0.0)
ROADS = {
    "invalid": "invalid-payload",
    "permanent": "permanent-error",
    "exhausted": "attempts-exhausted",
    "crashed": "crashed",
    "big": "too-large",
    "missing-id:*": "missing-message-id",
    "unstorable-id:m\\x00id": "unstorable",
    "unpublishable": "unpublishable",
}


async def handler(msg: Job, ctx: Context) -> None:
    if ctx.message_id == "permanent":
        raise Permanent("never")
    if ctx.message_id in ("exhausted", "unpublishable"):
        raise ValueError("always fails")


async def phantom_last_attempt(pool: asyncpg.Pool, queue: str, message_id: str) -> None:
    """Leave ``message_id`` as a worker that died in its last allowed attempt would."""
    ledger = AttemptLedger(pool)
    snapshot = Snapshot(b'{"n": 1}', {}, {}, "", queue)

    def request(lease: float) -> ClaimRequest:
        return ClaimRequest(
            Key(queue, message_id), POLICY.max_attempts, lease, "gone:0", 0, snapshot
        )

    first = await ledger.claim(request(30))
    await ledger.schedule_retry(
        Key(queue, message_id), first.attempt, 0, rejection(queue, "X", "x")
    )
    last = await ledger.claim(request(0.1))
    assert (last.verdict, last.attempt) == ("claimed", POLICY.max_attempts)
    assert await ledger.mark_started(Key(queue, message_id), last.attempt)  # its handler ran
    await asyncio.sleep(0.3)  # the lease runs out: the worker is gone


async def test_every_road_to_dead_logs_one_error_line(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_publish = ConfirmingPublisher.publish

    async def publish_refusing(self: ConfirmingPublisher, body: bytes, **options: Any) -> None:
        # The one road a test cannot reach with a real message: a retry copy AMQP refuses.
        to_chain = options.get("exchange", "").startswith(delays.PREFIX)
        if options["message_id"] == "unpublishable" and to_chain:
            raise UnpublishableError("header 'x' is not one AMQP can carry")
        await real_publish(self, body, **options)

    monkeypatch.setattr(ConfirmingPublisher, "publish", publish_refusing)
    consumer = make_consumer(queue_name, handler, policy=POLICY, max_body_bytes=1000)
    cleanup.append(consumer)
    caplog.set_level(logging.DEBUG, logger="rabbitretry")
    await phantom_last_attempt(pool, queue_name, "crashed")
    async with running_worker([consumer], amqp_url, database_url) as worker:
        await publish(amqp_url, queue_name, b'{"n": "x"}', message_id="invalid", times=2)
        await publish(amqp_url, queue_name, {"n": 2}, message_id="permanent")
        await publish(amqp_url, queue_name, {"n": 3}, message_id="exhausted")
        await publish(amqp_url, queue_name, {"n": 1}, message_id="crashed", times=2)
        await publish(amqp_url, queue_name, b" " * 2000, message_id="big", times=2)
        await publish_without_id(amqp_url, queue_name, b'{"n": 1}')
        await publish_raw(amqp_url, queue_name, b'{"n": 1}', message_id="m\x00id")
        await publish(amqp_url, queue_name, {"n": 3}, message_id="unpublishable")

        async def all_dead() -> list[asyncpg.Record] | None:
            rows = await pool.fetch(
                "SELECT message_id, reason FROM rabbitretry.ledger WHERE queue = $1 "
                "AND status = 'dead'",
                queue_name,
            )
            return rows if len(rows) == len(ROADS) else None

        rows = await wait_for(all_dead, timeout=30)
        await healthy_messages_succeed(amqp_url, pool, queue_name)
        await nothing_left_on(amqp_url, queue_name)

    dead = {row["message_id"]: row["reason"] for row in rows}
    for key in ROADS:
        if key.endswith("*"):
            (found,) = [k for k in dead if k.startswith(key[:-1])]
            dead[key] = dead.pop(found)
    assert dead == ROADS
    # A second copy refused for its size is dropped, not a second death (metrics count once).
    big = [o.result for o in worker.outcomes if o.key is not None and o.key.message_id == "big"]
    assert sorted(big) == ["dead", "dropped"]

    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    logged = {(r.__dict__.get("message_id", ""), r.__dict__.get("reason")) for r in errors}
    assert len(errors) == len(ROADS), [r.getMessage() for r in errors]
    for record in errors:
        # The same shape on every road: ERROR, outcome and reason as fields, and the text says
        # "QUEUE/KEY: dead (REASON)".
        fields = record.__dict__
        assert (record.levelno, fields["outcome"], fields["queue"]) == (
            logging.ERROR,
            "dead",
            queue_name,
        )
        assert "worker" in fields
        assert f": dead ({fields['reason']})" in record.getMessage()
        assert f"{queue_name}/" in record.getMessage()
    for key, reason in ROADS.items():
        if key.endswith("*"):
            assert [r for (k, r) in logged if k.startswith(key[:-1])] == [reason]
        else:
            assert (key, reason) in logged
