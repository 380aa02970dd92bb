"""The confirming publisher: a refusal names one message and fails no other.

Against the real broker. A publish to an exchange that does not exist closes the channel it
was sent on (404), and every publish in flight on that channel fails with the same error.
"""

from __future__ import annotations

import asyncio
import re

import pytest

from rabbitretry import Topology, WorkQueue
from rabbitretry.amqp import ConfirmingPublisher, Connection
from rabbitretry.topology import Exchange, declare
from tests.integration.conftest import BrokerCleanup
from tests.integration.test_outbox_unpublishable import drain

pytestmark = pytest.mark.asyncio


async def publish_all(
    publisher: ConfirmingPublisher, sends: list[tuple[str, str, str]]
) -> list[BaseException | None]:
    """(message_id, exchange, routing_key) all at once, as the outbox relay sends a batch."""
    return await asyncio.gather(
        *(
            publisher.publish(b"{}", exchange=exchange, routing_key=key, message_id=message_id)
            for message_id, exchange, key in sends
        ),
        return_exceptions=True,
    )


async def test_a_missing_exchange_refuses_its_message_alone(
    amqp_url: str,
    publisher: ConfirmingPublisher,
    queue_name: str,
    amqp_connection: Connection,
    broker_cleanup: BrokerCleanup,
) -> None:
    await declare(
        amqp_connection, broker_cleanup.topology(Topology(queues=[WorkQueue(name=queue_name)]))
    )
    sends = [(f"m{n}", "", queue_name) for n in range(5)]
    sends.insert(2, ("lost", f"{queue_name}.missing", "k"))
    results = await publish_all(publisher, sends)
    assert [type(r).__name__ for r in results] == ["NoneType"] * 2 + ["PublishRefused"] + [
        "NoneType"
    ] * 3
    assert (
        str(results[2])
        == f"the broker refused message 'lost': exchange '{queue_name}.missing' does not exist"
    )
    assert sorted(await drain(amqp_url, queue_name)) == [f"m{n}" for n in range(5)]


async def test_an_exchange_deleted_after_its_lookup_is_refused_and_looked_up_again(
    amqp_url: str,
    publisher: ConfirmingPublisher,
    queue_name: str,
    amqp_connection: Connection,
    broker_cleanup: BrokerCleanup,
) -> None:
    """Found once, then deleted: the 404 closes the publishing channel; the message is refused,
    the next one goes out on a fresh channel, and a declared-again exchange is found again.

    (Publishes in flight beside the refused one fail with the channel, and are sent again on a
    fresh one; frames of theirs still on the wire can make the broker close the connection,
    which then reads as ConnectionLost: an outage, retried, never a refusal.)"""
    gone = f"{queue_name}.gone"
    exchange = Exchange(name=gone, type="fanout")
    await declare(
        amqp_connection,
        broker_cleanup.topology(
            Topology(exchanges=[exchange], queues=[WorkQueue(name=queue_name)])
        ),
    )
    channel = await amqp_connection.channel()
    await (await channel.declare_queue(queue_name, passive=True)).bind(gone)
    assert await publish_all(publisher, [("first", gone, "")]) == [None]

    await channel.exchange_delete(gone)
    (refused,) = await publish_all(publisher, [("lost", gone, "")])
    assert str(refused) == f"the broker refused message 'lost': exchange '{gone}' does not exist"
    assert await publish_all(publisher, [("next", "", queue_name)]) == [None]

    await declare(amqp_connection, Topology(exchanges=[exchange]))
    await (await channel.declare_queue(queue_name, passive=True)).bind(gone)
    assert await publish_all(publisher, [("again", gone, "")]) == [None]
    assert await drain(amqp_url, queue_name) == ["first", "next", "again"]


OVER_A_FRAME = {"big": "x" * 200_000}  # RabbitMQ's default frame_max is 131,072 bytes


async def test_a_header_table_over_the_frame_size_is_refused_alone_and_the_connection_lives(
    amqp_url: str,
    publisher: ConfirmingPublisher,
    queue_name: str,
    amqp_connection: Connection,
    broker_cleanup: BrokerCleanup,
) -> None:
    """A content header that does not fit in one frame makes RabbitMQ close the whole
    connection (FRAME_ERROR, frame_too_large): every publish in flight on it failed as a lost
    connection, an outage, retried for ever. It is content: refused before it is sent."""
    await declare(
        amqp_connection, broker_cleanup.topology(Topology(queues=[WorkQueue(name=queue_name)]))
    )
    results = await asyncio.gather(
        publisher.publish(b"{}", routing_key=queue_name, message_id="m0"),
        publisher.publish(b"{}", routing_key=queue_name, message_id="big", headers=OVER_A_FRAME),
        publisher.publish(b"{}", routing_key=queue_name, message_id="m2"),
        return_exceptions=True,
    )
    assert [type(r).__name__ for r in results] == ["NoneType", "UnpublishableError", "NoneType"]
    assert re.fullmatch(
        r"message 'big' cannot be published: its properties and headers take 2000\d\d bytes, "
        r"more than one frame of this connection holds \(131072 bytes, the frame_max the broker "
        r"set\); RabbitMQ would close the connection",
        str(results[1]),
    ), str(results[1])
    assert publisher.available
    await publisher.publish(b"{}", routing_key=queue_name, message_id="m3")
    assert sorted(await drain(amqp_url, queue_name)) == ["m0", "m2", "m3"]
