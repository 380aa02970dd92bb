"""A downstream's outage costs nothing: its shared breaker opens, consumers stop taking
deliveries, no attempt is charged, nothing goes dead, and the backlog catches up by itself."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import pytest
from pydantic import BaseModel

from rabbitretry import Consumer, Context, Downstream, RetryPolicy
from rabbitretry.ledger import downstreams
from tests.integration.harness import publish, queue_depth, running_worker, wait_for

pytestmark = pytest.mark.asyncio


class Order(BaseModel):
    order_id: int


class WmsDown(Exception):
    """What the stub answers during its outage (an HTTP 500, say)."""


@dataclass
class Wms:
    """The downstream: answers, or fails while ``down``; remembers every call."""

    down: bool = False
    calls: list[tuple[float, bool]] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight_while_down: int = 0

    async def ship(self, order_id: int) -> None:
        self.in_flight += 1
        try:
            if self.down:
                self.most_in_flight_while_down = max(self.most_in_flight_while_down, self.in_flight)
            self.calls.append((time.monotonic(), self.down))
            await asyncio.sleep(0.01)
            if self.down:
                raise WmsDown(f"HTTP 500 for order {order_id}")
        finally:
            self.in_flight -= 1

    def calls_while_down(self, since: float = 0.0) -> int:
        return sum(1 for at, down in self.calls if down and at >= since)


EFFECTS = "CREATE TABLE shipped (order_id int NOT NULL, key text NOT NULL)"


def shipping_consumer(queue: str, wms: Wms, **breaker: Any) -> type[Consumer[Order]]:
    settings = {"failure_threshold": 3, "first_pause": 0.5, "max_pause": 1.0, **breaker}

    class ShipOrder(Consumer[Order]):
        retry = RetryPolicy(max_attempts=3, initial_delay=0.2, jitter=0.0)
        downstreams = (Downstream("wms", unavailable_on=(WmsDown,), **settings),)

        async def handle(self, msg: Order, ctx: Context) -> None:
            async with ctx.transaction() as conn:
                await conn.execute(
                    "INSERT INTO shipped VALUES ($1, $2)", msg.order_id, ctx.idempotency_key
                )
                async with ctx.downstream("wms"):
                    await wms.ship(msg.order_id)

    ShipOrder.queue = queue
    return ShipOrder


async def breaker(pool: asyncpg.Pool) -> asyncpg.Record | None:
    return await pool.fetchrow("SELECT * FROM rabbitretry.downstream WHERE name = 'wms'")


async def publish_orders(amqp_url: str, queue: str, count: int) -> None:
    for order_id in range(count):
        await publish(amqp_url, queue, {"order_id": order_id}, message_id=f"order-{order_id}")


async def wait_open(pool: asyncpg.Pool) -> None:
    async def is_open() -> bool:
        row = await breaker(pool)
        return row is not None and row["state"] != "closed"

    await wait_for(is_open, timeout=20)


async def all_succeeded(pool: asyncpg.Pool, queue: str, count: int) -> None:
    async def done() -> bool:
        n = await pool.fetchval(
            "SELECT count(*) FROM rabbitretry.ledger WHERE queue = $1 AND status = 'succeeded'",
            queue,
        )
        return bool(n == count)

    await wait_for(done, timeout=40)


async def charged(pool: asyncpg.Pool, queue: str) -> list[int]:
    """The attempts charged to each message that waits (not done, not in flight: a probe's
    attempt is charged at its claim, like any other, and forgiven when it is deferred)."""
    rows = await pool.fetch(
        "SELECT attempts - attempts_forgiven AS charged FROM rabbitretry.ledger"
        " WHERE queue = $1 AND status NOT IN ('succeeded', 'processing')",
        queue,
    )
    return [row["charged"] for row in rows]


async def in_flight(pool: asyncpg.Pool, queue: str) -> int:
    return int(
        await pool.fetchval(
            "SELECT count(*) FROM rabbitretry.ledger WHERE queue = $1 AND status = 'processing'",
            queue,
        )
    )


async def test_an_outage_opens_the_breaker_charges_nothing_and_catches_up_by_itself(
    pool: asyncpg.Pool,
    amqp_url: str,
    database_url: str,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    await pool.execute(EFFECTS)
    wms = Wms(down=True)
    consumer = shipping_consumer(queue_name, wms)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url, concurrency=4):
        await publish_orders(amqp_url, queue_name, 40)
        await wait_open(pool)
        opened_at = time.monotonic()
        await asyncio.sleep(3.0)

        # While open: the messages wait on the broker, none is dead, none is charged
        # (the attempts of the failures that tripped it were forgiven), and the service
        # gets only the probes, one at a time.
        assert await queue_depth(amqp_url, queue_name) >= 30
        assert (
            await pool.fetchval(
                "SELECT count(*) FROM rabbitretry.ledger WHERE queue = $1 AND status = 'dead'",
                queue_name,
            )
            == 0
        )
        assert all(n == 0 for n in await charged(pool, queue_name))
        assert await in_flight(pool, queue_name) <= 1  # the probe, if one is under way
        probes = wms.calls_while_down(since=opened_at + 0.1)
        assert probes <= 6, wms.calls
        assert wms.most_in_flight_while_down <= 4

        wms.down = False
        recovered_at = time.monotonic()
        await all_succeeded(pool, queue_name, 40)
        caught_up = time.monotonic() - recovered_at

    assert caught_up < 10
    assert await pool.fetchval("SELECT count(DISTINCT order_id) FROM shipped") == 40
    assert await pool.fetchval("SELECT count(*) FROM shipped") == 40
    row = await breaker(pool)
    assert row is not None and row["state"] == "closed" and row["opened"] == 1
    alerts = await pool.fetch(
        "SELECT detail->>'state' AS state FROM rabbitretry.alert"
        " WHERE kind = 'downstream' AND group_key = 'wms' ORDER BY id"
    )
    assert [a["state"] for a in alerts] == ["open", "closed"]
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM rabbitretry.attempt_history"
            " WHERE queue = $1 AND outcome = 'deferred'"
            " AND downstream = 'wms'",
            queue_name,
        )
        >= 3
    )


async def test_two_workers_trip_one_breaker_and_probe_one_at_a_time(
    pool: asyncpg.Pool,
    amqp_url: str,
    database_url: str,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    await pool.execute(EFFECTS)
    wms = Wms(down=True)
    consumer = shipping_consumer(queue_name, wms, first_pause=0.3, max_pause=0.3)
    cleanup.append(consumer)
    async with (
        running_worker([consumer], amqp_url, database_url, concurrency=3, name="one"),
        running_worker([consumer], amqp_url, database_url, concurrency=3, name="two"),
    ):
        await publish_orders(amqp_url, queue_name, 30)
        await wait_open(pool)
        opened_at = time.monotonic()
        wms.most_in_flight_while_down = 0
        await asyncio.sleep(3.0)
        # Probes every 0.3 s at most, never two at once, from either worker.
        assert wms.most_in_flight_while_down <= 1
        assert wms.calls_while_down(since=opened_at) <= 3.0 / 0.3 + 2
        wms.down = False
        await all_succeeded(pool, queue_name, 30)

    row = await breaker(pool)
    assert row is not None and row["opened"] == 1
    assert await pool.fetchval("SELECT count(*) FROM shipped") == 30


async def test_a_downstream_that_never_recovers_kills_nothing_and_does_not_loop(
    pool: asyncpg.Pool,
    amqp_url: str,
    database_url: str,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    await pool.execute(EFFECTS)
    wms = Wms(down=True)
    consumer = shipping_consumer(queue_name, wms)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url, concurrency=2):
        await publish_orders(amqp_url, queue_name, 10)
        await wait_open(pool)
        attempts_at_open = await pool.fetchval("SELECT count(*) FROM rabbitretry.attempt_history")
        await asyncio.sleep(4.0)
        attempts_later = await pool.fetchval("SELECT count(*) FROM rabbitretry.attempt_history")
        row = await breaker(pool)

    # One probe per pause (0.5 s, then 1 s): a handful of attempts, none charged, none dead.
    assert attempts_later - attempts_at_open <= 8
    assert all(n == 0 for n in await charged(pool, queue_name))
    assert await pool.fetchval("SELECT count(*) FROM rabbitretry.ledger WHERE status = 'dead'") == 0
    assert row is not None and row["state"] in ("open", "half-open") and row["probes"] >= 2
    assert await queue_depth(amqp_url, queue_name) >= 9
    # Each failed probe's message goes to the queue's tail: the probes take turns, so no
    # message piles up requeues (a quorum queue's delivery limit would kill it).
    assert await pool.fetchval("SELECT max(attempts) FROM rabbitretry.ledger") <= 3


async def test_errors_the_downstream_does_not_declare_keep_the_retry_policy(
    pool: asyncpg.Pool,
    amqp_url: str,
    database_url: str,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    class Refused(Consumer[Order]):
        retry = RetryPolicy(max_attempts=2, initial_delay=0.1, jitter=0.0)
        downstreams = (Downstream("wms", unavailable_on=(WmsDown,), failure_threshold=1),)

        async def handle(self, msg: Order, ctx: Context) -> None:
            async with ctx.downstream("wms"):
                raise ValueError("the WMS says this order is malformed")

    Refused.queue = queue_name
    cleanup.append(Refused)
    async with running_worker([Refused], amqp_url, database_url):
        await publish(amqp_url, queue_name, {"order_id": 1}, message_id="bad")

        async def dead() -> bool:
            return bool(
                await pool.fetchval(
                    "SELECT status = 'dead' FROM rabbitretry.ledger WHERE message_id = 'bad'"
                )
            )

        await wait_for(dead, timeout=20)
    row = await breaker(pool)  # never counted: not an outage
    assert row is not None and (row["state"], row["failures"], row["opened"]) == ("closed", 0, 0)


async def test_an_operator_holds_a_breaker_open_until_they_close_it(
    pool: asyncpg.Pool,
    amqp_url: str,
    database_url: str,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    await pool.execute(EFFECTS)
    wms = Wms()
    consumer = shipping_consumer(queue_name, wms, first_pause=0.2)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url, concurrency=2):
        await downstreams.force_open(pool, "wms", "ops@example.com")

        async def paused() -> bool:
            return await queue_depth(amqp_url, queue_name) == 5

        await asyncio.sleep(1.5)  # the workers' view is refreshed every second
        await publish_orders(amqp_url, queue_name, 5)
        await wait_for(paused, timeout=5)
        await asyncio.sleep(1.5)  # held open: no probe ever takes one
        assert await queue_depth(amqp_url, queue_name) == 5
        assert wms.calls == []

        assert await downstreams.force_close(pool, "wms", "ops@example.com")
        await all_succeeded(pool, queue_name, 5)
    assert len(wms.calls) == 5
