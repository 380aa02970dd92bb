"""What an operator does to failed messages, shared by the CLI and the console.

Both front ends call these functions, so a filter, a group or a replay means the same thing on
the page and in a terminal. Decisions (filters, rates, payload checks, export lines) are pure
functions; the I/O functions below them run the named statements of ``sql/operations.sql`` and
every action writes the audit table: who, when, what, how many.

A replay of many messages takes its list of targets once, at the start: messages that die
while it runs are not swept in (the cutoff), and ``before`` can move the cutoff earlier.
Each message is replayed by :func:`rabbitretry.operations.dead_letter.replay_one`, which keeps its
guarantees (row lock, confirmed publish, never two live copies).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import pydantic

from rabbitretry import amqp, ledger
from rabbitretry.db import Executor, Pool, Record, query
from rabbitretry.errors import RabbitRetryError
from rabbitretry.operations import dead_letter

STATUSES = ("dead", "retrying", "ignored")
DEFAULT_LIMIT = 100
KEYS_KEPT = 1000  # replayed keys a report lists; a group may be a million


class OperationError(RabbitRetryError):
    """An operator asked for something that cannot be done (a bad rate, an invalid payload)."""


# ---------------------------------------------------------------- pure decisions


@dataclass(frozen=True)
class Filter:
    """Which messages a list, a grouping or an export shows; every field narrows it."""

    statuses: tuple[str, ...] = ("dead",)
    queue: str | None = None
    error: str | None = None
    """An error type (``TimeoutError``) or a reason (``invalid-payload``)."""
    fingerprint: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    text: str | None = None
    """Searched (case-insensitively) in the key, the error type and the error message."""
    limit: int = DEFAULT_LIMIT

    def __post_init__(self) -> None:
        unknown = [s for s in self.statuses if s not in STATUSES]
        if unknown or not self.statuses:
            raise OperationError(
                f"status must be one of {', '.join(STATUSES)}, not {', '.join(unknown) or 'none'}"
            )
        if self.limit < 1:
            raise OperationError("the limit must be at least 1")
        if self.since and self.until and self.since > self.until:
            raise OperationError("the time range is empty: since is after until")

    def params(self) -> list[Any]:
        return [
            list(self.statuses),
            self.queue or None,
            self.error or None,
            self.fingerprint or None,
            self.since,
            self.until,
            self.text or None,
            self.limit,
        ]


_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:/\s*(s|sec|second|m|min|minute))?\s*$")


def parse_rate(text: str) -> float:
    """``20/s``, ``300/m`` or ``20`` → messages per second."""
    match = _RATE.match(text)
    if not match or float(match[1]) <= 0:
        raise OperationError(f"{text!r} is not a rate like 20/s or 300/m")
    per_second = float(match[1])
    return per_second / 60 if (match[2] or "s").startswith("m") else per_second


def pause_before(index: int, rate: float | None, started: float, now: float) -> float:
    """Seconds to wait before the ``index``-th publish (from 0) so as not to exceed ``rate``."""
    if rate is None:
        return 0.0
    return max(0.0, started + index / rate - now)


def checked_payload(text: str | bytes, payload_adapter: pydantic.TypeAdapter[Any] | None) -> bytes:
    """An edited payload as bytes, refused unless it is JSON (valid for the model, if known)."""
    body = text.encode() if isinstance(text, str) else text
    try:
        json.loads(body)
    except ValueError as error:
        raise OperationError(f"the payload is not valid JSON: {error}") from None
    if payload_adapter is not None:
        try:
            payload_adapter.validate_json(body)
        except pydantic.ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'payload'}: {e['msg']}"
                for e in error.errors()
            )
            raise OperationError(
                f"the payload does not fit the consumer's model: {problems}"
            ) from None
    return body


def payload_text(body: bytes) -> str:
    """A payload for people: pretty JSON when it is JSON, else text (undecodable bytes marked)."""
    try:
        return json.dumps(json.loads(body), indent=2, ensure_ascii=False)
    except (ValueError, UnicodeDecodeError):
        return body.decode("utf-8", errors="replace")


def export_line(row: Record) -> str:
    """One message as a JSON line; the payload as JSON when it is JSON, else base64."""
    body = bytes(row["payload"])
    entry: dict[str, Any] = {
        k: row[k]
        for k in (
            "queue",
            "message_id",
            "status",
            "attempts",
            "reason",
            "error_type",
            "error_message",
            "error_fingerprint",
            "exchange",
            "routing_key",
            "replays",
        )
    }
    entry["first_seen"] = row["first_seen"].isoformat()
    entry["finished_at"] = row["finished_at"].isoformat() if row["finished_at"] else None
    entry["headers"] = json.loads(row["headers"])
    entry["properties"] = json.loads(row["properties"])
    try:
        entry["payload"] = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        entry["payload_base64"] = base64.b64encode(body).decode()
    return json.dumps(entry, ensure_ascii=False, default=str)


@dataclass
class ReplayReport:
    """What a replay did; ``stopped`` says why it ended early (a failed canary)."""

    targets: int
    replayed: int = 0
    skipped: int = 0
    canary: str | None = None
    """The canary's key and final status, e.g. ``orders/42 succeeded``."""
    stopped: str | None = None
    keys: list[str] = field(default_factory=list)
    """The first replayed keys (at most ``KEYS_KEPT``)."""

    def summary(self) -> str:
        text = f"replayed {self.replayed} of {self.targets}"
        if self.skipped:
            text += f", {self.skipped} no longer dead (skipped)"
        if self.canary:
            text += f"; canary {self.canary}"
        if self.stopped:
            text += f"; stopped: {self.stopped}"
        return text


# ---------------------------------------------------------------- reading


async def list_messages(pool: Pool, selection: Filter) -> list[Record]:
    """Matching messages, most recently changed first."""
    return list(await pool.fetch(query("operations_list"), *selection.params()))


async def groups(pool: Pool, selection: Filter) -> list[Record]:
    """Matching messages grouped by queue and error fingerprint, largest group first."""
    return list(await pool.fetch(query("operations_groups"), *selection.params()))


async def find(pool: Pool, message_id: str, queue: str | None = None) -> list[Record]:
    """Ledger rows with this key (one per queue that has it, or the one in ``queue``)."""
    if queue:
        row = await ledger.get(pool, ledger.Key(queue, message_id))
        return [row] if row is not None else []
    return list(await pool.fetch(query("find_entries"), message_id))


async def history(pool: Pool, key: ledger.Key) -> tuple[list[Record], list[Record]]:
    """The attempts and the audit rows of one message, oldest first."""
    attempts = await pool.fetch(query("list_attempts"), key.queue, key.message_id)
    audit = await pool.fetch(query("list_audit"), key.queue, key.message_id)
    return list(attempts), list(audit)


async def recent_audit(pool: Pool, limit: int = 50, *, every_row: bool = False) -> list[Record]:
    """The latest audit rows, one per operation (an action on many messages is its summary
    row); with ``every_row``, also each message's own row."""
    return list(await pool.fetch(query("operations_recent_audit"), limit, every_row))


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


# ---------------------------------------------------------------- acting


async def audit(
    executor: Executor,
    actor: str,
    action: str,
    *,
    key: ledger.Key | None = None,
    queue: str | None = None,
    messages: int = 1,
    comment: str | None = None,
    detail: dict[str, Any] | None = None,
    batch: str | None = None,
) -> None:
    """One audit row (in ``executor``'s transaction, when it is a connection in one)."""
    await executor.execute(
        query("operations_audit"),
        actor,
        action,
        key.queue if key else queue,
        key.message_id if key else None,
        json.dumps(detail or {}, default=str),
        messages,
        comment or None,
        batch,
    )


@contextlib.asynccontextmanager
async def publisher(amqp_url: str) -> AsyncIterator[amqp.ConfirmingPublisher]:
    """A confirming publisher on its own connection, for one operation."""
    connection = await amqp.connect(amqp_url, name="rabbitretry-operations")
    try:
        yield await amqp.ConfirmingPublisher.open(connection)
    finally:
        await connection.close()


Progress = Callable[[ReplayReport], None]


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
        await _replay_counted(pool, sender, first, actor, report, batch)
        status = await wait_finished(pool, first, timeout=canary_timeout)
        report.canary = f"{first} {status or 'unfinished'}"
        if status != "succeeded":
            report.stopped = (
                f"the canary {first} is {status or f'not finished after {canary_timeout:g} s'}"
                f"; {len(rest)} left dead"
            )
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
            queue=_one_queue(targets),
            messages=report.replayed,
            detail={**(description or {}), **asdict(report), "rate": rate, "keys": None},
            batch=batch,
        )
    return report


async def _replay_counted(
    pool: Pool,
    sender: amqp.ConfirmingPublisher,
    key: ledger.Key,
    actor: str,
    report: ReplayReport,
    batch: str | None,
) -> None:
    if await dead_letter.replay_one(pool, sender, key, actor=actor, batch=batch):
        report.replayed += 1
        if len(report.keys) < KEYS_KEPT:
            report.keys.append(str(key))
    else:
        report.skipped += 1


def _one_queue(keys: Sequence[ledger.Key]) -> str | None:
    queues = {k.queue for k in keys}
    return queues.pop() if len(queues) == 1 else None


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


async def ignore(pool: Pool, key: ledger.Key, *, actor: str, comment: str) -> bool:
    """Mark a dead or retrying message ``ignored``; False when it is neither."""
    if not comment.strip():
        raise OperationError("say why it is ignored: a comment is required")
    async with pool.acquire() as conn, conn.transaction():
        before = await conn.fetchval(query("operations_ignore"), key.queue, key.message_id)
        if before is None:
            return False
        await conn.execute(
            query("operations_audit"),
            actor,
            "ignore",
            key.queue,
            key.message_id,
            json.dumps({"status_before": before}),
            1,
            comment.strip(),
            None,
        )
    return True


async def ignore_many(
    pool: Pool,
    keys: Sequence[ledger.Key],
    *,
    actor: str,
    comment: str,
    description: dict[str, Any] | None = None,
) -> tuple[str, int]:
    """Mark the dead letters among ``keys`` ``ignored``, in one transaction; the batch that
    names them in the audit (for :func:`unignore`) and how many were ignored."""
    if not comment.strip():
        raise OperationError("say why they are ignored: a comment is required")
    batch = secrets.token_hex(6)
    async with pool.acquire() as conn, conn.transaction():
        status = await conn.execute(
            query("operations_ignore_many"),
            [k.queue for k in keys],
            [k.message_id for k in keys],
            actor,
            comment.strip(),
            batch,
        )
        ignored = int(status.split()[-1])
        await audit(
            conn,
            actor,
            "ignore-batch",
            queue=_one_queue(keys) if keys else None,
            messages=ignored,
            comment=comment.strip(),
            detail=description,
            batch=batch,
        )
    return batch, ignored


async def unignore(pool: Pool, batch: str, *, actor: str, comment: str | None = None) -> int:
    """Undo an :func:`ignore_many`: its messages still ignored are dead again; how many."""
    undo = secrets.token_hex(6)
    async with pool.acquire() as conn, conn.transaction():
        status = await conn.execute(
            query("operations_unignore_batch"), batch, actor, comment or None, undo
        )
        undone = int(status.split()[-1])
        await audit(
            conn,
            actor,
            "unignore-batch",
            messages=undone,
            comment=comment,
            detail={"undoes": batch},
            batch=undo,
        )
    return undone


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
    return await dead_letter.replay_one(pool, sender, key, actor=actor, body=body, comment=comment)


async def export(
    pool: Pool, selection: Filter, write: Callable[[str], object], *, actor: str
) -> int:
    """Write the matching messages as JSON lines, oldest first; how many were written."""
    rows = await pool.fetch(query("operations_export"), *selection.params())
    for row in rows:
        write(export_line(row) + "\n")
    await audit(
        pool,
        actor,
        "export",
        queue=selection.queue,
        messages=len(rows),
        detail={k: v for k, v in asdict(selection).items() if v},
    )
    return len(rows)
