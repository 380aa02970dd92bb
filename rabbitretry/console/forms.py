"""Query strings and form fields into operations' terms. Pure functions, no I/O."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime

from rabbitretry import operations
from rabbitretry.ledger import Key
from rabbitretry.operations import Filter, OperationError

FILTER_FIELDS = ("status", "queue", "error", "fingerprint", "since", "until", "q")


def moment(text: str | None) -> datetime | None:
    """A form's time (``2026-12-03T07:30`` from a datetime-local input, or ISO); UTC if naive."""
    if not text or not text.strip():
        return None
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise OperationError(f"{text!r} is not a time like 2026-12-03T07:30") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def filter_from(params: Mapping[str, str], *, limit: int = 200) -> Filter:
    status = params.get("status") or "dead"
    statuses = operations.STATUSES if status == "all" else (status,)
    return Filter(
        statuses=tuple(statuses),
        queue=params.get("queue") or None,
        error=params.get("error") or None,
        fingerprint=params.get("fingerprint") or None,
        since=moment(params.get("since")),
        until=moment(params.get("until")),
        text=params.get("q") or None,
        limit=limit,
    )


def refuse_nul(*values: str) -> None:
    """Refuse a value holding a NUL: PostgreSQL text cannot, so it could match nothing."""
    if any("\x00" in value for value in values):
        raise OperationError("a NUL character (\\x00) cannot be part of a filter or a key")


def key_value(queue: str, message_id: str) -> str:
    """A key as one form value (queue names may contain '/', so JSON)."""
    return json.dumps([queue, message_id])


def key_from(value: str) -> Key:
    try:
        queue, message_id = json.loads(value)
    except (ValueError, TypeError):
        raise OperationError("a selected message could not be read; reload the page") from None
    refuse_nul(str(queue), str(message_id))
    return Key(str(queue), str(message_id))


def rate_from(text: str | None) -> float | None:
    return operations.parse_rate(text) if text and text.strip() else None
