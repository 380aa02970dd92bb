"""Replaying dead letters: which ones, how fast, and whether a canary goes first.

A replay of many messages takes its list of targets once, at the start: messages that die
while it runs are not swept in (the cutoff), and ``before`` can move the cutoff earlier.
Each message is replayed by :func:`rabbitretry.operations.dead_letter.replay_one`, which keeps
its guarantees (row lock, confirmed publish, never two live copies); this module decides the
order, the pace and when to stop, and reports what was done.

A replay the broker refuses (its work queue gone, so the copy comes back unroutable; a header
table too large for a frame) names that message alone: it stays dead as it was, the broker's
reason goes into the report, and the replay goes on with the next. A lost connection is not a
refusal: it ends the replay, and the messages not yet replayed stay dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import pydantic

from rabbitretry import amqp, ledger
from rabbitretry.db import Pool, query
from rabbitretry.errors import ConnectionLost, PublishError, UnpublishableError
from rabbitretry.operations.audit import audit, queue_of
from rabbitretry.operations.dead_letter import replay_one
from rabbitretry.operations.errors import OperationError
from rabbitretry.operations.payload import checked_payload

KEYS_KEPT = 1000  # replayed keys a report lists; a group may be a million

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:/\s*(s|sec|second|m|min|minute))?\s*$")


MIN_RATE = 1 / 60  # one a minute: a tinier rate would make a replay wait for years
MAX_RATE = 100_000.0  # a second: above it a rate is no limit at all


def parse_rate(text: str) -> float:
    """``20/s``, ``300/m`` or ``20`` → messages per second, from one a minute to 100,000 a
    second (``10000...`` digits would read as infinity, ``1e-9`` as never)."""
    match = _RATE.match(text)
    if not match or float(match[1]) <= 0:
        raise OperationError(f"{text!r} is not a rate like 20/s or 300/m")
    per_second = float(match[1])
    rate = per_second / 60 if (match[2] or "s").startswith("m") else per_second
    if not MIN_RATE <= rate <= MAX_RATE:
        raise OperationError(f"{text!r} is not a rate from 1/m to 100,000/s: try 20/s or 300/m")
    return rate


def pause_before(index: int, rate: float | None, started: float, now: float) -> float:
    """Seconds to wait before the ``index``-th publish (from 0) so as not to exceed ``rate``."""
    if rate is None:
        return 0.0
    return max(0.0, started + index / rate - now)


@dataclass
class ReplayReport:
    """What a replay did; ``stopped`` says why it ended early (a failed canary)."""

    targets: int
    replayed: int = 0
    skipped: int = 0
    failed: int = 0
    """Messages the broker refused: left dead, each with its reason in ``failures``."""
    canary: str | None = None
    """The canary's key and final status, e.g. ``orders/42 succeeded``."""
    stopped: str | None = None
    keys: list[str] = field(default_factory=list)
    """The first replayed keys (at most ``KEYS_KEPT``)."""
    failures: list[str] = field(default_factory=list)
    """``key: the broker's reason`` for the first refused messages (at most ``KEYS_KEPT``)."""

    def summary(self) -> str:
        text = f"replayed {self.replayed} of {self.targets}"
        if self.skipped:
            text += f", {self.skipped} no longer dead (skipped)"
        if self.failed:
            text += f", {self.failed} refused by the broker (left dead)"
        if self.canary:
            text += f"; canary {self.canary}"
        if self.stopped:
            text += f"; stopped: {self.stopped}"
        return text


Progress = Callable[[ReplayReport], None]


async def replay_targets(
    pool: Pool,
    *,
    keys: Sequence[ledger.Key] | None = None,
    queue: str | None = None,
    fingerprint: str | None = None,
    error: str | None = None,
    before: datetime | None = None,
    limit: int | None = None,
) -> list[ledger.Key]:
    """The dead letters a replay applies to, oldest death first, taken once (the cutoff);
    all of them unless ``limit`` is given."""
    rows = await pool.fetch(
        query("operations_replay_targets"),
        [str(k) for k in keys] if keys is not None else None,
        queue,
        fingerprint,
        error,
        before,
        limit,
    )
    return [ledger.Key(r["queue"], r["message_id"]) for r in rows]


@contextlib.asynccontextmanager
async def sender(amqp_url: str) -> AsyncIterator[amqp.ConfirmingPublisher]:
    """A confirming sender of copies on its own connection, for one operation."""
    connection = await amqp.connect(amqp_url, name="rabbitretry-operations")
    try:
        yield await amqp.ConfirmingPublisher.open(connection)
    finally:
        await connection.close()


async def replay(
    pool: Pool,
    sender: amqp.ConfirmingPublisher,
    targets: Sequence[ledger.Key],
    *,
    actor: str,
    rate: float | None = None,
    canary: bool = False,
    canary_timeout: float = 60.0,
    description: dict[str, Any] | None = None,
    on_progress: Progress | None = None,
    batch: str | None = None,
) -> ReplayReport:
    """Replay ``targets`` at most ``rate`` per second; with ``canary``, the first one alone.

    The canary is replayed, then the ledger is watched until a worker finishes it: only if it
    succeeded are the others replayed. A canary that dies again, is skipped or is still not
    finished after ``canary_timeout`` seconds stops the operation, and the report says so.
    A replay of several messages is audited as one ``replay-batch`` row, and each message's
    own row names it (``batch``: given, else made up).
    """
    report = ReplayReport(targets=len(targets))
    rest = list(targets)
    batch = (batch or secrets.token_hex(6)) if len(targets) > 1 else None
    if canary and rest:
        first = rest.pop(0)
        report.stopped = await _canary(pool, sender, first, actor, report, batch, canary_timeout)
        if report.stopped is not None:
            report.stopped += f"; {len(rest)} left dead"
            rest = []
        if on_progress:
            on_progress(report)
    started = time.monotonic()
    for index, key in enumerate(rest):
        await asyncio.sleep(pause_before(index, rate, started, time.monotonic()))
        await _replay_counted(pool, sender, key, actor, report, batch)
        if on_progress:
            on_progress(report)
    if len(targets) > 1:
        await audit(
            pool,
            actor,
            "replay-batch",
            queue=queue_of(targets),
            messages=report.replayed,
            detail={**(description or {}), **asdict(report), "rate": rate, "keys": None},
            batch=batch,
        )
    return report


async def _canary(
    pool: Pool,
    sender: amqp.ConfirmingPublisher,
    first: ledger.Key,
    actor: str,
    report: ReplayReport,
    batch: str | None,
    timeout: float,
) -> str | None:
    """Replay the canary and wait for its outcome; why the others must not follow, if so."""
    refused = await _replay_counted(pool, sender, first, actor, report, batch)
    if refused is not None:
        report.canary = f"{first} refused"
        return f"the canary {first} was refused by the broker: {refused}"
    status = await wait_finished(pool, first, timeout=timeout)
    report.canary = f"{first} {status or 'unfinished'}"
    if status == "succeeded":
        return None
    return f"the canary {first} is {status or f'not finished after {timeout:g} s'}"


async def _replay_counted(
    pool: Pool,
    sender: amqp.ConfirmingPublisher,
    key: ledger.Key,
    actor: str,
    report: ReplayReport,
    batch: str | None,
) -> str | None:
    """Replay ``key`` and count it; the broker's reason if it refused the message (which
    stays dead: its row lock's transaction wrote nothing)."""
    try:
        replayed = await replay_one(pool, sender, key, actor=actor, batch=batch)
    except ConnectionLost:
        raise  # the broker is away: every next replay would fail too
    except (PublishError, UnpublishableError) as error:
        report.failed += 1
        if len(report.failures) < KEYS_KEPT:
            report.failures.append(f"{key}: {error}")
        return str(error)
    if replayed:
        report.replayed += 1
        if len(report.keys) < KEYS_KEPT:
            report.keys.append(str(key))
    else:
        report.skipped += 1
    return None


async def wait_finished(
    pool: Pool,
    key: ledger.Key,
    *,
    timeout: float,
    interval: float = 0.2,
) -> str | None:
    """The status ``key`` finishes with (succeeded, dead, ...), or None after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        row = await ledger.get(pool, key)
        if row is not None and row["status"] in ledger.FINISHED:
            return str(row["status"])
        if time.monotonic() >= deadline:
            return None
        await asyncio.sleep(interval)


async def edit_and_replay(
    pool: Pool,
    sender: amqp.ConfirmingPublisher,
    key: ledger.Key,
    payload: str | bytes,
    *,
    actor: str,
    payload_adapter: pydantic.TypeAdapter[Any] | None = None,
    comment: str | None = None,
) -> bool:
    """Replace a dead letter's payload (checked first) and replay it; False if not dead."""
    body = checked_payload(payload, payload_adapter)
    return await replay_one(pool, sender, key, actor=actor, body=body, comment=comment)
