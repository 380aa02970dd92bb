"""``Publisher``: publish so that a message is either on the broker or an exception is raised.

Persistent messages, publisher confirms and ``mandatory``: a message no queue is bound for
raises :class:`UnroutableError` (aio-pika would return quietly), a broker nack raises
:class:`PublishError`. Every message carries a ``message_id``, the consumer's deduplication
key: pass a business key (``order-42-paid``) so that publishing the same fact twice is
recognised downstream; without one a UUID is used. The publisher opens a connection of its
own, apart from any consumer's, because a broker under a resource alarm blocks publishing
connections and everything sent on them, acks included.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from pydantic import BaseModel

from rabbitretry import amqp, tracing

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

        ``exchange=""`` is the default exchange: ``routing_key`` is then a queue name.
        Raises :class:`UnroutableError` or :class:`PublishError`; never returns on a loss.
        """
        if self._channel is None:
            raise RuntimeError("the publisher is not connected: use `async with Publisher(...)`")
        body, default_type = encode(payload)
        message_id = message_id or new_message_id()
        with tracing.publish_span(exchange, routing_key, message_id, headers) as headers:
            await self._channel.publish(
                body,
                exchange=exchange,
                routing_key=routing_key,
                message_id=message_id,
                headers=headers,
                properties={"content_type": content_type or default_type},
            )
        return message_id
