"""What became of a delivery: one vocabulary for the worker, metrics, logs and ``testing``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from rabbitretry.ledger import Key

Decided = Literal["succeeded", "retrying", "dead", "skipped"]
"""What an attempt decided (the attempt core's answer)."""

Result = Literal[
    "succeeded",  # the work is done
    "retrying",  # a copy waits in the delay path for the next attempt
    "dead",  # stored as a dead letter
    "skipped",  # no longer worth doing (expired, should_skip)
    "dropped",  # a redundant copy: the ledger says the work is finished or owned elsewhere
    "parked",  # held in the delay path until its claim can succeed
    "interrupted",  # a shutdown stopped the attempt; not counted, requeued
    "deferred",  # its downstream's breaker is open; not counted, requeued to wait there
    "requeued",  # the ledger or broker was unavailable; requeued, nothing charged
]
"""What became of one delivery."""

FINISHED: frozenset[Result] = frozenset({"succeeded", "dead", "skipped"})


@dataclass(frozen=True)
class Outcome:
    """What became of one delivery, for logs, metrics and tests."""

    key: Key | None
    result: Result
    attempt: int = 0
    handler_seconds: float | None = None  # None when the handler did not run
    published_at: datetime | None = None  # the message's timestamp property, when set
    received_at: datetime | None = None  # when this delivery reached the worker
