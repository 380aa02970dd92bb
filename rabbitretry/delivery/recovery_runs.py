"""A run of a recover hook as the ledger queues it: its message id, its headers, its death.

The trigger ``rabbitretry.recover_on_dead`` (migration 0012) writes a run in SQL;
``rabbitretry.testing.recover`` builds the same one here, so that a unit test's ``on_dead`` is
told what a worker's would be: ``death_of`` reads these headers back. Also what such a test
may ask for: :func:`requested_death`.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pydantic

from rabbitretry.consumer import Consumer, Death
from rabbitretry.delivery.attempt import validation_summary
from rabbitretry.delivery.recovery import RECOVER_OF

MAX_ID_BYTES = 200
"""A longer dead message id is hashed in the run's id (an AMQP message_id holds 255 bytes)."""
MAX_ERROR_CHARS = 2000
"""The run's ``x-rabbitretry-dead-error`` header keeps this much of the error message."""


def run_message_id(message_id: str, replays: int = 0) -> str:
    """``recover:<message_id>:<replays>``: the id of the run for this death of ``message_id``."""
    if len(message_id.encode()) > MAX_ID_BYTES:
        digest = hashlib.md5(message_id.encode(), usedforsecurity=False).hexdigest()
        message_id = f"md5-{digest}"
    return f"recover:{message_id}:{replays}"


def run_headers(death: Death) -> dict[str, Any]:
    """The headers the run of ``death`` is queued with."""
    return {
        RECOVER_OF: death.message_id,
        "x-rabbitretry-dead-reason": death.reason,
        "x-rabbitretry-dead-error-type": death.error_type,
        "x-rabbitretry-dead-error": death.error_message[:MAX_ERROR_CHARS],
        "x-rabbitretry-dead-attempts": death.attempts,
    }


def requested_death(
    owner_type: type[Consumer[Any]], body: bytes, death: Death | None, message_id: str | None
) -> Death:
    """The death a unit test's run of ``owner_type``'s hook is told of (``testing.recover``).

    ``death`` as the test gives it, or else one of ``message_id`` (default ``test-message``):
    ``invalid-payload`` when ``body`` does not validate (the hook then gets no ``msg``),
    otherwise a ``permanent-error`` at the first attempt. Raises ``TypeError`` when the
    consumer has no hook, ``ValueError`` for a death no worker would tell it.
    """
    if not owner_type.has_recover_hook():
        raise TypeError(
            f"{owner_type.__qualname__} has no recover hook: "
            "write `async def on_dead(self, msg, ctx, death)` to test it with testing.recover()"
        )
    if death is None:
        return assumed_death(owner_type, message_id or "test-message", body)
    if message_id is not None:
        raise ValueError("the dead message's id is death.message_id: pass death or message_id")
    if death.queue != owner_type.queue:
        raise ValueError(f"death.queue is {death.queue!r}, not the consumer's {owner_type.queue!r}")
    return death


def assumed_death(owner_type: type[Consumer[Any]], message_id: str, body: bytes) -> Death:
    """What killed ``body`` as a test assumes it: ``invalid-payload`` when it does not
    validate, else a ``permanent-error`` at the first attempt."""
    try:
        owner_type.parse(body)
    except pydantic.ValidationError as error:
        summary = validation_summary(error)
        return Death(owner_type.queue, message_id, "invalid-payload", "invalid-payload", summary, 1)
    return Death(owner_type.queue, message_id, "permanent-error", "Permanent", "", 1)
