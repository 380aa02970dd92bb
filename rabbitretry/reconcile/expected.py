"""Expected-vs-actual reconciliation (对账): what should have been consumed, against the ledger.

An application says which messages *should* exist for a time window::

    @reconciliation(queue="points.award", lookback=3600, settle=120)
    async def paid_orders(start: datetime, end: datetime) -> AsyncIterator[Expected]:
        async with app_pool.acquire() as conn:
            async for order in conn.cursor(
                "SELECT id, total FROM orders WHERE paid_at >= $1 AND paid_at < $2", start, end
            ):
                yield Expected(f"order-{order['id']}-paid", {"order_id": order["id"]})

and the reconciler compares that with the ledger of the queue: each expected key has
succeeded, is in flight, was dead-lettered or skipped, or is *missing* (no delivery of it was
ever seen). Missing keys are re-published under their own key, so that an original arriving
late is dropped by the ledger. Keys that succeeded in the window without being expected are
*orphans*: reported, for a person to look at.

This module holds the definitions and the classification; it does no I/O (the check of a
window against the ledger is :mod:`rabbitretry.reconcile.windows`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel

__all__ = [
    "Classified",
    "Expected",
    "ExpectedSource",
    "Reconciliation",
    "WindowReport",
    "classify",
    "reconciliation",
]

IN_FLIGHT = frozenset({"processing", "retrying"})
DEAD = frozenset({"dead", "ignored"})


@dataclass(frozen=True)
class Expected:
    """One message that should exist: its key (the message_id) and the payload to publish."""

    message_id: str
    payload: BaseModel | Mapping[str, Any] | list[Any] | bytes
    headers: Mapping[str, Any] = field(default_factory=dict)


ExpectedSource = Callable[[datetime, datetime], AsyncIterator[Expected]]


@dataclass(frozen=True)
class Reconciliation:
    """An expected set for one queue, checked over ``[now - lookback, now - settle)``.

    ``settle`` leaves out the most recent messages, which may still be on their way.
    """

    name: str
    queue: str
    expected: ExpectedSource
    lookback: float = 3600.0
    settle: float = 60.0

    def __post_init__(self) -> None:
        if not self.queue:
            raise ValueError("a reconciliation needs the queue its messages go to")
        if self.settle < 0 or self.lookback <= self.settle:
            raise ValueError("a reconciliation needs 0 <= settle < lookback")

    def window(self, now: datetime) -> tuple[datetime, datetime]:
        return now - timedelta(seconds=self.lookback), now - timedelta(seconds=self.settle)


def reconciliation(
    *, queue: str, name: str | None = None, lookback: float = 3600.0, settle: float = 60.0
) -> Callable[[ExpectedSource], Reconciliation]:
    """Decorate an async generator ``(start, end) -> Expected...`` into a Reconciliation."""

    def wrap(source: ExpectedSource) -> Reconciliation:
        return Reconciliation(
            name=name or source.__name__,
            queue=queue,
            expected=source,
            lookback=lookback,
            settle=settle,
        )

    return wrap


@dataclass
class WindowReport:
    """What one reconciliation found for one window."""

    name: str
    queue: str
    start: datetime
    end: datetime
    expected: int = 0
    succeeded: int = 0
    in_flight: int = 0
    dead: int = 0
    skipped: int = 0
    missing: int = 0
    republished: int = 0
    orphaned: int = 0
    orphan_examples: list[str] = field(default_factory=list)
    missing_keys: list[str] = field(default_factory=list)
    """The missing keys, the first :data:`MISSING_KEYS_KEPT` of them (``missing`` counts all)."""

    def add(self, classified: Classified) -> None:
        self.expected += classified.total
        self.succeeded += len(classified.succeeded)
        self.in_flight += len(classified.in_flight)
        self.dead += len(classified.dead)
        self.skipped += len(classified.skipped)
        self.missing += len(classified.missing)
        room = MISSING_KEYS_KEPT - len(self.missing_keys)
        self.missing_keys.extend(classified.missing[: max(0, room)])


MISSING_KEYS_KEPT = 1000


@dataclass(frozen=True)
class Classified:
    """Expected keys sorted by what the ledger says of them."""

    succeeded: list[str] = field(default_factory=list)
    in_flight: list[str] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(
            len(keys)
            for keys in (self.succeeded, self.in_flight, self.dead, self.skipped, self.missing)
        )


def classify(expected: Iterable[str], statuses: Mapping[str, str]) -> Classified:
    """Sort expected keys by their ledger status (``statuses``: key → status, if any)."""
    result = Classified()
    for key in dict.fromkeys(expected):  # a key expected twice is one message
        status = statuses.get(key)
        if status is None:
            result.missing.append(key)
        elif status == "succeeded":
            result.succeeded.append(key)
        elif status in IN_FLIGHT:
            result.in_flight.append(key)
        elif status in DEAD:
            result.dead.append(key)
        else:
            result.skipped.append(key)
    return result
