"""The topology a worker needs is there when it starts: the delay chain's deliver binding.

A retry's copy leaves the delay chain through ``rabbitretry.delay.deliver``, where its work
queue is bound by its exact name. A work queue that lost that binding (restored by hand, a
definitions import, an operator's unbind) would lose every retry at the end of the chain: the
deliver exchange drops an unroutable copy that dead-lettering brought to it. A worker binds it
again at start; one whose user may not bind it refuses to start, naming the binding.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import aio_pika
import asyncpg
import pytest
from aio_pika.exceptions import DeliveryError
from pydantic import BaseModel

from rabbitretry import Consumer, Context, Retry, RetryPolicy, amqp
from rabbitretry.consumer import topology_of
from rabbitretry.delivery.worker import Worker
from rabbitretry.errors import TopologyError
from rabbitretry.topology import declare, delays, plan
from tests.integration.harness import publish, wait_for, wait_status

pytestmark = pytest.mark.asyncio


class Job(BaseModel):
    n: int


def failing_once(queue: str, queue_type: str) -> type[Consumer[Job]]:
    """A consumer whose first attempt of each message asks for a short retry."""

    class FailsOnce(Consumer[Job]):
        async def handle(self, msg: Job, ctx: Context) -> None:
            if ctx.attempt == 1:
                raise Retry("first attempt fails", delay=0.05)

    FailsOnce.queue = queue
    FailsOnce.queue_type = queue_type  # type: ignore[assignment]
    FailsOnce.retry = RetryPolicy(max_attempts=3, initial_delay=0.05, jitter=0.0)
    return FailsOnce


@contextlib.asynccontextmanager
async def started(worker: Worker) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``worker`` until it consumes, or until its start-up fails (the task holds why)."""
    task = asyncio.create_task(worker.run())

    async def consuming_or_failed() -> bool:
        return worker.started or task.done()

    try:
        await wait_for(consuming_or_failed, timeout=15)
        yield task
    finally:
        worker.stop()
        await asyncio.wait_for(task, timeout=60)


async def unbind_deliver(amqp_url: str, queue: str) -> None:
    """What a restore by hand leaves behind: the work queue without its deliver binding."""
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        work = await channel.get_queue(queue)
        await work.unbind(delays.DELIVER_EXCHANGE, routing_key=delays.deliver_key(queue))
    finally:
        await connection.close()


async def deliver_routes_to(amqp_url: str, queue: str, queue_type: str) -> bool:
    """Whether a copy leaving the chain for ``queue`` would reach it: a mandatory publish to
    the deliver exchange comes back when nothing is bound. (Only called while the binding is
    missing, or with no message of the test's own in play: a routed probe lands in ``queue``.)
    """
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        exchange = await channel.get_exchange(delays.DELIVER_EXCHANGE)
        key = delays.route(queue, queue_type, 0).routing_key
        try:
            await exchange.publish(aio_pika.Message(b'{"n": 0}', message_id="probe"), key)
        except DeliveryError:
            return False
        return True
    finally:
        await connection.close()


async def attempts_of(pool: asyncpg.Pool, queue: str, message_id: str) -> int:
    attempts: int = await pool.fetchval(
        "SELECT attempts FROM rabbitretry.ledger WHERE queue = $1 AND message_id = $2",
        queue,
        message_id,
    )
    return attempts


@pytest.mark.parametrize("declare_topology", [True, False], ids=["declare", "verify"])
@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
async def test_a_missing_deliver_binding_is_restored_at_worker_start(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    queue_type: str,
    declare_topology: bool,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    consumer = failing_once(queue_name, queue_type)
    cleanup.append(consumer)
    connection = await amqp.connect(amqp_url)
    try:
        await declare(connection, topology_of([consumer]))
    finally:
        await connection.close()
    await unbind_deliver(amqp_url, queue_name)
    assert not await deliver_routes_to(amqp_url, queue_name, queue_type), "still bound"

    worker = Worker(
        consumers=[consumer],
        amqp_url=amqp_url,
        database_url=database_url,
        declare_topology=declare_topology,
    )
    async with started(worker) as task:
        assert not task.done(), task.exception()
        await publish(amqp_url, queue_name, {"n": 1}, message_id="m1")
        # The first attempt's retry copy goes through the chain and must arrive.
        await wait_status(pool, queue_name, "m1", "succeeded", timeout=15)
        assert await attempts_of(pool, queue_name, "m1") == 2


async def test_plan_lists_the_deliver_binding_and_says_who_ensures_it(
    amqp_connection: amqp.Connection, queue_name: str, cleanup: list[type[Consumer[Any]]]
) -> None:
    consumer = failing_once(queue_name, "classic")
    cleanup.append(consumer)
    topology = topology_of([consumer])
    await declare(amqp_connection, topology)

    current = await plan(amqp_connection, topology)
    deliver = [
        entry
        for entry in current.entries
        if entry.kind == "binding" and entry.name.startswith(f"{delays.DELIVER_EXCHANGE} -> ")
    ]
    assert [entry.name.split(" ")[2] for entry in deliver] == [queue_name]
    (entry,) = deliver
    assert entry.action == "ensure"
    assert "retries" in entry.detail and "run" in entry.detail, entry.detail


async def rabbitmqctl(*args: str) -> None:
    if shutil.which("rabbitmqctl") is None:
        message = "rabbitmqctl (the broker's own tool) adds the user this test needs"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (CI=true: this test must run)", pytrace=False)
        pytest.skip(message)
    process = await asyncio.create_subprocess_exec(
        "rabbitmqctl", "-q", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, f"rabbitmqctl {args[0]}: {stderr.decode()}"


@contextlib.asynccontextmanager
async def user_who_cannot_read_deliver(amqp_url: str) -> AsyncIterator[str]:
    """A broker user of this test's own, allowed everything but reading the deliver exchange
    (which binding a queue to it needs); yields ``amqp_url`` as that user. Deleted after."""
    parts = urlsplit(amqp_url)
    vhost = unquote(parts.path[1:]) or "/"
    user, password = f"rabbitretry-test-{secrets.token_hex(4)}", secrets.token_hex(8)
    await rabbitmqctl("add_user", user, password)
    try:
        not_deliver = "^(?!" + delays.DELIVER_EXCHANGE.replace(".", "\\.") + "$).*"
        await rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", not_deliver)
        host = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
        yield urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))
    finally:
        await rabbitmqctl("delete_user", user)


@pytest.mark.parametrize("declare_topology", [True, False], ids=["declare", "verify"])
async def test_a_worker_that_cannot_bind_the_deliver_binding_refuses_to_start(
    amqp_url: str,
    database_url: str,
    queue_name: str,
    declare_topology: bool,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    consumer = failing_once(queue_name, "classic")
    cleanup.append(consumer)
    connection = await amqp.connect(amqp_url)
    try:
        await declare(connection, topology_of([consumer]))
    finally:
        await connection.close()
    await unbind_deliver(amqp_url, queue_name)

    async with user_who_cannot_read_deliver(amqp_url) as restricted_url:
        worker = Worker(
            consumers=[consumer],
            amqp_url=restricted_url,
            database_url=database_url,
            declare_topology=declare_topology,
        )
        with pytest.raises(TopologyError) as refused:
            await asyncio.wait_for(worker.run(), 60)
    assert not worker.started
    message = str(refused.value)
    key = delays.deliver_key(queue_name)
    binding = f"{delays.DELIVER_EXCHANGE} -> {queue_name} (routing key {key!r})"
    assert binding in message, message
    assert "ACCESS_REFUSED" in message, message
    assert f"every retry of {queue_name!r} is lost" in message, message
    assert "rabbitretry topology declare" in message, message
    assert not await deliver_routes_to(amqp_url, queue_name, "classic"), "bound after all"
