"""Publishing with publisher confirms and ``mandatory``: a message is either taken by the
broker and routed to a queue, or the publish raises."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aio_pika
from aio_pika.abc import DeliveryMode

from rabbitretry.amqp.connection import CHANNEL_ERRORS, Channel, Connection, is_up
from rabbitretry.errors import ConnectionLost, PublishError, UnpublishableError, UnroutableError
from rabbitretry.message.wire import why_unencodable


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
