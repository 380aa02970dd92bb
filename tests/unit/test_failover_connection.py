"""FailoverConnection: which node the next connection attempt goes to (no broker needed)."""

from __future__ import annotations

import asyncio

import pytest
import yarl

from rabbitretry.amqp import FailoverConnection, node_url

pytestmark = pytest.mark.asyncio

NODES = [yarl.URL(f"amqp://u:s3cret@127.0.0.1:{5700 + n}/") for n in (1, 2, 3)]


async def lost(connection: FailoverConnection) -> None:
    """What aio-pika calls when the connection closes, or an attempt fails."""
    closing: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    closing.set_exception(ConnectionError("gone"))
    await connection._on_connection_close(closing)


async def test_each_loss_moves_to_the_next_node_round_the_list() -> None:
    connection = FailoverConnection(NODES, 1)
    connection.connection_attempt = 1  # it has been connected once
    seen = [connection.url.port]
    for _ in range(3):
        await lost(connection)
        seen.append(connection.url.port)
    assert seen == [5702, 5703, 5701, 5702]
    assert node_url(connection) == "amqp://u:***@127.0.0.1:5702/"


async def test_before_its_first_connection_it_stays_on_its_node() -> None:
    # connect() tries the next node with a new object; this one is abandoned.
    connection = FailoverConnection(NODES, 0)
    await lost(connection)
    assert connection.url.port == 5701


async def test_a_closed_connection_stays_where_it_was() -> None:
    connection = FailoverConnection(NODES, 0)
    connection.connection_attempt = 1
    await connection.close()
    await lost(connection)
    assert connection.url.port == 5701
