"""The one module that talks to aio-pika's connections and channels.

Consuming and publishing use separate connections: a broker under a memory or disk alarm
blocks publishing connections, and the acks sent on them, so a publisher must never share a
connection with consumers.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Literal

import aio_pika
import aiormq
import yarl
from aio_pika.abc import (
    AbstractChannel,
    AbstractIncomingMessage,
    AbstractRobustConnection,
    DeliveryMode,
)

from rabbitretry import urls
from rabbitretry.amqp import lenient_frames
from rabbitretry.errors import (
    ConfigurationError,
    ConnectionLost,
    PublishError,
    ServiceUnavailable,
    TopologyError,
    UnpublishableError,
    UnroutableError,
)
from rabbitretry.message.headers import publishable_properties
from rabbitretry.message.wire import why_unencodable

# A foreign message the client cannot decode would close the connection, again on every
# redelivery: decode what can be decoded leniently (rabbitretry/lenient_frames.py).
lenient_frames.install()

log = logging.getLogger("rabbitretry.amqp")

IncomingMessage = AbstractIncomingMessage
Channel = AbstractChannel
Connection = AbstractRobustConnection

CHANNEL_ERRORS = (
    aiormq.exceptions.AMQPError,
    aiormq.exceptions.ChannelInvalidStateError,  # a RuntimeError, not an AMQPError
    aio_pika.exceptions.AMQPException,
    ConnectionError,
    asyncio.TimeoutError,
)


CONNECT_TIMEOUT = 10.0
"""Seconds the first connection may take; a broker that does not answer by then is an error."""


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
        connection = FailoverConnection(
            [yarl.URL(node) for node in nodes], start, client_properties={"connection_name": name}
        )
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
    others. Query options (heartbeat, timeouts) are read from the first URL.
    """

    def __init__(self, nodes: list[yarl.URL], start: int, **kwargs: Any) -> None:
        super().__init__(nodes[start], **kwargs)
        self._nodes = nodes
        self._node = start

    async def _on_connection_close(self, closing: asyncio.Future[Any]) -> None:
        await super()._on_connection_close(closing)
        # connection_attempt counts successful connections: before the first, a failure ends
        # this object (connect() tries the next node with a new one).
        if self.close_called or self.is_closed or not self.connection_attempt:
            return
        if len(self._nodes) == 1:
            return
        self._node = (self._node + 1) % len(self._nodes)
        self.url = self._nodes[self._node]
        log.warning("RabbitMQ connection lost or refused; next attempt at %s", node_url(self))


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


ProbeOutcome = Literal["ok", "not-found", "precondition-failed"]


class Prober:
    """Runs declarations that the broker may refuse, on a plain (non-robust) channel.

    A 404 or 406 closes the channel it happened on; a robust channel would reopen itself and
    remember the declaration for later restores, so probes use a plain one and open a fresh one
    after each refusal. Any other refusal is a :class:`TopologyError`, a lost connection a
    :class:`ServiceUnavailable`.
    """

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._channel: Channel | None = None

    async def channel(self) -> Channel:
        if self._channel is None or self._channel.is_closed:
            await asyncio.wait_for(self._connection.ready(), timeout=30)  # if reconnecting
            channel = aio_pika.Channel(self._connection, publisher_confirms=False)
            await channel.initialize()
            self._channel = channel
        return self._channel

    async def attempt(
        self, action: Callable[[Channel], Awaitable[object]]
    ) -> tuple[ProbeOutcome, str]:
        """Run ``action``: the outcome and, for a refusal, the broker's reply text."""
        try:
            await action(await self.channel())
        except aiormq.exceptions.ChannelNotFoundEntity as error:
            return "not-found", str(error)
        except aiormq.exceptions.ChannelPreconditionFailed as error:
            return "precondition-failed", str(error)
        except aiormq.exceptions.ChannelClosed as error:
            raise TopologyError(f"RabbitMQ refused: {error}") from error
        except (*CHANNEL_ERRORS, aiormq.exceptions.ChannelInvalidStateError) as error:
            raise ServiceUnavailable(
                f"lost the connection to RabbitMQ: {error or type(error).__name__}"
            ) from error
        return "ok", ""

    async def close(self) -> None:
        if self._channel is not None and not self._channel.is_closed:
            await self._channel.close()
        self._channel = None

    async def __aenter__(self) -> Prober:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()


class ConfirmingPublisher:
    """Publishes on one confirming channel: persistent, mandatory, and raises on any loss.

    aio-pika returns quietly when a mandatory message comes back unroutable; here that is an
    :class:`UnroutableError`, and a broker nack or a lost channel is a :class:`PublishError`.
    A message AMQP cannot carry is an :class:`UnpublishableError`, raised before anything is
    sent (some such messages make RabbitMQ close the whole connection).
    """

    def __init__(self, connection: Connection, channel: Channel) -> None:
        self._connection = connection
        self._channel = channel
        self._in_flight: dict[str, asyncio.Event] = {}  # message_id -> set when settled

    @classmethod
    async def open(cls, connection: Connection) -> ConfirmingPublisher:
        return cls(connection, await cls._new_channel(connection))

    @staticmethod
    async def _new_channel(connection: Connection) -> Channel:
        return await connection.channel(publisher_confirms=True, on_return_raises=True)

    async def _ready_channel(self) -> Channel:
        # The broker closes a channel on a publish to a missing exchange (404); the next
        # message gets a new one instead of failing too.
        if self._channel.is_closed and not self._connection.is_closed:
            with contextlib.suppress(*CHANNEL_ERRORS):
                await self._channel.close()
            self._channel = await self._new_channel(self._connection)
        return self._channel

    async def publish(
        self,
        body: bytes,
        *,
        routing_key: str,
        exchange: str = "",
        message_id: str,
        headers: Mapping[str, Any] | None = None,
        properties: Mapping[str, Any] | None = None,
        timeout: float = 30.0,
    ) -> None:
        props = dict(properties or {})
        props.pop("expiration", None)  # a copy must never expire on its way
        problem = why_unencodable(
            exchange=exchange,
            routing_key=routing_key,
            message_id=message_id,
            headers=headers,
            properties=props,
        )
        if problem is not None:
            raise UnpublishableError(problem)
        message = aio_pika.Message(
            body,
            headers=dict(headers or {}),
            message_id=message_id,
            delivery_mode=DeliveryMode.PERSISTENT,
            **props,
        )
        try:
            # Bounded as a whole: on a robust connection that is reconnecting, getting the
            # channel waits for the reconnect, which may never come.
            async with asyncio.timeout(timeout), self._alone(message_id):
                await self._publish(message, exchange, routing_key)
        except (TypeError, ValueError) as error:
            # pamqp refusing to encode something why_unencodable let through: nothing was
            # sent (aiormq encodes the frames before writing them), and no retry can help.
            raise UnpublishableError(
                f"message {message_id!r} cannot be encoded as AMQP: {error}"
            ) from error
        except aio_pika.exceptions.PublishError as error:
            raise UnroutableError(
                f"no queue is bound for exchange {exchange or '(default)'!r} "
                f"with routing key {routing_key!r}"
            ) from error
        except aio_pika.exceptions.DeliveryError as error:
            raise PublishError(f"the broker refused message {message_id!r}: {error}") from error
        except (*CHANNEL_ERRORS, RuntimeError) as error:
            # aio-pika raises a bare RuntimeError for a channel whose connection has closed.
            raise ConnectionLost(
                f"publishing message {message_id!r} failed: {error or type(error).__name__}"
            ) from error

    @contextlib.asynccontextmanager
    async def _alone(self, message_id: str) -> AsyncIterator[None]:
        """Wait until no other publish of ``message_id`` is in flight here, then hold the id.

        aiormq matches a returned (unroutable) message to its publish by ``message_id`` alone:
        of two publishes of one id in flight on a channel, the return of one would fail the
        other, and the returned one would pass as confirmed.
        """
        while (other := self._in_flight.get(message_id)) is not None:
            await other.wait()
        settled = self._in_flight[message_id] = asyncio.Event()
        try:
            yield
        finally:
            del self._in_flight[message_id]
            settled.set()

    async def _publish(self, message: aio_pika.Message, exchange: str, routing_key: str) -> None:
        channel = await self._ready_channel()
        target = (
            channel.default_exchange
            if exchange == ""
            else await channel.get_exchange(exchange, ensure=False)
        )
        await target.publish(message, routing_key=routing_key, mandatory=True)

    @property
    def available(self) -> bool:
        """False while the connection is down (a robust connection is reconnecting)."""
        return is_up(self._connection)

    async def close(self) -> None:
        if not self._channel.is_closed:
            await self._channel.close()


def node_url(connection: Connection) -> str:
    """The URL (password masked) of the node ``connection`` is on, or was last on."""
    return urls.mask_url(str(getattr(connection, "url", "")))


def is_up(connection: Connection) -> bool:
    """True while ``connection`` is open: ``is_closed`` stays False while a robust connection
    reconnects, its ``connected`` event does not."""
    return not connection.is_closed and connection.connected.is_set()


def message_properties(message: IncomingMessage) -> dict[str, Any]:
    """The AMQP properties worth keeping in the ledger snapshot and on republished copies."""
    names = ("content_type", "content_encoding", "correlation_id", "type", "app_id", "priority")
    props: dict[str, Any] = {
        name: getattr(message, name) for name in names if getattr(message, name) is not None
    }
    if message.timestamp is not None:
        props["timestamp"] = message.timestamp.timestamp()
    return props


def restore_properties(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`message_properties`, for a copy rebuilt from the ledger."""
    props = publishable_properties(snapshot)
    if "timestamp" in props:
        props["timestamp"] = datetime.fromtimestamp(float(props["timestamp"]), tz=UTC)
    return props
