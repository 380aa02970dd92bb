"""The AMQP properties of a delivered message that the ledger snapshot keeps (a copy's are made
from them by :func:`rabbitretry.message.headers.copy_properties`)."""

from __future__ import annotations

from typing import Any

from rabbitretry.amqp.connection import IncomingMessage


def message_properties(message: IncomingMessage) -> dict[str, Any]:
    """The AMQP properties worth keeping in the ledger snapshot and on republished copies."""
    names = ("content_type", "content_encoding", "correlation_id", "type", "app_id", "priority")
    props: dict[str, Any] = {
        name: getattr(message, name) for name in names if getattr(message, name) is not None
    }
    if message.timestamp is not None:
        props["timestamp"] = message.timestamp.timestamp()
    return props
