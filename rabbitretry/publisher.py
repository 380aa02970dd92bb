"""``Publisher``: publish so that a message is either on the broker or an exception is raised.

Persistent messages, publisher confirms and ``mandatory``: a message no queue is bound for
raises :class:`UnroutableError` (aio-pika would return quietly), a broker nack raises
:class:`PublishError`. Every message carries a ``message_id``, the consumer's deduplication
key, and the caller must give it: a business key (``order-42-paid``), so that publishing the
same fact twice, or again after a :class:`ConnectionLost`, is recognised downstream. A
publish without one raises :class:`MissingMessageId` (a random id, which aio-pika stamps on
every message that has none, would make each copy look new and silently disable
deduplication). The publisher opens a connection of its own, apart from any consumer's,
because a broker under a resource alarm blocks publishing connections and everything sent on
them, acks included.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from pydantic import BaseModel

from rabbitretry import amqp, tracing
from rabbitretry.errors import MissingMessageId

JSON = "application/json"


def encode(payload: BaseModel | Mapping[str, Any] | list[Any] | bytes) -> tuple[bytes, str]:
    """The body and content type for a payload: models and JSON values as JSON, bytes as-is."""
    if isinstance(payload, bytes):
        return payload, "application/octet-stream"
    if isinstance(payload, BaseModel):
        return payload.model_dump_json().encode(), JSON
    return json.dumps(payload, default=str, separators=(",", ":")).encode(), JSON


def new_message_id() -> str:
    return uuid.uuid4().hex


def require_message_id(message_id: str | None) -> str:
    """``message_id`` itself, or :class:`MissingMessageId` if it is missing or empty."""
    if not message_id:
        raise MissingMessageId()
    return message_id


class Publisher:
    """Publishes with confirms; use as ``async with Publisher(url) as publisher:``."""

    def __init__(self, amqp_url: str, *, name: str = "rabbitretry-publisher") -> None:
        self._url = amqp_url
        self._name = name
        self._connection: amqp.Connection | None = None
        self._channel: amqp.ConfirmingPublisher | None = None

    async def connect(self) -> Publisher:
        self._connection = await amqp.connect(self._url, name=self._name)
        self._channel = await amqp.ConfirmingPublisher.open(self._connection)
        return self

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()
        self._connection = self._channel = None

    async def __aenter__(self) -> Publisher:
        return await self.connect()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def publish(
        self,
        exchange: str,
        payload: BaseModel | Mapping[str, Any] | list[Any] | bytes,
        *,
        routing_key: str = "",
        message_id: str | None = None,
        headers: Mapping[str, Any] | None = None,
        content_type: str | None = None,
    ) -> str:
        """Publish and wait for the broker's confirm; the message_id used.

        ``message_id`` is required (:class:`MissingMessageId` otherwise): a business key,
        the same every time this fact is published. ``exchange=""`` is the default exchange:
        ``routing_key`` is then a queue name. Raises :class:`UnroutableError` or
        :class:`PublishError`; never returns on a loss.
        """
        message_id = require_message_id(message_id)
        if self._channel is None:
            raise RuntimeError("the publisher is not connected: use `async with Publisher(...)`")
        body, default_type = encode(payload)
        with tracing.publish_span(
            exchange, routing_key, message_id, headers, body_size=len(body)
        ) as headers:
            await self._channel.publish(
                body,
                exchange=exchange,
                routing_key=routing_key,
                message_id=message_id,
                headers=headers,
                properties={"content_type": content_type or default_type},
            )
        return message_id
