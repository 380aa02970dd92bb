"""The recover hook: a message that ends dead gets a run of ``on_dead``, queued with its death,
at least once, retried with backoff, its effects once, and again after a replay dies again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from pydantic import BaseModel

from rabbitretry import Consumer, Context, OutboxRelay, Permanent, RetryPolicy
from rabbitretry.consumer import Death
from rabbitretry.ledger import Key, recover_hooks
from rabbitretry.operations.replay import replay, sender
from rabbitretry.outbox import Outbox
from rabbitretry.topology import names
from tests.acceptance.cli import env_for, rabbitretry
from tests.integration.harness import publish, running_worker, wait_for

pytestmark = pytest.mark.asyncio

EFFECTS = "CREATE TABLE refunds (order_id int, key text NOT NULL, reason text NOT NULL)"


class Order(BaseModel):
    order_id: int


def refunding_consumer(queue: str, hook_failures: int = 0) -> type[Consumer[Order]]:
    """Every order fails for good; its hook records a refund and queues a compensation,
    after failing ``hook_failures`` times."""
    runs: list[Death] = []

    class ShipOrder(Consumer[Order]):
        retry = RetryPolicy(max_attempts=2, initial_delay=0.1, jitter=0.0)
        recover_retry = RetryPolicy(max_attempts=5, initial_delay=0.2, jitter=0.0)

        async def handle(self, msg: Order, ctx: Context) -> None:
            raise Permanent("the WMS refused this order")

        async def on_dead(self, msg: Order | None, ctx: Context, death: Death) -> None:
            runs.append(death)
            async with ctx.transaction() as conn:
                await conn.execute(
                    "INSERT INTO refunds VALUES ($1, $2, $3)",
                    msg.order_id if msg else None,
                    ctx.idempotency_key,
                    death.reason,
                )
                await Outbox().enqueue(
                    conn,
                    "",
                    {"order_id": msg.order_id if msg else None},
                    routing_key="refunds.requested",
                    message_id=death.compensation_id("refund"),
                )
                if len(runs) <= hook_failures:
                    raise ConnectionError("the refund service is down")

    ShipOrder.queue = queue
    ShipOrder.runs = runs  # type: ignore[attr-defined]
    return ShipOrder


@contextlib.asynccontextmanager
async def relaying(pool: asyncpg.Pool, amqp_url: str) -> AsyncIterator[None]:
    relay = OutboxRelay(pool, amqp_url, poll_interval=0.1)
    task = asyncio.create_task(relay.run())
    try:
        yield
    finally:
        relay.stop()
        await asyncio.wait_for(task, 10)


async def refunds(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    return await pool.fetch("SELECT * FROM refunds ORDER BY key")


async def test_a_dead_message_runs_its_hook_once_with_what_killed_it(
    pool: asyncpg.Pool,
    amqp_url: str,
    database_url: str,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    await pool.execute(EFFECTS)
    consumer = refunding_consumer(queue_name, hook_failures=1)
    cleanup.append(consumer)
    async with (
        running_worker([consumer], amqp_url, database_url) as worker,
        relaying(pool, amqp_url),
    ):
        await publish(amqp_url, queue_name, {"order_id": 7}, message_id="order-7")

        async def refunded() -> bool:
            return len(await refunds(pool)) == 1

        await wait_for(refunded, timeout=30)
        hook_run = await recover_hooks.run_of(pool, queue_name, "order-7")
        assert worker.started

    # The hook failed once (rolled back, retried with backoff) and then committed once.
    rows = await refunds(pool)
    assert [(r["order_id"], r["reason"]) for r in rows] == [(7, "permanent-error")]
    runs = consumer.runs  # type: ignore[attr-defined]
    assert len(runs) == 2
    assert runs[0] == Death(
        queue=queue_name,
        message_id="order-7",
        reason="permanent-error",
        error_type="Permanent",
        error_message="the WMS refused this order",
        attempts=1,
    )
    assert hook_run is not None and hook_run["status"] == "succeeded" and hook_run["attempts"] == 2
    assert hook_run["message_id"] == "recover:order-7:0"
    shown = await rabbitretry(
        env_for(amqp_url, database_url), "dead", "show", "order-7", "--queue", queue_name
    )
    assert shown.code == 0, shown.stderr
    assert "recover hook  succeeded after 2 run(s)" in shown.stdout
    assert f"dead show recover:order-7:0 --queue {queue_name}.recover" in shown.stdout
    compensation = await pool.fetch(
        "SELECT message_id FROM rabbitretry.outbox WHERE routing_key = 'refunds.requested'"
    )
    assert [c["message_id"] for c in compensation] == ["compensate:refund:order-7"]


async def test_the_run_is_written_with_the_dead_row_whichever_statement_kills_it(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    await recover_hooks.register(pool, queue_name, names.recover_queue(queue_name))
    # An operator-side or reconciler-side write that makes a message dead, and one that does
    # not: only the first queues a run; both or neither are committed.
    await pool.execute(
        "INSERT INTO rabbitretry.ledger (queue, message_id, status, max_attempts, payload,"
        " reason, error_type, error_message, finished_at)"
        " VALUES ($1, 'a', 'dead', 1, '{}', 'dead-lettered-by-broker', 'Rejected', 'x', now()),"
        "        ($1, 'b', 'succeeded', 1, '{}', NULL, NULL, NULL, now())",
        queue_name,
    )
    with pytest.raises(asyncpg.CheckViolationError):
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "UPDATE rabbitretry.ledger SET status = 'dead'"
                " WHERE queue = $1 AND message_id = 'b'",
                queue_name,
            )
            await conn.execute("INSERT INTO rabbitretry.downstream (name, state) VALUES ('x', '?')")
    queued = await pool.fetch(
        "SELECT message_id, routing_key, headers FROM rabbitretry.outbox ORDER BY id"
    )
    assert [(q["message_id"], q["routing_key"]) for q in queued] == [
        ("recover:a:0", names.recover_queue(queue_name))
    ]
    assert '"x-rabbitretry-dead-reason": "dead-lettered-by-broker"' in queued[0]["headers"]


async def test_a_replayed_message_that_dies_again_runs_the_hook_again(
    pool: asyncpg.Pool,
    amqp_url: str,
    database_url: str,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    await pool.execute(EFFECTS)
    consumer = refunding_consumer(queue_name)
    cleanup.append(consumer)
    async with (
        running_worker([consumer], amqp_url, database_url),
        relaying(pool, amqp_url),
    ):
        await publish(amqp_url, queue_name, {"order_id": 8}, message_id="order-8")

        async def refunded(times: int) -> bool:
            return len(await refunds(pool)) == times

        await wait_for(lambda: refunded(1), timeout=30)
        async with sender(amqp_url) as copies:
            await replay(pool, copies, [Key(queue_name, "order-8")], actor="test")
        await wait_for(lambda: refunded(2), timeout=30)

    keys = [r["key"] for r in await refunds(pool)]
    assert keys == [
        f"{names.recover_queue(queue_name)}:recover:order-8:0",
        f"{names.recover_queue(queue_name)}:recover:order-8:1",
    ]
