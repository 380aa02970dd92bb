"""What is kept of an exception: type, message, a bounded traceback and a grouping fingerprint.

Pure functions. The fingerprint groups failures that differ only in the numbers, ids and
quoted values inside their messages, so a thousand "order 123 not found" become one group.
"""

from __future__ import annotations

import hashlib
import re
import traceback
from dataclasses import dataclass

from rabbitretry.message.storable import storable_text

MAX_MESSAGE = 2_000
MAX_TRACEBACK = 8_000

_VARIABLE_PARTS = [
    re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"),
    re.compile(r"0x[0-9a-fA-F]+"),
    re.compile(r"(?<!\w)'[^']*'|\"[^\"]*\""),  # quoted values, not apostrophes in words
    re.compile(r"\d+(\.\d+)?"),
]


@dataclass(frozen=True)
class Failure:
    type: str
    message: str
    traceback: str
    fingerprint: str
    downstream: str | None = None
    """The downstream whose unavailability failed the attempt (``DownstreamUnavailable``)."""


def _bounded(text: str, limit: int) -> str:
    """Text cut to ``limit`` characters, keeping the end (where a traceback says most).

    NUL characters and lone surrogates are escaped: PostgreSQL refuses them in ``text``, and an
    error message is free to contain anything its exception was given.
    """
    text = storable_text(text)
    if len(text) <= limit:
        return text
    return "…" + text[-(limit - 1) :]


def fingerprint(queue: str, error_type: str, message: str) -> str:
    normalized = message
    for pattern in _VARIABLE_PARTS:
        normalized = pattern.sub("?", normalized)
    identity = f"{queue}\0{error_type}\0{normalized}"
    digest = hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()
    return digest[:12]


def message_of(error: BaseException) -> str:
    """``str(error)``, or a stand-in when the exception cannot even say what it is."""
    try:
        return str(error) or type(error).__qualname__
    except Exception as broken:
        return f"<{type(error).__qualname__}: str() failed with {type(broken).__qualname__}>"


def describe(queue: str, error: BaseException) -> Failure:
    error_type = type(error).__qualname__
    message = _bounded(message_of(error), MAX_MESSAGE)
    trace = "".join(traceback.format_exception(error))
    return Failure(
        type=error_type,
        message=message,
        traceback=_bounded(trace, MAX_TRACEBACK),
        fingerprint=fingerprint(queue, error_type, message),
    )


def rejection(queue: str, reason: str, message: str) -> Failure:
    """A failure that is not an exception: a delivery refused before any attempt."""
    return Failure(
        type=reason,
        message=_bounded(message, MAX_MESSAGE),
        traceback="",
        fingerprint=fingerprint(queue, reason, message),
    )
