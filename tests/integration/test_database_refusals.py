"""A database that refuses "not now" is an outage: deliveries pause, nothing is charged.

Each refusal is made real on a scratch database: ``default_transaction_read_only`` (what a
hot standby answers after a failover), ``ALLOW_CONNECTIONS false`` with its sessions ended
(an administrator's shutdown, then "not accepting connections"), ``CONNECTION LIMIT 0`` on a
role of the test's own ("too many connections", 53300).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest
from pydantic import BaseModel

from rabbitretry import Consumer, Context, RetryPolicy, db
from rabbitretry.console import Auth, ConsoleConfig
from rabbitretry.delivery.worker import Worker
from rabbitretry.monitoring.metrics import health_response
from tests.integration.console_harness import TOKEN, console_client, csrf_of, post
from tests.integration.harness import queue_depth, running_worker, wait_for

pytestmark = pytest.mark.asyncio

MESSAGES = 4
GATE_LOG = "deliveries pause"
PROBE_REFUSED = "is still unreachable"


class Item(BaseModel):
    n: int


def counting_consumer(queue: str, **attributes: Any) -> type[Consumer[Item]]:
    class Counted(Consumer[Item]):
        retry = RetryPolicy(max_attempts=1)
        calls: ClassVar[dict[str, int]] = {}

        async def handle(self, msg: Item, ctx: Context) -> None:
            self.calls[ctx.message_id] = self.calls.get(ctx.message_id, 0) + 1

    Counted.queue = queue
    for name, value in attributes.items():
        setattr(Counted, name, value)
    return Counted


def name_of(database_url: str) -> str:
    return urlsplit(database_url).path.lstrip("/")


async def alter(server_database_url: str, sql: str) -> None:
    admin = await asyncpg.connect(server_database_url)
    try:
        await admin.execute(sql)
    finally:
        await admin.close()


@contextlib.asynccontextmanager
async def read_only(
    server_database_url: str, database_url: str
) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """New sessions of the database refuse writes (as a hot standby does) until the block ends,
    or until the function it yields is called."""
    name = name_of(database_url)
    await alter(
        server_database_url, f"ALTER DATABASE {name} SET default_transaction_read_only = on"
    )

    async def writable() -> None:
        await alter(
            server_database_url, f"ALTER DATABASE {name} RESET default_transaction_read_only"
        )

    try:
        yield writable
    finally:
        await writable()


async def publish_items(amqp_url: str, queue: str) -> list[str]:
    from tests.integration.harness import publish

    ids = [f"m-{n}" for n in range(MESSAGES)]
    for n, message_id in enumerate(ids):
        await publish(amqp_url, queue, {"n": n}, message_id=message_id)
    return ids


async def ledger_rows(database_url: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        rows: int = await conn.fetchval("SELECT count(*) FROM rabbitretry.ledger")
        return rows
    finally:
        await conn.close()


def gate_closed(worker: Worker) -> Any:
    async def closed() -> bool:
        return worker.health().checks["ledger"] != "ok"

    return closed


def gate_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if GATE_LOG in r.getMessage()]


async def all_succeeded(database_url: str, ids: list[str]) -> None:
    conn = await asyncpg.connect(database_url)
    try:

        async def done() -> bool:
            rows = await conn.fetch(
                "SELECT status, attempts FROM rabbitretry.ledger WHERE message_id = ANY($1)", ids
            )
            return len(rows) == len(ids) and all(
                r["status"] == "succeeded" and r["attempts"] == 1 for r in rows
            )

        await wait_for(done, timeout=60)
    finally:
        await conn.close()


async def test_a_read_only_ledger_pauses_deliveries_and_resumes_by_itself(
    amqp_url: str,
    server_database_url: str,
    database_url: str,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="rabbitretry")
    consumer = counting_consumer(queue_name)
    cleanup.append(consumer)
    async with (
        read_only(server_database_url, database_url) as writable_again,
        running_worker([consumer], amqp_url, database_url, concurrency=2) as worker,
    ):
        ids = await publish_items(amqp_url, queue_name)
        await wait_for(gate_closed(worker), timeout=15)
        await asyncio.sleep(4)  # several probes of the still read-only database
        assert worker.health().checks["ledger"] != "ok"
        status, _, body = await health_response(worker.health, None)
        assert status.startswith("503"), body
        pool = await db.create_pool(database_url, max_size=1)
        try:
            status, _, body = await health_response(None, pool)
        finally:
            await pool.close()
        assert status.startswith("503") and b"read-only" in body, body
        assert await ledger_rows(database_url) == 0  # nothing claimed, nothing charged
        assert consumer.calls == {}
        assert len(gate_lines(caplog)) == 1, gate_lines(caplog)
        unexpected = [r for r in caplog.records if "unexpected error" in r.getMessage()]
        assert unexpected == []

        await writable_again()  # the worker resumes by itself: every message succeeds once
        await all_succeeded(database_url, ids)
        assert consumer.calls == dict.fromkeys(ids, 1)
    assert len(gate_lines(caplog)) == 1, gate_lines(caplog)


async def test_an_outage_never_spends_a_quorum_queues_delivery_limit(
    amqp_url: str,
    server_database_url: str,
    database_url: str,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    """Read-only for longer than a delivery limit of 1 allows requeues: nothing dead."""
    consumer = counting_consumer(queue_name, queue_type="quorum", delivery_limit=1)
    cleanup.append(consumer)
    async with (
        read_only(server_database_url, database_url) as writable_again,
        running_worker([consumer], amqp_url, database_url) as worker,
    ):
        ids = await publish_items(amqp_url, queue_name)
        await wait_for(gate_closed(worker), timeout=15)
        await asyncio.sleep(8)
        await writable_again()
        await all_succeeded(database_url, ids)
        assert consumer.calls == dict.fromkeys(ids, 1)
        dead_queue = consumer.work_queue().dead_queue_name
        assert await queue_depth(amqp_url, dead_queue) == 0


async def test_refused_connections_pause_deliveries_and_resume(
    amqp_url: str,
    server_database_url: str,
    database_url: str,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Sessions ended by an administrator (57P01), then "not accepting connections" (55000)."""
    caplog.set_level(logging.INFO, logger="rabbitretry")
    consumer = counting_consumer(queue_name)
    cleanup.append(consumer)
    name = name_of(database_url)
    async with running_worker([consumer], amqp_url, database_url, concurrency=2) as worker:
        await alter(server_database_url, f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
        try:
            await alter(
                server_database_url,
                f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'",
            )
            ids = await publish_items(amqp_url, queue_name)
            await wait_for(gate_closed(worker), timeout=15)
            await asyncio.sleep(4)  # several probes refused
            assert worker.health().checks["ledger"] != "ok"
            assert consumer.calls == {}
            assert len(gate_lines(caplog)) == 1, gate_lines(caplog)
        finally:
            await alter(server_database_url, f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
        await all_succeeded(database_url, ids)  # one attempt each: the outage charged nothing
        assert consumer.calls == dict.fromkeys(ids, 1)
    assert len(gate_lines(caplog)) == 1, gate_lines(caplog)


async def test_the_console_answers_503_on_a_read_only_ledger(
    amqp_url: str, server_database_url: str, database_url: str
) -> None:
    config = ConsoleConfig(
        database_url=database_url,
        amqp_url=amqp_url,
        auth=Auth(token=TOKEN),
        allowed_hosts=("console.test",),
    )
    async with (
        read_only(server_database_url, database_url),
        console_client(config) as client,
    ):
        await post(client, "/login", {"token": TOKEN, "name": "alice"})
        page = await client.get("/messages")
        assert page.status_code == 200  # reading works
        csrf = csrf_of(page.text)
        response: httpx.Response = await post(client, "/logout", {"csrf": csrf})
    assert response.status_code == 503, response.text
    assert "read-only" in response.text


@contextlib.asynccontextmanager
async def limited_role(server_database_url: str, database_url: str) -> AsyncIterator[str]:
    """A login role of this test's own that may read and write every table (not a superuser:
    connection limits do not bind one); yields ``database_url`` as that role. Dropped after."""
    role = f"rabbitretry_limited_{secrets.token_hex(4)}"
    await alter(
        server_database_url,
        f"CREATE ROLE {role} LOGIN; GRANT pg_read_all_data, pg_write_all_data TO {role}",
    )
    parts = urlsplit(database_url)
    host = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
    try:
        yield urlunsplit(parts._replace(netloc=f"{role}@{host}"))
    finally:
        await alter(
            server_database_url,
            f"ALTER ROLE {role} CONNECTION LIMIT -1;"
            f" SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'",
        )
        await alter(server_database_url, f"DROP ROLE {role}")


async def test_too_many_connections_pause_deliveries_and_resume(
    amqp_url: str,
    server_database_url: str,
    database_url: str,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The worker's role reaches its connection limit (53300) when its pool must reconnect."""
    caplog.set_level(logging.DEBUG, logger="rabbitretry")
    consumer = counting_consumer(queue_name)
    cleanup.append(consumer)
    async with limited_role(server_database_url, database_url) as role_url:
        role = urlsplit(role_url).username
        config = ConsoleConfig(
            database_url=role_url,
            amqp_url=amqp_url,
            auth=Auth(token=TOKEN),
            allowed_hosts=("console.test",),
        )
        async with (
            running_worker([consumer], amqp_url, role_url, concurrency=2) as worker,
            console_client(config) as console,
        ):
            await post(console, "/login", {"token": TOKEN, "name": "alice"})
            assert (await console.get("/messages")).status_code == 200
            # No new session for the role (committed first, so that no reconnect slips in
            # before it), then the ones it has end: its pools must connect again.
            await alter(server_database_url, f"ALTER ROLE {role} CONNECTION LIMIT 0")
            await alter(
                server_database_url,
                f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'",
            )
            try:
                ids = await publish_items(amqp_url, queue_name)
                await wait_for(gate_closed(worker), timeout=15)

                async def probes_refused() -> bool:  # the gate's probe met the limit again
                    return sum(PROBE_REFUSED in r.getMessage() for r in caplog.records) >= 2

                await wait_for(probes_refused, timeout=15)
                assert "out of connections" in worker.health().checks["ledger"]
                status, _, body = await health_response(worker.health, None)
                assert status.startswith("503") and b"out of connections" in body, body
                page = await console.get("/messages")
                assert page.status_code == 503, page.text
                assert "out of connections" in page.text, page.text
                assert await ledger_rows(database_url) == 0  # nothing claimed, nothing charged
                assert consumer.calls == {}
                assert len(gate_lines(caplog)) == 1, gate_lines(caplog)
                assert "TooManyConnectionsError" in gate_lines(caplog)[0]
            finally:
                await alter(server_database_url, f"ALTER ROLE {role} CONNECTION LIMIT -1")
            await all_succeeded(database_url, ids)  # one attempt each: nothing charged
            assert consumer.calls == dict.fromkeys(ids, 1)
            assert worker.health().checks["ledger"] == "ok"
            assert (await console.get("/messages")).status_code == 200
    assert len(gate_lines(caplog)) == 1, gate_lines(caplog)
    unexpected = [r for r in caplog.records if "unexpected error" in r.getMessage()]
    assert unexpected == []
