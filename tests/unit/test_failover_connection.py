"""FailoverConnection: which node the next connection attempt goes to, the heartbeat it asks
for, and what it logs when it loses its connection (no broker needed)."""

from __future__ import annotations

import asyncio
import logging

import aiormq
import pytest

from rabbitretry import amqp
from rabbitretry.amqp import FailoverConnection, node_url

pytestmark = pytest.mark.asyncio

NODES = [f"amqp://u:s3cret@127.0.0.1:{5700 + n}/" for n in (1, 2, 3)]
FORCED = aiormq.exceptions.ConnectionClosed(320, "CONNECTION_FORCED - broker forced closure")


async def lost(connection: FailoverConnection, error: BaseException | None = None) -> None:
    """What aio-pika calls when the connection closes, or an attempt fails."""
    closing: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    closing.set_exception(error or ConnectionError("gone"))
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


async def test_each_node_is_dialled_with_the_first_urls_heartbeat_or_the_default() -> None:
    default = FailoverConnection(NODES, 0)
    assert [url.query["heartbeat"] for url in default._nodes] == [str(amqp.HEARTBEAT)] * 3
    assert amqp.HEARTBEAT == 10  # docs/operations.md says so
    first_sets_it = FailoverConnection([f"{NODES[0]}?heartbeat=30", NODES[1]], 1)
    assert first_sets_it.url.query["heartbeat"] == "30"
    # Shown as the user wrote it.
    assert node_url(first_sets_it) == "amqp://u:***@127.0.0.1:5702/"


async def test_a_loss_is_one_warning_naming_the_node_and_the_brokers_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="rabbitretry.amqp")
    connection = FailoverConnection(
        NODES, 0, client_properties={"connection_name": "rabbitretry-consume w1"}
    )
    connection.connection_attempt = 1
    await lost(connection, FORCED)
    for _ in range(3):  # the attempts that fail while it reconnects
        await lost(connection, ConnectionRefusedError(111, "Connection refused"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [
        "RabbitMQ connection 'rabbitretry-consume w1' to amqp://u:***@127.0.0.1:5701/ lost "
        "(CONNECTION_FORCED - broker forced closure (reply code 320)); reconnecting; next "
        "attempt at amqp://u:***@127.0.0.1:5702/"
    ]
    assert len([r for r in caplog.records if r.levelno == logging.DEBUG]) == 3


@pytest.mark.parametrize(
    ("error", "text"),
    [
        (FORCED, "CONNECTION_FORCED - broker forced closure (reply code 320)"),
        (
            aiormq.exceptions.ChannelInvalidStateError(),
            "ChannelInvalidStateError: the channel is closed",
        ),
        (TimeoutError(), "TimeoutError"),
        (ConnectionResetError(104, "reset"), "ConnectionResetError: [Errno 104] reset"),
    ],
)
async def test_an_error_is_told_by_its_type_and_text(error: BaseException, text: str) -> None:
    assert amqp.error_text(error) == text


def library_record(
    name: str, message: str, *args: object, error: BaseException | None = None
) -> logging.LogRecord:
    return logging.makeLogRecord(
        {"name": name, "levelno": logging.ERROR, "levelname": "ERROR", "msg": message}
        | {"args": args, "exc_info": (type(error), error, None) if error else None}
    )


CLOSED = RuntimeError('<Connection: "amqp://guest:******@127.0.0.1:5672/"> closed')


@pytest.mark.parametrize(
    "record",
    [
        library_record(
            "aiormq.connection",
            'Unexpected connection close from remote "%s", Connection.Close(reply_code=%r, '
            "reply_text=%r)",
            "amqp://h/",
            320,
            "CONNECTION_FORCED",
        ),
        library_record(
            "aiormq.connection", "Cancelling cause reader exited abnormally", error=FORCED
        ),
        library_record("aio_pika.tools", "Callback %r error: %s: %s", "cb", "RuntimeError", CLOSED),
        library_record(
            "aio_pika.tools",
            "Callback %r error: %s: %s",
            "cb",
            "ChannelInvalidStateError",
            aiormq.exceptions.ChannelInvalidStateError(),
        ),
        library_record(
            "aiormq.connection", "error when creating transport: %r", ConnectionRefusedError()
        ),
    ],
)
async def test_the_libraries_lines_about_a_lost_connection_are_noise(
    record: logging.LogRecord,
) -> None:
    assert amqp.is_connection_loss_noise(record)


@pytest.mark.parametrize(
    "record",
    [
        # A frame the client cannot decode is not a lost connection: keep it.
        library_record(
            "aiormq.connection", "Cancelling cause reader exited abnormally", error=RecursionError()
        ),
        library_record("aiormq.connection", "Connection %r was blocked by: %r", "c", "low memory"),
        library_record(
            "aio_pika.robust_connection",
            "Reconnect attempt failed %s due to %s: %s. Retrying after %r seconds.",
            "c",
            "ChannelNotFoundEntity",
            aiormq.exceptions.ChannelNotFoundEntity("NOT_FOUND - no queue 'q'"),
            5,
        ),
    ],
)
async def test_other_lines_of_the_libraries_are_kept(record: logging.LogRecord) -> None:
    assert not amqp.is_connection_loss_noise(record)
