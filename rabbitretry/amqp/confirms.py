"""Publishing with publisher confirms and ``mandatory``: a message is either taken by the
broker and routed to a queue, or the publish raises.

A refusal names one message; it must not fail the others. The broker answers a publish to an
exchange that does not exist (or that the user may not write to) by closing the channel, and
every publish in flight on that channel fails with the same error; frames still on their way
on it then make the broker close the whole connection. So an exchange is looked up once, with
a passive declare on a channel of its own, before the first publish to it: a missing one is a
:class:`PublishRefused` for that message alone, and nothing is sent. An exchange deleted later
still closes the channel: the publish that named it raises :class:`PublishRefused`, and the
others are sent again on a fresh channel. A refused outbox row, re-drive or replay stops
nothing behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import DeliveryMode

from rabbitretry.amqp.connection import (
    CHANNEL_ERRORS,
    Channel,
    Connection,
    cancelled_by_a_closing_connection,
    is_up,
)
from rabbitretry.amqp.frame_size import frame_max, why_over_a_frame
from rabbitretry.amqp.probe import Prober
from rabbitretry.errors import (
    ConnectionLost,
    PublishError,
    PublishRefused,
    ServiceUnavailable,
    TopologyError,
    UnpublishableError,
    UnroutableError,
)
from rabbitretry.message.wire import why_unencodable

SENDS_PAST_OTHERS_REFUSALS = 3
"""How often a message is sent again after other messages' refusals closed its channel."""


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
        self._reopening = asyncio.Lock()  # one new channel, however many publishes find it closed
        self._prober = Prober(connection)  # looks exchanges up without closing this channel
        self._existing: set[str] = set()  # exchanges looked up and found
        self._looking_up = asyncio.Lock()

    @classmethod
    async def open(cls, connection: Connection) -> ConfirmingPublisher:
        return cls(connection, await cls._new_channel(connection))

    @staticmethod
    async def _new_channel(connection: Connection) -> Channel:
        return await connection.channel(publisher_confirms=True, on_return_raises=True)

    async def _ready_channel(self) -> Channel:
        # The broker closes a channel on a publish to a missing exchange (404); the next
        # message gets a new one instead of failing too.
        async with self._reopening:
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
                await self._refuse_if_missing(exchange, message_id)
                await self._publish_past_others_refusals(message, exchange, routing_key)
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
        except aiormq.exceptions.ChannelClosed as error:
            if _names_exchange(error, exchange):
                self._existing.discard(exchange)  # deleted since it was looked up
                raise _refused(message_id, exchange, error) from error
            raise ConnectionLost(f"publishing message {message_id!r} failed: {error}") from error
        except TimeoutError as error:
            # A broker that keeps the connection but stops answering: the heartbeat would
            # notice too, after 3 * (heartbeat + 1) s, but no publish waits longer than this.
            raise ConnectionLost(
                f"publishing message {message_id!r} failed: no answer from the broker "
                f"within {timeout:g} s"
            ) from error
        except (*CHANNEL_ERRORS, RuntimeError) as error:
            # aio-pika raises a bare RuntimeError for a channel whose connection has closed.
            raise ConnectionLost(
                f"publishing message {message_id!r} failed: {error or type(error).__name__}"
            ) from error
        except asyncio.CancelledError as error:
            if not cancelled_by_a_closing_connection():
                raise
            # The confirms in flight, rejected by a connection that closed itself (a silent
            # broker): a lost connection, not a cancellation of whatever awaited the publish.
            raise ConnectionLost(
                f"publishing message {message_id!r} failed: the connection was lost before "
                "the broker confirmed it"
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

    async def _refuse_if_missing(self, exchange: str, message_id: str) -> None:
        """:class:`PublishRefused` if ``exchange`` does not exist (looked up once, when found)."""
        if exchange == "" or exchange in self._existing:
            return
        async with self._looking_up:
            if exchange in self._existing:
                return
            try:
                outcome, _ = await self._prober.attempt(
                    lambda channel: channel.declare_exchange(exchange, passive=True)
                )
            except TopologyError as error:  # e.g. access refused
                raise _refused(message_id, exchange, error) from error
            except ServiceUnavailable as error:
                raise ConnectionLost(str(error)) from error
            if outcome == "not-found":
                raise _refused(message_id, exchange)
            self._existing.add(exchange)

    async def _publish_past_others_refusals(
        self, message: aio_pika.Message, exchange: str, routing_key: str
    ) -> None:
        """Publish; sent again on a new channel when another message's refusal closed this one.

        Sending again may deliver a second copy of a message the broker had taken before the
        channel closed: consumers deduplicate by ``message_id``.
        """
        for sends_left in range(SENDS_PAST_OTHERS_REFUSALS, 0, -1):
            try:
                await self._publish(message, exchange, routing_key)
                return
            except aiormq.exceptions.ChannelClosed as error:
                if _names_exchange(error, exchange) or self._connection.is_closed:
                    raise
                if sends_left == 1:
                    raise

    async def _publish(self, message: aio_pika.Message, exchange: str, routing_key: str) -> None:
        channel = await self._ready_channel()
        # Checked on the connection the message goes out on: one over its frame size would
        # close that connection under every publish in flight on it.
        too_large = why_over_a_frame(message, message.message_id or "", frame_max(self._connection))
        if too_large is not None:
            raise UnpublishableError(too_large)
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
        await self._prober.close()
        if not self._channel.is_closed:
            await self._channel.close()


def _refused(message_id: str, exchange: str, error: Exception | None = None) -> PublishRefused:
    """Why the broker refused the message: a missing exchange, or the broker's own words."""
    if error is None or isinstance(error, aiormq.exceptions.ChannelNotFoundEntity):
        why = f"exchange {exchange!r} does not exist"
    elif isinstance(error, aiormq.exceptions.ChannelClosed):
        why = _reply(error)
    else:
        why = str(error)
    return PublishRefused(f"the broker refused message {message_id!r}: {why}")


def _reply(error: aiormq.exceptions.ChannelClosed) -> str:
    """The broker's own words, e.g. ``NOT_FOUND - no exchange 'x' in vhost '/'``."""
    return str(error.args[-1]) if error.args else type(error).__name__


def _names_exchange(error: aiormq.exceptions.ChannelClosed, exchange: str) -> bool:
    """Whether the channel closed because of ``exchange``: this message's refusal, not another's.

    The broker names the exchange it refused (``NOT_FOUND - no exchange 'x' in vhost '/'``,
    ``ACCESS_REFUSED - access to exchange 'x' in vhost '/' refused for user 'u'``).
    """
    refusals = aiormq.exceptions.ChannelNotFoundEntity | aiormq.exceptions.ChannelAccessRefused
    return isinstance(error, refusals) and f"exchange '{exchange}'" in _reply(error)
