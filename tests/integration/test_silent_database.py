"""A PostgreSQL that keeps the connection but stops answering (a partition, a hung server) is an
outage within a bound: the callback receiver answers 503 within its ``store_timeout``, the
worker's outage gate closes within ``SILENT_AFTER`` (deliveries pause, nothing is charged), the
outbox relay and the reconciler give up their pass within it, and all recover by themselves
when the database answers again."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import asyncpg
import httpx
import pytest

from rabbitretry import Consumer, amqp, db
from rabbitretry.callbacks import CallbackReceiver
from rabbitretry.outbox import Outbox, OutboxRelay
from rabbitretry.reconcile.expected import Expected, Reconciliation
from rabbitretry.reconcile.reconciler import Reconciler
from tests.integration.conftest import BrokerCleanup
from tests.integration.harness import (
    publish,
    queue_depth,
    running_worker,
    wait_for,
    wait_status,
)
from tests.integration.test_callbacks import body_of, client_for, kind_for, outbox_rows, post
from tests.integration.test_database_refusals import counting_consumer, gate_closed
from tests.integration.test_reconciler import Scene
from tests.proxy import Proxy

pytestmark = pytest.mark.asyncio
STORE_TIMEOUT = 2.0
POOL_SIZE = 2
# What the test allows over the bound: scheduling on a busy 2-core machine, never a
# statement timeout (60 s) or a connect timeout (60 s).
SLACK = 1.0


async def timed_post(http: httpx.AsyncClient, body: bytes) -> tuple[httpx.Response, float]:
    """The answer and how long it took; a failure (not a wait) when it takes far too long."""
    started = time.monotonic()
    async with asyncio.timeout(STORE_TIMEOUT * 10):  # the test fails, it does not hang
        response = await post(http, body)
    return response, time.monotonic() - started


async def test_a_silent_database_is_503_within_the_store_timeout_and_recovers(
    database_url: str, database_proxy: Proxy, pool: asyncpg.Pool, queue_name: str
) -> None:
    receiver = CallbackReceiver(
        [kind_for(queue_name)],
        database_url=database_proxy.url_for(database_url),
        pool_size=POOL_SIZE,
        store_timeout=STORE_TIMEOUT,
    )
    async with client_for(receiver) as http:
        assert (await post(http, body_of("t1"))).status_code == 200
        database_proxy.stall()
        # More requests than the pool has connections, one after another: a request that
        # timed out must not leave its connection in the pool, tied up or broken.
        transactions = [f"s{n}" for n in range(POOL_SIZE + 1)]
        for transaction in transactions:
            response, took = await timed_post(http, body_of(transaction))
            assert response.status_code == 503, response.text
            assert response.headers["retry-after"] == "5"
            assert took < STORE_TIMEOUT + SLACK, f"503 after {took:.1f} s"
        # And together: the whole pool waiting at once is still bounded.
        together = await asyncio.gather(*(timed_post(http, body_of(t)) for t in transactions))
        assert [r.status_code for r, _ in together] == [503] * len(transactions)
        assert max(took for _, took in together) < STORE_TIMEOUT + SLACK
        database_proxy.restore()
        # The gateway sends again: each is stored (or found stored, if a statement held by
        # the stall went through once the partition healed), with no restart.
        for transaction in transactions:
            response, took = await timed_post(http, body_of(transaction))
            assert response.status_code == 200, response.text
            assert took < STORE_TIMEOUT + SLACK
    keys = sorted(r["message_id"] for r in await outbox_rows(pool))
    assert keys == sorted(["pay-t1-paid", *(f"pay-{t}-paid" for t in transactions)])


async def test_a_database_silent_from_the_first_request_is_503_within_the_store_timeout(
    database_url: str, database_proxy: Proxy, pool: asyncpg.Pool, queue_name: str
) -> None:
    receiver = CallbackReceiver(
        [kind_for(queue_name)],
        database_url=database_proxy.url_for(database_url),
        store_timeout=STORE_TIMEOUT,
    )
    async with client_for(receiver) as http:
        database_proxy.stall()  # the receiver's pool is opened by the first request
        response, took = await timed_post(http, body_of("t1"))
        assert response.status_code == 503, response.text
        assert took < STORE_TIMEOUT + SLACK, f"503 after {took:.1f} s"
        database_proxy.restore()
        response, took = await timed_post(http, body_of("t1"))
        assert response.status_code == 200, response.text
    assert [r["message_id"] for r in await outbox_rows(pool)] == ["pay-t1-paid"]


async def test_a_silent_ledger_closes_the_workers_gate_within_the_bound_and_charges_nothing(
    amqp_url: str,
    database_url: str,
    database_proxy: Proxy,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(db, "SILENT_AFTER", STORE_TIMEOUT)
    consumer = counting_consumer(queue_name)  # max_attempts=1: a charge would bury a message
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_proxy.url_for(database_url)) as w:
        await publish(amqp_url, queue_name, {"n": 0}, message_id="m-0")
        await wait_status(pool, queue_name, "m-0", "succeeded", timeout=20)
        database_proxy.stall()
        started = time.monotonic()
        ids = [f"m-{n}" for n in range(1, 4)]
        for n, message_id in enumerate(ids, start=1):
            await publish(amqp_url, queue_name, {"n": n}, message_id=message_id)
        await wait_for(gate_closed(w), timeout=STORE_TIMEOUT * 10)
        took = time.monotonic() - started
        assert took < STORE_TIMEOUT + SLACK + 1, f"gate closed after {took:.1f} s"
        database_proxy.restore()
        for message_id in ids:
            await wait_status(pool, queue_name, message_id, "succeeded", timeout=30)
    assert sorted(consumer.calls) == ["m-0", *ids]
    assert all(runs == 1 for runs in consumer.calls.values()), consumer.calls


async def test_a_silent_database_costs_the_relay_one_pass_within_the_bound(
    amqp_url: str,
    database_url: str,
    database_proxy: Proxy,
    pool: asyncpg.Pool,
    queue_name: str,
    broker_cleanup: BrokerCleanup,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(db, "SILENT_AFTER", STORE_TIMEOUT)
    broker_cleanup.queue(queue_name)
    connection = await amqp.connect(amqp_url)
    proxied = await db.create_pool(database_proxy.url_for(database_url), min_size=1, max_size=2)
    try:
        channel = await connection.channel()
        await channel.declare_queue(queue_name, durable=True)
        publisher = await amqp.ConfirmingPublisher.open(connection)
        async with pool.acquire() as conn:
            await Outbox().enqueue(conn, "", {"n": 1}, routing_key=queue_name, message_id="m1")
        relay = OutboxRelay(proxied, amqp_url)
        database_proxy.stall()
        started = time.monotonic()
        with pytest.raises(db.DatabaseSilent):
            await relay.relay_once(publisher)
        took = time.monotonic() - started
        assert took < STORE_TIMEOUT + SLACK, f"the relay gave up after {took:.1f} s"
        database_proxy.restore()

        async def relayed() -> bool:
            return await relay.relay_once(publisher) == 1

        await wait_for(relayed, timeout=20)  # a statement the stall held may hold the row
    finally:
        await proxied.close()
        await connection.close()
    assert await queue_depth(amqp_url, queue_name) == 1
    assert await pool.fetchval("SELECT status FROM rabbitretry.outbox") == "sent"


async def test_a_silent_database_fails_a_reconciler_run_within_the_bound_in_one_line(
    amqp_url: str,
    database_url: str,
    database_proxy: Proxy,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The database goes silent in the middle of a run (the window step's hook stalls it):
    the run ends within the bound, says so in one line with no traceback, and a later run,
    once the database answers, re-drives what was lost meanwhile."""
    monkeypatch.setattr(db, "SILENT_AFTER", STORE_TIMEOUT)
    scene = Scene(amqp_url, database_url, pool, queue_name, cleanup)
    await scene.consumer()
    stalled: list[float] = []

    async def stalling(start: datetime, end: datetime) -> AsyncIterator[Expected]:
        if not stalled:
            database_proxy.stall()
            stalled.append(time.monotonic())
        return
        yield  # an async generator

    window = Reconciliation("stalls", queue_name, stalling, lookback=600, settle=0)
    proxied = await db.create_pool(database_proxy.url_for(database_url), min_size=1, max_size=2)
    reconciler = Reconciler(proxied, amqp_url, reconciliations=[window], grace=1.0)
    task = asyncio.create_task(reconciler.run(interval=0.5))
    try:

        def failed_runs() -> list[logging.LogRecord]:
            return [r for r in caplog.records if r.getMessage().startswith("reconciler run failed")]

        async def warned() -> bool:
            return bool(failed_runs())

        await wait_for(warned, timeout=STORE_TIMEOUT * 10)
        took = time.monotonic() - stalled[0]
        assert took < STORE_TIMEOUT + SLACK, f"the run gave up after {took:.1f} s"
        (line, *_) = failed_runs()
        assert line.levelno == logging.WARNING and line.exc_info is None
        assert "the database is unreachable (DatabaseSilent: the database gave no answer" in (
            line.getMessage()
        )
        database_proxy.restore()
        await scene.lost_retries(["lost"])

        async def redriven() -> bool:
            return await queue_depth(amqp_url, queue_name) == 1

        await wait_for(redriven, timeout=20)
    finally:
        reconciler.stop()
        await asyncio.wait_for(task, timeout=30)
        await proxied.close()
    assert await scene.drain() == ["lost"]
    tracebacks = [r for r in caplog.records if r.exc_info and r.levelno >= logging.WARNING]
    assert tracebacks == [], [r.getMessage() for r in tracebacks]
