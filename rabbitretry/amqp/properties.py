"""What a republished copy's AMQP properties are made of: the ones taken from a delivered
message into the ledger snapshot, and those same ones rebuilt from the snapshot."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from rabbitretry.amqp.connection import IncomingMessage
from rabbitretry.message.headers import publishable_properties


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
