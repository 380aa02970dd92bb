"""What the receiver does with one request, decided without I/O.

The order of the checks matters: the size first (the receiver reads nothing past the limit),
the sender next (an unsigned request stores nothing, not even a dead letter, so strangers
cannot fill the dead letters), then the body and its key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import ValidationError

from rabbitretry.callbacks.kinds import CallbackKind, invalid_key, reasons


@dataclass(frozen=True)
class Unauthorized:
    """401: the sender did not prove itself; nothing is stored."""

    reason: str


@dataclass(frozen=True)
class Invalid:
    """400: a signed body the model (or its key) rejects; kept as a dead letter under ``key``."""

    key: str
    reasons: list[str]


@dataclass(frozen=True)
class Accepted:
    """A valid event: stored under its business ``message_id`` (200 once committed)."""

    message_id: str


Verdict = Unauthorized | Invalid | Accepted


def decide(kind: CallbackKind, headers: Mapping[str, str], body: bytes, now: float) -> Verdict:
    """The verdict on a body that is within the size limit (``headers`` looked up lower-case)."""
    if kind.signature is not None:
        refusal = kind.signature.refusal(headers, body, now)
        if refusal is not None:
            return Unauthorized(refusal)
    try:
        event = kind.parse(body)
        return Accepted(kind.key_of(event))
    except (ValidationError, ValueError) as error:
        return Invalid(invalid_key(kind.name, body), reasons(error))
    except Exception as error:
        # The kind's message_id function failed on this event (a field it expects is None...):
        # keeping the request as a dead letter loses nothing, where a 500 would leave it to
        # the gateway's patience.
        why = f"the message id could not be derived: {type(error).__name__}: {error}"
        return Invalid(invalid_key(kind.name, body), [why])
