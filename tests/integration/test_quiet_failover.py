"""A routine loss of the broker connection is quiet, and a hung worker is dropped quickly.

The broker closes a worker's connections as it does when a node stops or restarts
(``rabbitmqctl close_connection``: CONNECTION_FORCED), or the network cuts them (a TCP proxy
that closes its sockets). Either way the log reads as one WARNING from rabbitretry per lost
connection and one line when it is back, with no ERROR and no traceback from the AMQP
libraries, and the worker goes on handling new messages.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest
from pydantic import BaseModel

from rabbitretry import Consumer, Context, RetryPolicy, amqp
from rabbitretry.delivery.worker import Worker
from tests.integration.harness import publish, running_worker, wait_for, wait_status
from tests.proxy import Proxy

pytestmark = pytest.mark.asyncio

AMQP_LIBRARIES = ("aiormq", "aio_pika", "asyncio")


class Job(BaseModel):
    n: int


class CountingProxy(Proxy):
    """The tests' TCP proxy, counting the connections it turns away while refusing."""

    refused = 0

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refusing:
            self.refused += 1
        await super()._accept(reader, writer)


@pytest.fixture
async def proxy(amqp_url: str) -> AsyncIterator[CountingProxy]:
    parts = urlsplit(amqp_url)
    started = CountingProxy(parts.hostname or "127.0.0.1", parts.port or 5672)
    await started.start()
    yield started
    await started.close()


@pytest.fixture(autouse=True)
def _needs_rabbitmqctl() -> None:
    if shutil.which("rabbitmqctl") is None:
        message = "rabbitmqctl (the broker's own tool) closes and lists connections here"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (CI=true: this tier must run)", pytrace=False)
        pytest.skip(message)


async def rabbitmqctl(*args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        "rabbitmqctl",
        "-q",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, f"rabbitmqctl {' '.join(args)}: {stderr.decode()}"
    return stdout.decode()


async def broker_connections(worker_name: str) -> dict[str, tuple[str, int]]:
    """The worker's connections as the broker sees them: connection name -> (pid, heartbeat)."""
    found = {}
    listing = await rabbitmqctl("list_connections", "pid", "timeout", "client_properties")
    for line in listing.splitlines()[1:]:
        pid, timeout, properties = line.split("\t", 2)
        for role in ("consume", "publish"):
            name = f"rabbitretry-{role} {worker_name}"
            if f'{{"connection_name","{name}"}}' in properties:
                found[name] = (pid, int(timeout))
    return found


async def force_close(worker: Worker) -> None:
    """Close both of the worker's connections from the broker's side (CONNECTION_FORCED)."""
    connections = await broker_connections(worker.name)
    assert len(connections) == 2, connections
    # Each asked for rabbitretry's heartbeat, which bounds how long a hung worker holds on.
    assert {heartbeat for _, heartbeat in connections.values()} == {amqp.HEARTBEAT}
    for pid, _ in connections.values():
        await rabbitmqctl("close_connection", pid, "test: a node going away")


def consumer_for(queue: str, handler: Callable[[Job], Awaitable[None]]) -> type[Consumer[Job]]:
    class Handled(Consumer[Job]):
        async def handle(self, msg: Job, ctx: Context) -> None:
            await handler(msg)

    Handled.queue = queue
    Handled.retry = RetryPolicy(max_attempts=3, initial_delay=1.0, jitter=0.0)
    return Handled


def connections_up(worker: Worker) -> Callable[[], Awaitable[bool]]:
    async def both_up() -> bool:
        return worker.health().checks["broker"] == "ok"

    return both_up


def text(record: logging.LogRecord) -> str:
    """The record as a line; its arguments' reprs may fail once their objects are closed."""
    try:
        message = record.getMessage()
    except Exception:
        message = str(record.msg)
    return f"{record.levelname} {record.name}: {message}"


def library_noise(records: list[logging.LogRecord]) -> list[str]:
    """Records of the AMQP libraries (and asyncio) at WARNING or above, or above DEBUG with a
    traceback."""
    return [
        text(r)
        for r in records
        if r.name.split(".")[0] in AMQP_LIBRARIES
        and (r.levelno >= logging.WARNING or (r.exc_info and r.levelno > logging.DEBUG))
    ]


def rabbitretry_lines(records: list[logging.LogRecord], level: int) -> list[str]:
    return [text(r) for r in records if r.name.startswith("rabbitretry") and r.levelno == level]


@pytest.mark.parametrize("loss", ["forced", "cut"])
async def test_a_lost_connection_is_one_warning_and_the_worker_goes_on(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    proxy: CountingProxy,
    caplog: pytest.LogCaptureFixture,
    loss: str,
) -> None:
    held = asyncio.Event()
    release = asyncio.Event()

    async def handler(msg: Job) -> None:
        if msg.n == 1:
            held.set()
            await release.wait()

    consumer = consumer_for(queue_name, handler)
    cleanup.append(consumer)
    name = f"quiet-{uuid.uuid4().hex[:8]}"
    url = proxy.url_for(amqp_url)
    async with running_worker(
        [consumer], url, database_url, concurrency=2, name=name, shutdown_timeout=5
    ) as worker:
        await publish(amqp_url, queue_name, {"n": 1}, message_id="in-flight")
        await asyncio.wait_for(held.wait(), 15)
        caplog.clear()
        caplog.set_level(logging.DEBUG)
        if loss == "forced":  # as a node stop or a broker restart does
            await force_close(worker)
        else:  # the network: the sockets close, and the reconnects are refused for a while
            await proxy.cut(refuse=True)

        async def both_down() -> bool:
            return worker.health().checks["broker"] != "ok"

        await wait_for(both_down, timeout=10)
        release.set()  # its ack cannot reach the closed channel: the broker redelivers
        if loss == "cut":

            async def both_refused() -> bool:
                return proxy.refused >= 2

            await wait_for(both_refused, timeout=30)
            proxy.restore()
        await wait_for(connections_up(worker), timeout=30)
        await publish(amqp_url, queue_name, {"n": 2}, message_id="after")
        await wait_status(pool, queue_name, "after", "succeeded")
        await wait_status(pool, queue_name, "in-flight", "succeeded")
        records = list(caplog.records)

    assert library_noise(records) == []
    assert [text(r) for r in records if r.levelno >= logging.ERROR] == []
    lost = rabbitretry_lines(records, logging.WARNING)
    assert len(lost) == 2, lost  # one per connection: consuming and publishing
    assert all(" lost " in line and "127.0.0.1" in line for line in lost), lost
    back = rabbitretry_lines(records, logging.INFO)
    assert len([line for line in back if " is back, on " in line]) == 2, back
    # The held delivery's ack met its closed channel: the line says so, not "()".
    assert [line for line in back if "could not be settled" in line] == [
        "INFO rabbitretry.worker: delivery in-flight could not be settled "
        "(ChannelInvalidStateError: the channel is closed); the broker redelivers it"
    ]


@pytest.mark.parametrize(
    ("query", "negotiated"), [("", amqp.HEARTBEAT), ("?heartbeat=7", 7), ("?heartbeat=0", 0)]
)
async def test_the_heartbeat_is_bounded_unless_the_url_sets_one(
    amqp_url: str, query: str, negotiated: int
) -> None:
    # A hung worker keeps its deliveries until the broker's heartbeat check drops it.
    name = f"heartbeat-{uuid.uuid4().hex[:8]}"
    connection = await amqp.connect(amqp_url.rstrip("/") + "/" + query, name=name)
    try:
        listing = await rabbitmqctl("list_connections", "timeout", "client_properties")
        [timeout] = [
            line.split("\t")[0]
            for line in listing.splitlines()
            if f'{{"connection_name","{name}"}}' in line
        ]
        assert int(timeout) == negotiated
    finally:
        await connection.close()


async def test_a_forced_close_under_load_is_quiet_and_loses_nothing(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    handled: set[int] = set()

    async def handler(msg: Job) -> None:
        await asyncio.sleep(0.01)
        handled.add(msg.n)

    consumer = consumer_for(queue_name, handler)
    cleanup.append(consumer)
    name = f"quiet-{uuid.uuid4().hex[:8]}"
    async with running_worker(
        [consumer], amqp_url, database_url, concurrency=4, name=name
    ) as worker:
        caplog.set_level(logging.DEBUG)
        for n in range(200):
            await publish(amqp_url, queue_name, {"n": n}, message_id=f"m-{n}")

        async def some_handled() -> bool:
            return len(handled) >= 20

        await wait_for(some_handled, timeout=30)
        await force_close(worker)  # with deliveries in flight on every channel

        async def all_succeeded() -> bool:
            done = await pool.fetchval(
                "SELECT count(*) FROM rabbitretry.ledger WHERE queue = $1 AND status = 'succeeded'",
                queue_name,
            )
            return bool(done == 200)

        await wait_for(all_succeeded, timeout=60)
        records = list(caplog.records)

    assert library_noise(records) == []
    assert [text(r) for r in records if r.levelno >= logging.ERROR] == []
    lost = rabbitretry_lines(records, logging.WARNING)
    assert len(lost) == 2, lost


async def test_a_silent_broker_is_a_lost_connection_within_three_heartbeats(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    proxy: CountingProxy,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The broker keeps the connection but stops answering (a partition, a hung node): the
    worker takes it for lost once no frame came for 3 * (heartbeat + 1) s, says so in one
    line per connection, and resumes by itself when the broker answers again."""
    heartbeat = 2
    bound = 3 * (heartbeat + 1) + heartbeat  # the grace, plus one check interval at most
    handled: list[int] = []

    async def handler(msg: Job) -> None:
        handled.append(msg.n)

    consumer = consumer_for(queue_name, handler)
    cleanup.append(consumer)
    url = proxy.url_for(amqp_url).rstrip("/") + f"/?heartbeat={heartbeat}"
    async with running_worker([consumer], url, database_url, shutdown_timeout=5) as worker:
        await publish(amqp_url, queue_name, {"n": 1}, message_id="before")
        await wait_status(pool, queue_name, "before", "succeeded")
        caplog.clear()
        caplog.set_level(logging.DEBUG)
        proxy.stall()
        stalled = asyncio.get_running_loop().time()

        async def down() -> bool:
            return worker.health().checks["broker"] != "ok"

        await wait_for(down, timeout=bound * 3)
        took = asyncio.get_running_loop().time() - stalled
        assert took <= bound + 2, f"the silent broker was noticed after {took:.1f} s"
        await publish(amqp_url, queue_name, {"n": 2}, message_id="during")
        proxy.restore()
        await wait_for(connections_up(worker), timeout=30)
        await wait_status(pool, queue_name, "during", "succeeded", timeout=30)
        records = list(caplog.records)
    assert handled == [1, 2]
    assert library_noise(records) == []
    assert [text(r) for r in records if r.levelno >= logging.ERROR] == []
    lost = rabbitretry_lines(records, logging.WARNING)
    assert 1 <= len(lost) <= 2, lost  # one per connection that noticed
    assert all(" lost (no frame from the broker for three heartbeats" in line for line in lost), (
        lost
    )
