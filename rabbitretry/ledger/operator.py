"""The ledger writes an operator's actions make: ignore, unignore, replay marks, payload edits.

Each runs one named statement of ``sql/operator.sql`` on the caller's connection: the operation
holds the transaction, so its lock, its audit row and its publish commit or roll back with the
write. The statements of an action on many messages
write each message's audit row themselves, so the audit never disagrees with the ledger.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rabbitretry.db import Connection, query
from rabbitretry.ledger.statements import Key
from rabbitretry.message.storable import encode_table


async def ignore(conn: Connection, key: Key) -> str | None:
    """Mark a dead or retrying message ``ignored`` (row locked); the status it had, or None
    when it was neither (and nothing changed)."""
    before = await conn.fetchval(query("operations_ignore"), key.queue, key.message_id)
    return None if before is None else str(before)


async def ignore_many(
    conn: Connection, keys: Sequence[Key], *, actor: str, comment: str, batch: str
) -> int:
    """Mark the dead letters among ``keys`` ``ignored``, each audited as one of ``batch``;
    how many were."""
    status = await conn.execute(
        query("operations_ignore_many"),
        [k.queue for k in keys],
        [k.message_id for k in keys],
        actor,
        comment,
        batch,
    )
    return _rows(status)


async def unignore_batch(
    conn: Connection, batch: str, *, actor: str, comment: str | None, undo: str
) -> int:
    """Make the messages of ignore ``batch`` still ignored dead again, each audited as one of
    ``undo``; how many were."""
    status = await conn.execute(query("operations_unignore_batch"), batch, actor, comment, undo)
    return _rows(status)


async def set_payload(conn: Connection, key: Key, body: bytes) -> None:
    """Replace the payload of a dead letter the caller has locked (an operator's fix)."""
    await conn.execute(query("operations_set_payload"), key.queue, key.message_id, body)


async def mark_replayed(conn: Connection, key: Key, headers: Mapping[str, Any]) -> None:
    """Give a locked dead letter a fresh attempt budget: it is ``retrying`` again.

    ``headers`` replace the snapshot's: those of the replayed copy (the replay's trace
    context), which every later copy published from the ledger carries.
    """
    await conn.execute(query("mark_replayed"), key.queue, key.message_id, encode_table(headers))


def _rows(status: str) -> int:
    """The row count of a command status such as ``INSERT 0 12``."""
    return int(status.split()[-1])
