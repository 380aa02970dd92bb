"""Fixtures for tests against the real broker and database."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import pytest

from rabbitretry import Consumer, WorkQueue, amqp, topology_of
from rabbitretry.topology import Exchange, Topology, declare
from tests.proxy import Proxy


@pytest.fixture
async def amqp_connection(amqp_url: str) -> AsyncIterator[amqp.Connection]:
    """A robust connection for this test, closed afterwards."""
    connection = await amqp.connect(amqp_url, name="rabbitretry-tests")
    yield connection
    await connection.close()


class BrokerCleanup:
    """Remembers what a test declares (or might declare) so that teardown deletes it."""

    def __init__(self) -> None:
        self.queues: list[str] = []
        self.exchanges: list[str] = []

    def topology(self, topology: Topology) -> Topology:
        self.queues += [q.name for q in topology.queue_declarations() if not q.shared]
        self.exchanges += [e.name for e in topology.exchanges]
        return topology

    def queue(self, name: str) -> str:
        self.queues.append(name)
        return name

    def exchange(self, name: str) -> str:
        self.exchanges.append(name)
        return name

    async def delete_all(self, connection: amqp.Connection) -> None:
        # Deleting what does not exist is a no-op; a refusal only reopens the probe channel.
        async with amqp.Prober(connection) as prober:
            for queue in dict.fromkeys(self.queues):
                await prober.attempt(_delete_queue(queue))
            for exchange in dict.fromkeys(self.exchanges):
                await prober.attempt(_delete_exchange(exchange))


def _delete_queue(name: str) -> Callable[[amqp.Channel], Awaitable[object]]:
    return lambda channel: channel.queue_delete(name)


def _delete_exchange(name: str) -> Callable[[amqp.Channel], Awaitable[object]]:
    return lambda channel: channel.exchange_delete(name)


@pytest.fixture
async def broker_cleanup(amqp_url: str) -> AsyncIterator[BrokerCleanup]:
    """Register topologies, queues and exchanges; all of them are deleted after the test."""
    cleanup = BrokerCleanup()
    yield cleanup
    connection = await amqp.connect(amqp_url, name="rabbitretry-tests-cleanup")
    try:
        await cleanup.delete_all(connection)
    finally:
        await connection.close()


@pytest.fixture
async def work_queue(
    queue_name: str, amqp_connection: amqp.Connection, broker_cleanup: BrokerCleanup
) -> str:
    """A plain work queue of this test's own, declared (reached through the default
    exchange): its name."""
    topology = broker_cleanup.topology(Topology(queues=[WorkQueue(name=queue_name)]))
    await declare(amqp_connection, topology)
    return queue_name


@pytest.fixture
async def unbound_exchange(
    queue_name: str, amqp_connection: amqp.Connection, broker_cleanup: BrokerCleanup
) -> str:
    """A direct exchange of this test's own that no queue is bound to: a mandatory publish
    to it comes back unroutable. Its name."""
    name = f"{queue_name}.nowhere"
    await declare(
        amqp_connection, broker_cleanup.topology(Topology(exchanges=[Exchange(name=name)]))
    )
    return name


@pytest.fixture
async def publisher(amqp_url: str) -> AsyncIterator[amqp.ConfirmingPublisher]:
    """A confirming publisher on a connection of this test's own."""
    connection = await amqp.connect(amqp_url)
    yield await amqp.ConfirmingPublisher.open(connection)
    await connection.close()


@pytest.fixture
async def cleanup(broker_cleanup: BrokerCleanup) -> AsyncIterator[list[type[Consumer[Any]]]]:
    """Append consumer classes; their queues and exchanges are deleted after the test."""
    consumers: list[type[Consumer[Any]]] = []
    yield consumers
    for consumer in consumers:
        broker_cleanup.topology(topology_of([consumer]))


@pytest.fixture
async def broker_proxy(amqp_url: str) -> AsyncIterator[Proxy]:
    """A cuttable TCP proxy in front of RabbitMQ (``proxy.url_for(amqp_url)``)."""
    parts = urlsplit(amqp_url)
    proxy = await Proxy(parts.hostname or "127.0.0.1", parts.port or 5672).start()
    yield proxy
    await proxy.close()


@pytest.fixture
async def database_proxy(database_url: str) -> AsyncIterator[Proxy]:
    """A TCP proxy in front of PostgreSQL to cut or stall (``proxy.url_for(database_url)``)."""
    parts = urlsplit(database_url)
    proxy = await Proxy(parts.hostname or "127.0.0.1", parts.port or 5432).start()
    yield proxy
    await proxy.close()
