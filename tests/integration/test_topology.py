"""Declaring, planning and verifying topologies against the real broker."""

from __future__ import annotations

import asyncio
import time
from typing import Literal

import aio_pika
import pytest

from rabbitretry import amqp
from rabbitretry.errors import TopologyError
from rabbitretry.topology import (
    Binding,
    Exchange,
    Topology,
    WorkQueue,
    declare,
    delays,
    plan,
    verify,
)
from rabbitretry.topology.model import DEFAULT_DELIVERY_LIMIT
from tests.integration.conftest import BrokerCleanup

QueueType = Literal["classic", "quorum"]
QUEUE_TYPES: list[QueueType] = ["classic", "quorum"]
QUORUM_ONLY = ("x-queue-type", "x-dead-letter-strategy", "x-delivery-limit")


def make_topology(queue_name: str, queue_type: QueueType = "classic") -> Topology:
    exchange = f"{queue_name}.x"
    return Topology(
        exchanges=[Exchange(name=exchange, type="topic")],
        queues=[
            WorkQueue(
                name=queue_name,
                type=queue_type,
                delivery_limit=5 if queue_type == "quorum" else None,
                bindings=[Binding(exchange=exchange, routing_key="order.paid")],
            )
        ],
    )


async def exists(connection: amqp.Connection, kind: str, name: str) -> bool:
    async with amqp.Prober(connection) as prober:
        if kind == "exchange":
            outcome, _ = await prober.attempt(lambda ch: ch.declare_exchange(name, passive=True))
        else:
            outcome, _ = await prober.attempt(lambda ch: ch.declare_queue(name, passive=True))
    return outcome == "ok"


async def get_within(
    queue: aio_pika.abc.AbstractQueue, seconds: float
) -> aio_pika.abc.AbstractIncomingMessage | None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        message = await queue.get(no_ack=True, fail=False)
        if message is not None:
            return message
        await asyncio.sleep(0.02)
    return None


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
async def test_declare_creates_everything_and_plan_creates_nothing(
    amqp_connection: amqp.Connection,
    broker_cleanup: BrokerCleanup,
    queue_name: str,
    queue_type: QueueType,
) -> None:
    topology = broker_cleanup.topology(make_topology(queue_name, queue_type))
    queues = [q.name for q in topology.queue_declarations() if not q.shared]
    assert queues == [queue_name, f"{queue_name}.dead"]

    before = await plan(amqp_connection, topology)
    own = [(e.kind, e.action) for e in before.entries if not e.name.startswith(delays.PREFIX)]
    assert own == [
        ("exchange", "create"),
        *[("queue", "create")] * 2,
        ("binding", "ensure"),
    ]
    bindings = [e for e in before.entries if e.kind == "binding"]
    assert len(bindings) == 2 + 2 * delays.LEVELS  # the exchange's, the deliver one, the chain
    # The delay chain is shared: other work queues of this type may have declared it already.
    chain = [e for e in before.entries if e.name.startswith(delays.PREFIX) and e.kind != "binding"]
    assert len(chain) == 1 + 2 * delays.LEVELS  # the deliver exchange, and each level's pair
    assert {e.action for e in chain} <= {"create", "ok"}
    for name in queues:
        assert not await exists(amqp_connection, "queue", name), "plan must not create"
    assert not await exists(amqp_connection, "exchange", f"{queue_name}.x")

    applied = await declare(amqp_connection, topology)
    assert applied == before
    for name in queues:
        assert await exists(amqp_connection, "queue", name), name
    assert await exists(amqp_connection, "exchange", f"{queue_name}.x")

    # The binding works: a message published to the exchange reaches the work queue.
    async with amqp_connection.channel() as channel:
        exchange = await channel.get_exchange(f"{queue_name}.x")
        await exchange.publish(aio_pika.Message(b"{}", message_id="m1"), routing_key="order.paid")
        work = await channel.get_queue(queue_name)
        received = await get_within(work, 5)
        assert received is not None and received.message_id == "m1"


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
async def test_declaring_twice_changes_nothing(
    amqp_connection: amqp.Connection,
    broker_cleanup: BrokerCleanup,
    queue_name: str,
    queue_type: QueueType,
) -> None:
    topology = broker_cleanup.topology(make_topology(queue_name, queue_type))
    await declare(amqp_connection, topology)
    second = await declare(amqp_connection, topology)
    assert {e.action for e in second.entries} == {"ok", "ensure"}
    assert {e.action for e in second.entries if e.kind == "binding"} == {"ensure"}
    assert not second.missing and not second.has_mismatch
    await verify(amqp_connection, topology)


async def test_a_queue_with_another_ttl_is_a_mismatch_and_blocks_declare(
    amqp_connection: amqp.Connection, broker_cleanup: BrokerCleanup, queue_name: str
) -> None:
    topology = broker_cleanup.topology(make_topology(queue_name))
    dead = f"{queue_name}.dead"
    async with amqp_connection.channel() as channel:
        await channel.declare_queue(dead, durable=True, arguments={"x-message-ttl": 5000})

    current = await plan(amqp_connection, topology)
    assert current.has_mismatch
    [mismatch] = current.mismatches
    assert (mismatch.kind, mismatch.name) == ("queue", dead)
    assert "inequivalent arg 'x-message-ttl'" in mismatch.detail
    assert {f"{queue_name}.x", queue_name} <= {e.name for e in current.missing}

    with pytest.raises(TopologyError) as caught:
        await declare(amqp_connection, topology)
    message = str(caught.value)
    assert dead in message and "x-message-ttl" in message
    assert "nothing was declared" in message and "delete" in message
    assert not await exists(amqp_connection, "queue", queue_name), "the work queue was created"
    assert not await exists(amqp_connection, "exchange", f"{queue_name}.x")


async def test_a_classic_queue_where_quorum_is_wanted_is_a_mismatch(
    amqp_connection: amqp.Connection, broker_cleanup: BrokerCleanup, queue_name: str
) -> None:
    topology = broker_cleanup.topology(make_topology(queue_name, "quorum"))
    wanted = topology.queue_declarations()[0].arguments
    classic = {k: v for k, v in wanted.items() if k not in QUORUM_ONLY}
    async with amqp_connection.channel() as channel:
        # The arguments a classic queue accepts, as wanted, so that the queue
        # type is the difference the broker reports.
        await channel.declare_queue(queue_name, durable=True, arguments=classic)

    [mismatch] = (await plan(amqp_connection, topology)).mismatches
    assert mismatch.name == queue_name
    assert "inequivalent arg 'x-queue-type'" in mismatch.detail
    with pytest.raises(TopologyError, match="x-queue-type"):
        await declare(amqp_connection, topology)
    assert not await exists(amqp_connection, "queue", f"{queue_name}.dead")


async def test_an_exchange_of_another_type_is_a_mismatch(
    amqp_connection: amqp.Connection, broker_cleanup: BrokerCleanup, queue_name: str
) -> None:
    topology = broker_cleanup.topology(make_topology(queue_name))
    async with amqp_connection.channel() as channel:
        await channel.declare_exchange(f"{queue_name}.x", type="direct", durable=True)

    [mismatch] = (await plan(amqp_connection, topology)).mismatches
    assert (mismatch.kind, mismatch.name) == ("exchange", f"{queue_name}.x")
    assert "inequivalent arg 'type'" in mismatch.detail


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
async def test_a_delayed_copy_comes_back_to_its_work_queue_only_when_due(
    amqp_connection: amqp.Connection,
    broker_cleanup: BrokerCleanup,
    queue_name: str,
    queue_type: QueueType,
) -> None:
    exchange = f"{queue_name}.x"
    # Bound to everything on the same exchange: if the chain dead-lettered through that
    # exchange (with any routing key), this queue would get a copy; its name ends with the
    # other's, so a loose binding on the deliver exchange would match it too.
    other = f"x.{queue_name}"
    topology = broker_cleanup.topology(
        Topology(
            exchanges=[Exchange(name=exchange)],
            queues=[
                WorkQueue(
                    name=queue_name,
                    type=queue_type,
                    bindings=[Binding(exchange=exchange, routing_key="order.paid")],
                ),
                WorkQueue(name=other, bindings=[Binding(exchange=exchange, routing_key="#")]),
            ],
        )
    )
    await declare(amqp_connection, topology)

    route = delays.route(queue_name, queue_type, 0.75)  # 75 ticks: 1001011, four queues
    async with amqp_connection.channel() as channel:
        started = time.monotonic()
        target = await channel.get_exchange(route.exchange)
        await target.publish(
            aio_pika.Message(
                b"{}", message_id="retry-1", delivery_mode=aio_pika.DeliveryMode.PERSISTENT
            ),
            routing_key=route.routing_key,
        )
        work = await channel.get_queue(queue_name)
        arrived = await get_within(work, 10)
        elapsed = time.monotonic() - started
        assert arrived is not None, "the delayed copy never reached the work queue"
        assert arrived.message_id == "retry-1"
        assert elapsed >= 0.75, "the copy came back early"
        deaths = arrived.headers["x-death"]
        assert isinstance(deaths, list)
        levels = {death["queue"] for death in deaths if isinstance(death, dict)}
        assert levels == {delays.level_name(queue_type, n) for n in (6, 3, 1, 0)}
        assert {death["reason"] for death in deaths if isinstance(death, dict)} == {"expired"}

        await asyncio.sleep(0.3)
        for name in (other, f"{queue_name}.dead"):
            queue = await channel.get_queue(name)
            assert await queue.get(no_ack=True, fail=False) is None, f"a copy reached {name}"


async def test_verify_raises_when_anything_is_missing_or_mismatched(
    amqp_connection: amqp.Connection, broker_cleanup: BrokerCleanup, queue_name: str
) -> None:
    topology = broker_cleanup.topology(make_topology(queue_name, "quorum"))
    with pytest.raises(TopologyError) as caught:
        await verify(amqp_connection, topology)
    message = str(caught.value)
    assert "rabbitretry topology declare" in message and "--declare" in message
    assert f"queue '{queue_name}.dead': missing" in message

    await declare(amqp_connection, topology)
    await verify(amqp_connection, topology)

    async with amqp_connection.channel() as channel:
        await channel.queue_delete(queue_name)
        await channel.queue_delete(f"{queue_name}.dead")
        await channel.declare_queue(f"{queue_name}.dead", durable=True)  # classic, not quorum
    with pytest.raises(TopologyError) as caught:
        await verify(amqp_connection, topology)
    message = str(caught.value)
    assert f"queue '{queue_name}': missing" in message
    assert f"queue '{queue_name}.dead': PRECONDITION_FAILED" in message
    assert "cannot change in place" in message and "--declare" in message


async def test_a_quorum_queue_declared_without_a_delivery_limit_is_a_mismatch(
    amqp_connection: amqp.Connection, broker_cleanup: BrokerCleanup, queue_name: str
) -> None:
    """A work queue declared before rabbitretry set x-delivery-limit: plan says so, with a way out.

    Redeclaring it with the limit would be a 406 PRECONDITION_FAILED, so declare refuses first.
    """
    wanted = WorkQueue(name=queue_name, type="quorum")
    topology = broker_cleanup.topology(Topology(queues=[wanted]))
    work = topology.queue_declarations()[0]
    assert work.arguments["x-delivery-limit"] == DEFAULT_DELIVERY_LIMIT
    legacy = {k: v for k, v in work.arguments.items() if k != "x-delivery-limit"}
    async with amqp_connection.channel() as channel:
        await channel.declare_queue(queue_name, durable=True, arguments=legacy)

    current = await plan(amqp_connection, topology)
    [mismatch] = current.mismatches
    assert (mismatch.kind, mismatch.name) == ("queue", queue_name)
    assert "inequivalent arg 'x-delivery-limit'" in mismatch.detail
    assert '"broker-default"' in mismatch.detail
    with pytest.raises(TopologyError, match="x-delivery-limit"):
        await declare(amqp_connection, topology)

    # The way out for a queue that must keep its messages: declare it as it is.
    as_it_is = Topology(queues=[wanted.model_copy(update={"delivery_limit": "broker-default"})])
    assert not (await plan(amqp_connection, as_it_is)).has_mismatch
    await declare(amqp_connection, as_it_is)
    await verify(amqp_connection, as_it_is)
