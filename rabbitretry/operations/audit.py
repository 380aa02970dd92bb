"""The audit table: who did what to which messages, when, and how many.

Every operator action writes it, in the action's own transaction when it has one, so an
action that rolls back leaves no row. An action on many messages is one summary row (its
``-batch`` action) and, where each message changed, a row per message naming the same batch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rabbitretry import ledger
from rabbitretry.db import Executor, Pool, Record, query


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


async def recent_audit(pool: Pool, limit: int = 50, *, every_row: bool = False) -> list[Record]:
    """The latest audit rows, one per operation (an action on many messages is its summary
    row); with ``every_row``, also each message's own row."""
    return list(await pool.fetch(query("operations_recent_audit"), limit, every_row))


def queue_of(keys: Sequence[ledger.Key]) -> str | None:
    """The queue a summary row names: the one all ``keys`` are in, or None when they span
    several (or there are none)."""
    queues = {k.queue for k in keys}
    return queues.pop() if len(queues) == 1 else None
