"""Which messages an operator looks at: the filter, and the lists, groups and histories it reads.

A :class:`Filter` means the same thing on the console's pages, in ``rabbitretry dead`` and in an
export; every field narrows it, and an empty one does not (the statements in
``sql/operations.sql`` take NULL as "any").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rabbitretry import ledger
from rabbitretry.db import Pool, Record, query
from rabbitretry.ledger import recover_hooks
from rabbitretry.operations.errors import OperationError

STATUSES = ("dead", "retrying", "ignored")
DEFAULT_LIMIT = 100


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


async def compacted(pool: Pool, key: ledger.Key) -> Record | None:
    """When ``key`` succeeded (``finished_at``) and its ``attempts``, if ``ledger prune``
    compacted it: the ledger keeps nothing else of it."""
    return await pool.fetchrow(query("compacted_key"), key.queue, key.message_id)


async def history(pool: Pool, key: ledger.Key) -> tuple[list[Record], list[Record]]:
    """The attempts and the audit rows of one message, oldest first."""
    attempts = await pool.fetch(query("list_attempts"), key.queue, key.message_id)
    audit = await pool.fetch(query("list_audit"), key.queue, key.message_id)
    return list(attempts), list(audit)


async def recover_run(pool: Pool, key: ledger.Key) -> Record | None:
    """The latest run of the recover hook for dead message ``key`` (None: no hook ran)."""
    return await recover_hooks.run_of(pool, key.queue, key.message_id)
