"""A RabbitMQ that keeps the connection but stops answering (a partition, a hung node: a TCP
proxy that stops forwarding) costs the outbox relay and the reconciler one pass within a bound,
charges nothing, loses nothing, and both recover by themselves when it answers again.

The bound is the first of: the heartbeat's verdict, once no frame came for 3 * (heartbeat + 1)
s (plus at most one heartbeat for the check), and the publish's own timeout (30 s by default;
the only bound with heartbeats off). The tests ask for a 2 s heartbeat, as the worker's does
(tests/integration/test_quiet_failover.py).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import asyncpg
import pytest

from rabbitretry import Consumer
from rabbitretry.outbox import Outbox, OutboxRelay
from rabbitretry.reconcile.reconciler import Reconciler
from rabbitretry.topology import names
from tests.integration.harness import wait_for
from tests.integration.test_quiet_failover import library_noise, text
from tests.integration.test_reconciler import Scene
from tests.proxy import Proxy

pytestmark = pytest.mark.asyncio

HEARTBEAT = 2
HEARTBEAT_BOUND = 3 * (HEARTBEAT + 1) + HEARTBEAT  # the grace, plus one check interval at most
SLACK = 2.0  # scheduling on a busy machine; never another heartbeat or a publish timeout


@pytest.fixture
async def scene(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> Scene:
    scene = Scene(amqp_url, database_url, pool, queue_name, cleanup)
    await scene.consumer()  # its queues, declared
    return scene


def silenced(proxy: Proxy, amqp_url: str, heartbeat: int) -> str:
    """``amqp_url`` through ``proxy``, with ``heartbeat`` (0: off)."""
    return proxy.url_for(amqp_url).rstrip("/") + f"/?heartbeat={heartbeat}"


@contextlib.asynccontextmanager
async def running(relay: OutboxRelay) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(relay.run())

    async def ready() -> bool:
        assert not task.done(), task
        return relay.ready

    try:
        await wait_for(ready, timeout=15)
        yield task
    finally:
        relay.stop()
        await asyncio.wait_for(task, timeout=30)


async def enqueue(pool: asyncpg.Pool, queue: str, keys: list[str]) -> None:
    async with pool.acquire() as conn, conn.transaction():
        for key in keys:
            await Outbox().enqueue(conn, "", {"n": 1}, routing_key=queue, message_id=key)


async def outbox(pool: asyncpg.Pool) -> dict[str, tuple[Any, ...]]:
    rows = await pool.fetch("SELECT message_id, status, tries, last_error FROM rabbitretry.outbox")
    return {row["message_id"]: tuple(row)[1:] for row in rows}


def problems(records: list[logging.LogRecord]) -> list[str]:
    """Lines at ERROR, or at WARNING with a traceback, and the AMQP libraries' own warnings."""
    return [
        text(r)
        for r in records
        if r.levelno >= logging.ERROR or (r.levelno >= logging.WARNING and r.exc_info)
    ] + library_noise(records)


@pytest.mark.parametrize(
    ("heartbeat", "publish_timeout", "bound"),
    [(HEARTBEAT, 30.0, HEARTBEAT_BOUND), (0, 3.0, 3.0)],
    ids=["heartbeat", "publish-timeout"],
)
async def test_a_silent_broker_costs_the_relay_one_pass_within_the_bound(
    amqp_url: str,
    pool: asyncpg.Pool,
    scene: Scene,
    broker_proxy: Proxy,
    caplog: pytest.LogCaptureFixture,
    heartbeat: int,
    publish_timeout: float,
    bound: float,
) -> None:
    """The relay publishes into a silent broker: the pass gives up within the bound, says so
    once, leaves the rows pending with no try counted, and the relay (still running) sends
    them once the broker answers again. Only a row whose publish went unconfirmed may reach
    the queue twice (at-least-once: the consumer's ledger drops the copy by its message_id)."""
    relay = OutboxRelay(
        pool,
        silenced(broker_proxy, amqp_url, heartbeat),
        poll_interval=0.2,
        publish_timeout=publish_timeout,
    )
    before, during = ["a0", "a1"], ["b0", "b1", "b2"]
    caplog.set_level(logging.INFO)
    async with running(relay) as task:
        await enqueue(pool, scene.queue, before)
        await wait_for(lambda: _sent(relay, 2))
        broker_proxy.stall()
        stalled = time.monotonic()
        await enqueue(pool, scene.queue, during)

        async def gave_up() -> bool:
            return relay.stats.unconfirmed >= len(during)

        await wait_for(gave_up, timeout=bound * 3 + 10)
        took = time.monotonic() - stalled
        assert took <= bound + SLACK, f"the relay gave up after {took:.1f} s"
        assert not task.done()
        rows = await outbox(pool)
        assert {key: rows[key] for key in during} == dict.fromkeys(during, ("pending", 0, None))
        assert relay.stats.failed_tries == 0
        broker_proxy.restore()
        await wait_for(lambda: _sent(relay, len(before + during)), timeout=30)
        records = list(caplog.records)
    rows = await outbox(pool)
    assert set(rows.values()) == {("sent", 1, None)}  # the outage used up no try
    copies = collections.Counter(await scene.drain())
    assert set(copies) == set(before + during)
    assert all(copies[key] == 1 for key in before), copies
    # An unconfirmed publish may have reached the broker (the proxy delivers what it held):
    # each one is at most one copy more than the rows.
    assert sum(copies.values()) <= len(before + during) + relay.stats.unconfirmed, copies
    assert problems(records) == []
    gave_up_lines = [
        text(r) for r in records if r.name == "rabbitretry.outbox" and r.levelno == logging.WARNING
    ]
    assert len(gave_up_lines) == 1, gave_up_lines
    assert "the broker did not confirm; row" in gave_up_lines[0]
    assert "stay pending, no try counted" in gave_up_lines[0]
    assert any("the broker confirms publishes again" in r.getMessage() for r in records)


async def _sent(relay: OutboxRelay, count: int) -> bool:
    return relay.stats.sent >= count


@pytest.mark.parametrize("met_by", ["overdue retries", "dead-letter queues"])
async def test_a_silent_broker_fails_a_reconciler_run_within_the_bound_in_one_line(
    amqp_url: str,
    pool: asyncpg.Pool,
    scene: Scene,
    broker_proxy: Proxy,
    caplog: pytest.LogCaptureFixture,
    met_by: str,
) -> None:
    """The broker goes silent between two runs. The next run meets it at its first step that
    talks to the broker (a re-drive's publish, or the dead-letter scan's look at its queue),
    which fails within the bound; the later steps fail at once, without waiting on the broker;
    one WARNING line and no traceback. A run while the connection is down fails at once. Once
    the broker answers, a later run does the work."""
    consumer = scene.cleanup[-1]
    url = silenced(broker_proxy, amqp_url, HEARTBEAT)
    reconciler = Reconciler(pool, url, consumers=[consumer], grace=1.0)
    stray = f"{scene.queue}-stray"
    caplog.set_level(logging.INFO)
    try:
        assert (await reconciler.run_once()).failed_steps == []  # connected, nothing to do
        if met_by == "overdue retries":
            await scene.lost_retries(["lost-1", "lost-2"])
        else:
            await dead_lettered_by_the_broker(amqp_url, names.dead_queue(scene.queue), stray)
        caplog.clear()
        broker_proxy.stall()
        started = time.monotonic()
        report = await asyncio.wait_for(reconciler.run_once(), HEARTBEAT_BOUND * 3)
        took = time.monotonic() - started
        assert took <= HEARTBEAT_BOUND + SLACK, f"the run ended after {took:.1f} s"
        steps = ["overdue retries", "expired leases", "stuck outbox", "dead-letter queues"]
        assert report.failed_steps == steps[steps.index(met_by) :]
        assert (report.retries_redriven, report.broker_dead_recorded) == (0, 0)
        records = list(caplog.records)
        lines = [text(r) for r in records if r.name.startswith("rabbitretry.reconcile")]
        assert len(lines) == 1, lines
        assert lines[0].startswith("WARNING rabbitretry.reconcile.reconciler: reconciler run: ")
        assert "the broker is unreachable (" in lines[0] and f"not done: {met_by}" in lines[0]
        assert problems(records) == []

        started = time.monotonic()  # the connection is down now: the next run fails at once
        report = await asyncio.wait_for(reconciler.run_once(), HEARTBEAT_BOUND)
        assert report.failed_steps == steps and time.monotonic() - started < SLACK
        broker_proxy.restore()

        async def did_the_work() -> bool:
            report = await reconciler.run_once()
            return report.failed_steps == [] and (
                report.retries_redriven == 2 or report.broker_dead_recorded == 1
            )

        await wait_for(did_the_work, timeout=30, interval=0.5)
    finally:
        await reconciler.close()
    if met_by == "overdue retries":
        assert sorted(await scene.drain()) == ["lost-1", "lost-2"]
    else:
        reason = await pool.fetchval(
            "SELECT reason FROM rabbitretry.ledger WHERE message_id = $1", stray
        )
        assert reason == "dead-lettered-by-broker"


async def dead_lettered_by_the_broker(amqp_url: str, dead_queue: str, message_id: str) -> None:
    """A message on the dead-letter queue with no ledger row, as the broker's own limits leave."""
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        await channel.default_exchange.publish(
            aio_pika.Message(b'{"n": 1}', message_id=message_id), routing_key=dead_queue
        )
    finally:
        await connection.close()
