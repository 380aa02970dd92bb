"""Enqueueing a message in the caller's own transaction."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from rabbitretry import tracing
from rabbitretry.db import Connection, query
from rabbitretry.publisher import encode, new_message_id


class Outbox:
    """Writes messages into ``rabbitretry.outbox`` on the caller's connection."""

    async def enqueue(
        self,
        conn: Connection,
        exchange: str,
        payload: BaseModel | Mapping[str, Any] | list[Any] | bytes,
        *,
        routing_key: str = "",
        message_id: str | None = None,
        headers: Mapping[str, Any] | None = None,
        ordering_key: str | None = None,
    ) -> str:
        """Add a message to the outbox inside the caller's transaction; its message_id.

        Call it inside ``conn.transaction()``: outside one, the row commits on its own.
        """
        body, content_type = encode(payload)
        message_id = message_id or new_message_id()
        # The row stores the caller's trace context: the relay's publish carries it.
        with tracing.enqueue_span(
            exchange, routing_key, message_id, headers, body_size=len(body)
        ) as headers:
            await conn.execute(
                query("outbox_enqueue"),
                exchange,
                routing_key,
                message_id,
                ordering_key,
                body,
                json.dumps(dict(headers or {}), default=str),
                content_type,
            )
            await conn.execute(query("outbox_notify"))  # delivered at commit, not before
        return message_id
