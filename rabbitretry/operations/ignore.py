"""Ignoring dead letters no one will retry, and undoing it batch by batch.

An ignored message stays in the ledger (its copies are dropped when they arrive) and can be
made dead again: :func:`ignore_many` names its messages with a batch in the audit, and
:func:`unignore` undoes that batch. A reason is required, because "why is this ignored?" is
the question the next operator asks. The ledger writes are :mod:`rabbitretry.ledger.operator`'s;
each runs in one transaction with the action's audit row.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from rabbitretry import ledger
from rabbitretry.db import Pool
from rabbitretry.ledger import operator
from rabbitretry.operations.audit import audit, queue_of
from rabbitretry.operations.errors import OperationError


async def ignore(pool: Pool, key: ledger.Key, *, actor: str, comment: str) -> bool:
    """Mark a dead or retrying message ``ignored``; False when it is neither."""
    if not comment.strip():
        raise OperationError("say why it is ignored: a comment is required")
    async with pool.acquire() as conn, conn.transaction():
        before = await operator.ignore(conn, key)
        if before is None:
            return False
        await audit(
            conn,
            actor,
            "ignore",
            key=key,
            comment=comment.strip(),
            detail={"status_before": before},
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
        ignored = await operator.ignore_many(
            conn, keys, actor=actor, comment=comment.strip(), batch=batch
        )
        await audit(
            conn,
            actor,
            "ignore-batch",
            queue=queue_of(keys),
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
        undone = await operator.unignore_batch(
            conn, batch, actor=actor, comment=comment or None, undo=undo
        )
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
