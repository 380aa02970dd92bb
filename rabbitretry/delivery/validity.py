"""Business validity: is a message still worth executing? Decisions only, no I/O.

A consumer may say that its messages expire (``expires_after`` seconds after they were
published, or first seen when they carry no timestamp) or decide per message with
``should_skip``. Work that no longer makes sense (a welcome coupon for a login that happened
days ago) is finished as ``skipped`` with the reason, and the handler never runs.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rabbitretry.consumer import Consumer, Context

EXPIRED = "expired"


def is_expired(expires_after: float | None, born: datetime | None, now: datetime) -> bool:
    """True when a message born at ``born`` is older than ``expires_after`` seconds at ``now``.

    A message of unknown age never expires: skipping is only done on evidence.
    """
    if expires_after is None or born is None:
        return False
    if born.tzinfo is None:  # AMQP timestamps are UTC seconds
        born = born.replace(tzinfo=UTC)
    return (now - born).total_seconds() > expires_after


async def skip_reason(
    consumer: Consumer[Any], msg: Any, ctx: Context, born: datetime | None, now: datetime
) -> str | None:
    """Why this message should be skipped rather than handled; None to handle it."""
    if is_expired(type(consumer).expires_after, born, now):
        return EXPIRED
    reason = await consumer.should_skip(msg, ctx)
    return reason or None
