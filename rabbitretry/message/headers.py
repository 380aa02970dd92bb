"""The headers rabbitretry reads and writes, and the one recipe for a republished copy. Pure.

Every copy rabbitretry publishes (a delay copy, a parked copy, a dead letter, a replay, a
re-drive, a message put back on a dead-letter queue) is built here from the message as it
arrived: its headers by :func:`republished` (or :func:`dead_letter`, :func:`kept_dead`), its
properties by :func:`copy_properties`.

The broker's dead-letter headers are removed and the ledger's attempt count set: a copy
republished with ``x-death`` is silently dropped as a dead-letter cycle on its second pass
through the delay chain, and ``x-death`` is only a hint anyway. A copy carries no ``CC``/``BCC``
either: the broker routes by them on publish and on every dead-lettering, so a producer's ``CC``
would send the copy to other queues too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from rabbitretry.message.storable import storable_text
from rabbitretry.message.wire import fits_amqp_decimal, is_utf8

ATTEMPTS = "x-rabbitretry-attempts"
"""The ledger's attempt count when the copy was published: an older copy is stale."""
QUEUE = "x-rabbitretry-queue"
REASON = "x-rabbitretry-reason"
ERROR_TYPE = "x-rabbitretry-error-type"
ERROR = "x-rabbitretry-error"
UNDECODABLE = "x-rabbitretry-undecodable"
"""Why the header table the producer sent could not be decoded (the rest of the message could)."""
RAW_HEADERS = "x-rabbitretry-raw-headers"
"""The bytes of that table, as they came in the frame, for a person to look at."""
MAX_ATTEMPTS_VALUE = 2**31 - 1  # an integer column
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
ERROR_HEADER_LIMIT = 500  # characters of the error message carried on a dead letter

# Headers the broker writes when it dead-letters a message.
BROKER_HEADERS = ("x-death", "x-first-death-", "x-last-death-", "x-delivery-count")
# Sender-selected distribution: extra routing keys, read on publish and on dead-lettering.
ROUTING_HEADERS = ("CC", "BCC")


def without_broker_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    return {
        key: value for key, value in (headers or {}).items() if not key.startswith(BROKER_HEADERS)
    }


def without_routing_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    return {key: value for key, value in (headers or {}).items() if key not in ROUTING_HEADERS}


def republished(headers: Mapping[str, Any] | None, attempts: int) -> dict[str, Any]:
    """The headers of a copy republished by rabbitretry after ``attempts`` attempts."""
    return {
        **publishable(without_routing_headers(without_broker_headers(headers))),
        ATTEMPTS: attempts,
    }


def kept_dead(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """The headers of a message put back on its dead-letter queue, for people reading it.

    Unlike a copy bound for a work queue it keeps ``x-death``, the broker's account of why the
    message died there; the broker's own count of deliveries is dropped (it is the queue's, not
    the message's), and so are ``CC``/``BCC``, which would route the copy to other queues.
    """
    kept = {k: v for k, v in without_routing_headers(headers).items() if k != "x-delivery-count"}
    return publishable(kept)


def death(*, queue: str, reason: str, error_type: str, error: str) -> dict[str, str]:
    """The headers that say why a message died, on its copy on the dead-letter queue."""
    return {QUEUE: queue, REASON: reason, ERROR_TYPE: error_type, ERROR: error[:ERROR_HEADER_LIMIT]}


def copy_properties(properties: Mapping[str, Any]) -> dict[str, Any]:
    """The AMQP properties of a copy, from those kept of the original (the ledger snapshot's).

    Text that is not UTF-8 is escaped (:func:`publishable_properties`), and the timestamp, kept
    as seconds, is a moment again.
    """
    copied = publishable_properties(properties)
    born = published_at(copied)
    if born is not None:
        copied["timestamp"] = born
    return copied


def published_at(properties: Mapping[str, Any]) -> datetime | None:
    """The moment the producer stamped on the message, from properties kept as a snapshot."""
    seconds = properties.get("timestamp")
    return None if seconds is None else datetime.fromtimestamp(float(seconds), tz=UTC)


def publishable(table: Mapping[str, Any]) -> dict[str, Any]:
    """``table`` with every value in a form the AMQP client encodes and the broker accepts.

    What arrived is not always what can be sent again: the client decodes a header string that
    is not valid UTF-8 into ``bytes``, which it then refuses to encode; a value restored from
    the ledger may be a decimal the wire format cannot carry. Bytes stay bytes (as a byte
    array), anything else that cannot travel travels as text.
    """
    return {_publishable_name(str(key)): _publishable(value) for key, value in table.items()}


def _publishable_name(name: str) -> str:
    # A header name that was not UTF-8 arrives holding lone surrogates; names are text only.
    return name if is_utf8(name) else storable_text(name)


def publishable_properties(properties: Mapping[str, Any]) -> dict[str, Any]:
    """Message properties a copy can carry: text that is not UTF-8 is sent escaped.

    Such text arrives from producers whose ``correlation_id`` or ``type`` holds raw bytes (the
    client keeps them as lone surrogates); a property has no byte-array form to keep them in.
    """
    return {
        name: storable_text(value) if isinstance(value, str) and not is_utf8(value) else value
        for name, value in properties.items()
    }


def _publishable(value: Any) -> Any:
    if value is None or isinstance(value, bool | str | datetime | bytearray):
        if isinstance(value, str) and not is_utf8(value):
            return bytearray(value.encode("utf-8", "surrogatepass"))
        return value
    if isinstance(value, int):
        return value if INT64_MIN <= value <= INT64_MAX else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)  # NaN closes the connection
    if isinstance(value, bytes | memoryview):
        return bytearray(value)
    if isinstance(value, Decimal):
        return value if fits_amqp_decimal(value) else str(value)
    if isinstance(value, Mapping):
        return publishable(value)
    if isinstance(value, list | tuple):
        return [_publishable(item) for item in value]
    return repr(value)


def dead_letter(
    headers: Mapping[str, Any] | None,
    attempts: int,
    *,
    queue: str,
    reason: str,
    error_type: str,
    error: str,
) -> dict[str, Any]:
    """The headers of a copy on the dead-letter queue: why it died, for people reading it."""
    return {
        **republished(headers, attempts),
        **death(queue=queue, reason=reason, error_type=error_type, error=error),
    }


def attempts_of(headers: Mapping[str, Any] | None) -> int:
    """The attempt count a copy carries; 0 when it carries none or nonsense.

    Any producer can set this header, so the value is bounded to what the ledger stores.
    """
    value = (headers or {}).get(ATTEMPTS)
    if not isinstance(value, int) or isinstance(value, bool):
        try:
            value = int(str(value)) if value is not None else 0
        except ValueError:
            return 0
    return min(max(value, 0), MAX_ATTEMPTS_VALUE)


def undecodable(why: str, raw: bytes) -> dict[str, Any]:
    """The headers of a message whose header table could not be decoded: why, and its bytes."""
    return {UNDECODABLE: why, RAW_HEADERS: bytearray(raw)}


def why_undecodable(headers: Mapping[str, Any] | None) -> str | None:
    """Why the message's headers could not be decoded (None when they were)."""
    why = (headers or {}).get(UNDECODABLE)
    return None if why is None else str(why)


def x_death(headers: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The broker's dead-letter history, as a hint for logs; empty when absent or malformed."""
    value = (headers or {}).get("x-death")
    if not isinstance(value, list):
        return []
    return [dict(entry) for entry in value if isinstance(entry, dict)]
