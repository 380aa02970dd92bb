"""Connections to RabbitMQ: the first connection, failing over between a cluster's nodes, and
why a connection could not be made, in the broker's terms.

Consuming and publishing use separate connections: a broker under a memory or disk alarm
blocks publishing connections, and the acks sent on them, so a publisher must never share a
connection with consumers.

A lost connection is routine (a node stops, the broker restarts, the network blips): it is
logged as one WARNING when it goes and one INFO line when it is back, by
:class:`FailoverConnection`. The AMQP libraries' own lines about it (errors with tracebacks from
every channel's close callback) are demoted to DEBUG by a filter :func:`connect` installs.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

import aio_pika
import aiormq
import yarl
from aio_pika.abc import (
    AbstractChannel,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)

from rabbitretry import logs, urls
from rabbitretry.errors import ConfigurationError, ServiceUnavailable

log = logging.getLogger("rabbitretry.amqp")

# The names the rest of rabbitretry uses for aio-pika's types, so that only amqp/ imports it.
IncomingMessage = AbstractIncomingMessage
Channel = AbstractChannel
Queue = AbstractQueue
Connection = AbstractRobustConnection

# What a channel operation raises when the channel or its connection has gone away.
CHANNEL_ERRORS = (
    aiormq.exceptions.AMQPError,
    aiormq.exceptions.ChannelInvalidStateError,  # a RuntimeError, not an AMQPError
    aio_pika.exceptions.AMQPException,
    ConnectionError,
    asyncio.TimeoutError,
)


CONNECT_TIMEOUT = 10.0
"""Seconds the first connection may take; a broker that does not answer by then is an error."""

HEARTBEAT = 10
"""Seconds: the AMQP heartbeat asked for unless the URL sets ``heartbeat=`` (0 turns it off).

The broker drops a connection that stays silent for about 2.5 heartbeats, and only then
redelivers its unacknowledged messages: a hung (not dead) worker holds its deliveries about
25 s at 10 s, against minutes at the client's own default of 60 s. RabbitMQ advises against
values under 5 s (false alarms on a busy host). A handler that blocks the event loop for longer
than that loses its connection: the broker redelivers, the ledger's lease decides."""


async def connect(url: str, *, name: str = "rabbitretry") -> Connection:
    """A robust connection (it reconnects and restores channels); a clear error if none.

    ``url`` may list several nodes of a cluster, comma-separated: the connection goes to the
    first that answers and, when its node goes away, fails over to the next (round the list),
    restoring its channels, declarations and consumers there.

    The URLs are checked before anything is tried (:func:`rabbitretry.urls.check_amqp_urls`),
    and each first connection is bounded: a wrong password, a virtual host that does not
    exist, a port where nothing listens or a broker that does not answer is a
    :class:`ServiceUnavailable` saying which (for each node), with the URL masked, never a
    retry loop.
    """
    nodes = urls.split_urls(url)
    endpoints = urls.check_amqp_urls(url)
    _demote_connection_loss_lines()
    reasons = []
    for start, (node_url, endpoint) in enumerate(zip(nodes, endpoints, strict=True)):
        connection = await _connect_from(nodes, start, name)
        if not isinstance(connection, Exception):
            return connection
        reasons.append(_why_not_connected(connection, node_url, endpoint))
    if len(reasons) == 1:
        raise ServiceUnavailable(reasons[0])
    raise ServiceUnavailable(
        f"cannot connect to RabbitMQ at any of its {len(reasons)} URLs: " + "; ".join(reasons)
    )


async def _connect_from(nodes: list[str], start: int, name: str) -> Connection | Exception:
    """A :class:`FailoverConnection` whose first connection went to ``nodes[start]``, or why
    that connection failed."""
    url = nodes[start]
    try:
        connection = FailoverConnection(nodes, start, client_properties={"connection_name": name})
    except ValueError as error:  # a query parameter aio-pika cannot read
        raise ConfigurationError(
            f"the AMQP URL {urls.mask_url(url)} is not usable: {urls.scrub(str(error), url)}"
        ) from None
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT + 5):
            with _quiet_transport_errors():
                await connection.connect(timeout=CONNECT_TIMEOUT)
    except BaseException as error:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(connection.close(), 5)
        if not isinstance(error, Exception):
            raise
        return error
    return connection


class FailoverConnection(aio_pika.RobustConnection):
    """A robust connection that knows a cluster's nodes: each time its connection closes or
    an attempt fails, the next attempt goes to the next node, round the list.

    aio-pika's own robust connection retries one URL for ever, which keeps a worker idle for
    as long as its node is down although the queues (quorum, replicated) are served by the
    others. Each node's URL is dialled with the heartbeat of the first URL (or
    :data:`HEARTBEAT`) unless it sets its own; the other query options (timeouts) are read
    from the first URL.

    A loss is logged once, as a WARNING naming the connection, the node and the broker's
    reason; the attempts that fail while it reconnects at DEBUG; and its return as one INFO
    line naming the node that took over and how long it took.
    """

    def __init__(self, nodes: list[str], start: int, **kwargs: Any) -> None:
        heartbeat = urls.amqp_heartbeat(nodes[0])
        dialled = [
            yarl.URL(urls.with_heartbeat(node, HEARTBEAT if heartbeat is None else heartbeat))
            for node in nodes
        ]
        super().__init__(dialled[start], **kwargs)
        self._nodes = dialled
        self._shown = [urls.mask_url(node) for node in nodes]
        self._node = start
        self._name = str((kwargs.get("client_properties") or {}).get("connection_name", ""))
        self._lost_at: float | None = None

    @property
    def node(self) -> str:
        """The URL (password masked, as given) of the node this connection is on, or tries."""
        return self._shown[self._node]

    async def _on_connection_close(self, closing: asyncio.Future[Any]) -> None:
        await super()._on_connection_close(closing)
        # connection_attempt counts successful connections: before the first, a failure ends
        # this object (connect() tries the next node with a new one).
        if self.close_called or self.is_closed or not self.connection_attempt:
            return
        left = self.node
        if len(self._nodes) > 1:
            self._node = (self._node + 1) % len(self._nodes)
            self.url = self._nodes[self._node]
        self._log_loss(left, _closing_reason(closing))

    async def _on_connected(self) -> None:
        await super()._on_connected()
        if self._lost_at is not None:
            log.info(
                "RabbitMQ connection %r is back, on %s, after %.1f s",
                self._name,
                self.node,
                time.monotonic() - self._lost_at,
            )
            self._lost_at = None

    def _log_loss(self, left: str, reason: str) -> None:
        moving = f"; next attempt at {self.node}" if len(self._nodes) > 1 else ""
        if self._lost_at is not None:  # an attempt failed while reconnecting
            log.debug(
                "RabbitMQ connection %r: %s did not answer (%s)%s", self._name, left, reason, moving
            )
            return
        self._lost_at = time.monotonic()
        log.warning(
            "RabbitMQ connection %r to %s lost (%s); reconnecting%s",
            self._name,
            left,
            reason,
            moving,
        )


def _closing_reason(closing: asyncio.Future[Any]) -> str:
    """Why a connection closed, from the future aio-pika hands its close callbacks."""
    if closing.cancelled():
        return "cancelled"
    error = closing.exception()
    if isinstance(error, asyncio.CancelledError):
        # aiormq cancels its reader when no frame came for three heartbeats.
        return "no frame from the broker for three heartbeats: it stopped answering"
    return "closed" if error is None else error_text(error)


def error_text(error: BaseException) -> str:
    """An error in one line, for a log: its type, and its text when it has one (a broker's
    refusal as its reply text and code, as ``CONNECTION_FORCED - ... (reply code 320)``)."""
    args = error.args
    if (
        isinstance(error, aiormq.exceptions.AMQPError)
        and len(args) == 2
        and isinstance(args[0], int)
        and isinstance(args[1], str)
    ):
        return f"{args[1]} (reply code {args[0]})"
    text = str(error)
    if not text and isinstance(error, aiormq.exceptions.ChannelInvalidStateError):
        text = "the channel is closed"  # aio-pika raises it bare for a closed channel
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _why_not_connected(error: Exception, url: str, endpoint: urls.Endpoint) -> str:
    """One sentence for a failed first connection: what the broker said, in its terms."""
    where = f"cannot connect to RabbitMQ at {urls.mask_url(url)}"
    text = urls.scrub(str(error) or type(error).__name__, url)
    if isinstance(error, aiormq.exceptions.ProbableAuthenticationError) or (
        "ACCESS_REFUSED" in text
    ):
        return (
            f"{where}: the broker refused the login of user {endpoint.user!r} (ACCESS_REFUSED): "
            "the user name or password in RABBITRETRY_AMQP_URL is wrong"
        )
    if "Connection.OpenOk" in text and "Connection.Close" in text:
        # RabbitMQ answers Connection.Open for a virtual host that does not exist, or that
        # the user may not use, with Connection.Close; aiormq loses its reply text.
        return (
            f"{where}: the broker refused virtual host {endpoint.path!r} for user "
            f"{endpoint.user!r}: it does not exist or the user may not use it (check the "
            f"virtual host in RABBITRETRY_AMQP_URL, or create it: rabbitmqctl add_vhost "
            f"{endpoint.path})"
        )
    causes = [error, error.__cause__, error.__context__]
    codes = {c.args[0] for c in causes if isinstance(c, OSError) and c.args} | {
        c.errno for c in causes if isinstance(c, OSError) and c.errno is not None
    }
    if errno.ECONNREFUSED in codes or any(isinstance(c, ConnectionRefusedError) for c in causes):
        return (
            f"{where}: nothing listens on {endpoint.address} (connection refused); is the "
            "broker running, and is RABBITRETRY_AMQP_URL right?"
        )
    if any(isinstance(c, socket.gaierror) for c in causes) or codes & _NAME_NOT_FOUND:
        return (
            f"{where}: host {endpoint.address.rpartition(':')[0]!r} not found ({text}); is "
            "the host in RABBITRETRY_AMQP_URL right?"
        )
    if isinstance(error, TimeoutError):
        return (
            f"{where}: no answer within {CONNECT_TIMEOUT:.0f} s; is the broker running, and is "
            "RABBITRETRY_AMQP_URL right?"
        )
    return f"{where}: {text}. Is the broker running, and is RABBITRETRY_AMQP_URL right?"


_NAME_NOT_FOUND = {socket.EAI_NONAME, socket.EAI_AGAIN, getattr(socket, "EAI_NODATA", -5)}


class _DropTransportErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("error when creating transport")


@contextlib.contextmanager
def _quiet_transport_errors() -> Iterator[None]:
    """Hide aiormq's own log line for a failed first connection: :func:`connect` raises a
    clearer error, and a start-up failure should be one line."""
    logger = logging.getLogger("aiormq.connection")
    quiet = _DropTransportErrors()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


# What the AMQP libraries log about a lost connection, with no exception to tell it by.
_LOSS_LINES = (
    "Unexpected connection close from remote",  # aiormq: the broker's Connection.Close
    "Connection to %s closed. Reconnecting",  # aio-pika
    'Connection attempt to "%s" cancelled',  # aio-pika
    "Server connection %r was stuck",  # aiormq: no frame within 3 heartbeats, a silent broker
)


def _is_lost_connection(error: BaseException) -> bool:
    """True for what a lost connection or a channel closed under it raises; not for a
    refusal about one message, a decoding failure or a bug."""
    if isinstance(error, OSError | EOFError | aiormq.exceptions.ChannelInvalidStateError):
        return True  # ConnectionError and aiormq's AMQPConnectionError are OSErrors
    # aiormq: opening a channel on a closed connection ("<Connection ...> closed").
    return type(error) is RuntimeError and str(error).endswith(" closed")


def is_connection_loss_noise(record: logging.LogRecord) -> bool:
    """True for an AMQP library's record about a lost connection: the broker's close, the
    reader that stopped, every channel's close callback failing, each failed reconnect.
    rabbitretry says it once (:class:`FailoverConnection`)."""
    if isinstance(record.msg, str) and record.msg.startswith(_LOSS_LINES):
        return True
    errors = [record.exc_info[1]] if record.exc_info and record.exc_info[1] else []
    if isinstance(record.args, tuple):
        errors += [arg for arg in record.args if isinstance(arg, BaseException)]
    return any(_is_lost_connection(error) for error in errors)


def _demote_connection_loss_lines() -> None:
    """Demote the AMQP libraries' lines about a lost connection to DEBUG (idempotent)."""
    logs.demote(logs.QUIET_LIBRARIES, is_connection_loss_noise)


def node_url(connection: Connection) -> str:
    """The URL (password masked) of the node ``connection`` is on, or was last on."""
    if isinstance(connection, FailoverConnection):
        return connection.node
    return urls.mask_url(str(getattr(connection, "url", "")))


def cancelled_by_a_closing_connection() -> bool:
    """Whether a ``CancelledError`` just caught came from a connection that closed under the
    call (aiormq rejects every future in flight with one when it closes a connection itself:
    a silent broker, no frame for three heartbeats), not from a cancellation of this task
    (``task.cancel()``, a timeout), which must go on."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() == 0


def is_up(connection: Connection) -> bool:
    """True while ``connection`` is open: ``is_closed`` stays False while a robust connection
    reconnects, its ``connected`` event does not."""
    return not connection.is_closed and connection.connected.is_set()
