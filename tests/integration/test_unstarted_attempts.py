"""An attempt counts only if its handler started.

A claim commits before its handler runs. If the worker dies, or loses the claim's reply with its
connection, before the handler starts, the lapsed claim is given back when the message is
claimed again, never charged as ``crashed``: with ``max_attempts=1`` such a message must still
run its handler. An attempt whose handler did start still counts (the crash-loop guard).
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import asyncpg
import pytest
from pydantic import BaseModel

from rabbitretry import Consumer, Context, RetryPolicy, db
from rabbitretry.delivery import outage
from rabbitretry.ledger import AttemptLedger, ClaimRequest, Key, Snapshot
from tests.integration.harness import publish, running_worker, wait_for, wait_status
from tests.proxy import Proxy

pytestmark = pytest.mark.asyncio

LEASE = 1.0


class Item(BaseModel):
    n: int


def one_attempt_consumer(queue: str) -> type[Consumer[Item]]:
    class OneAttempt(Consumer[Item]):
        retry = RetryPolicy(max_attempts=1)
        lease = LEASE
        runs: ClassVar[list[str]] = []

        async def handle(self, msg: Item, ctx: Context) -> None:
            self.runs.append(ctx.message_id)

    OneAttempt.queue = queue
    return OneAttempt


async def attempt_log(pool: asyncpg.Pool, queue: str, message_id: str) -> list[tuple[Any, ...]]:
    rows = await pool.fetch(
        "SELECT outcome, error_type FROM rabbitretry.attempt_history"
        " WHERE queue = $1 AND message_id = $2 ORDER BY attempt",
        queue,
        message_id,
    )
    return [(r["outcome"], r["error_type"]) for r in rows]


async def lapsed_claim(pool: asyncpg.Pool, queue: str, message_id: str, *, started: bool) -> None:
    """The state a worker leaves when it dies after its claim committed: before the handler
    started (no start mark), or inside it. Its lease has run out."""
    ledger = AttemptLedger(pool)
    snapshot = Snapshot(b'{"n": 1}', {}, {"message_id": message_id}, "", queue)
    key = Key(queue, message_id)
    claim = await ledger.claim(ClaimRequest(key, 1, LEASE, "gone-worker", 0, snapshot))
    assert claim.verdict == "claimed", claim
    if started:
        assert await ledger.mark_started(key, claim.attempt)
    await asyncio.sleep(LEASE + 0.2)


async def test_a_claim_whose_handler_never_started_is_not_charged(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    consumer = one_attempt_consumer(queue_name)
    cleanup.append(consumer)
    await lapsed_claim(pool, queue_name, "m1", started=False)
    async with running_worker([consumer], amqp_url, database_url):
        await publish(amqp_url, queue_name, {"n": 1}, message_id="m1")
        await wait_status(pool, queue_name, "m1", "succeeded", timeout=20)
    assert consumer.runs == ["m1"]
    assert await attempt_log(pool, queue_name, "m1") == [
        ("interrupted", "NotStarted"),
        ("succeeded", None),
    ]


async def test_an_attempt_whose_handler_started_still_counts(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    consumer = one_attempt_consumer(queue_name)
    cleanup.append(consumer)
    await lapsed_claim(pool, queue_name, "m1", started=True)
    async with running_worker([consumer], amqp_url, database_url):
        await publish(amqp_url, queue_name, {"n": 1}, message_id="m1")
        await wait_status(pool, queue_name, "m1", "dead", timeout=20)
    row = await pool.fetchrow(
        "SELECT reason, attempts FROM rabbitretry.ledger WHERE queue = $1 AND message_id = $2",
        queue_name,
        "m1",
    )
    assert row is not None and (row["reason"], row["attempts"]) == ("crashed", 1)
    assert consumer.runs == []
    assert await attempt_log(pool, queue_name, "m1") == [("crashed", "WorkerLost")]


async def test_a_claim_whose_reply_is_lost_in_a_long_outage_is_given_back(
    amqp_url: str,
    database_url: str,
    database_proxy: Proxy,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The claim commits, its reply never arrives, the ledger stays away longer than the gate
    holds a delivery: the worker requeues it without giving the claim back. The next worker
    must run the handler, not bury the message as crashed."""
    monkeypatch.setattr(outage, "HOLD", 1.0)
    consumer = one_attempt_consumer(queue_name)
    cleanup.append(consumer)

    async def claimed() -> bool:
        return bool(await attempt_log(pool, queue_name, "m1"))

    # One connection, and one message through it first, so that the claim's statement is
    # prepared on it: a statement being prepared waits for the server's description (a reply)
    # before it is sent to run.
    proxied = await db.create_pool(database_proxy.url_for(database_url), min_size=1, max_size=1)
    async with running_worker([consumer], amqp_url, None, pool=proxied):
        await publish(amqp_url, queue_name, {"n": 0}, message_id="m0")
        await wait_status(pool, queue_name, "m0", "succeeded", timeout=20)
        await asyncio.sleep(0.5)  # the connection back in the pool, reset
        database_proxy.stall(replies_only=True)
        await publish(amqp_url, queue_name, {"n": 1}, message_id="m1")
        await wait_for(claimed, timeout=10)
        await database_proxy.cut(refuse=True)
        await asyncio.sleep(outage.HOLD + LEASE)  # the worker gives the delivery back
    database_proxy.restore()
    await proxied.close()
    assert consumer.runs == ["m0"]
    async with running_worker([consumer], amqp_url, database_url):
        await wait_status(pool, queue_name, "m1", "succeeded", timeout=20)
    assert consumer.runs == ["m0", "m1"]
    assert await attempt_log(pool, queue_name, "m1") == [
        ("interrupted", "NotStarted"),
        ("succeeded", None),
    ]
