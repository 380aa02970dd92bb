"""Replaying one dead letter from its ledger snapshot (many: :mod:`rabbitretry.operations.replay`).

A replay publishes the stored message to its work queue (never to the exchange it first came
through, which may fan out elsewhere) and gives it a fresh attempt budget, all under a row lock:
the publish is confirmed before the ledger says ``retrying``, and a second replay of the same
message waits for the first and then finds it no longer dead, so two replays never make two
live copies. The ledger writes are :mod:`rabbitretry.ledger.operator`'s, on the connection
that holds the lock.
"""

from __future__ import annotations

import json
from typing import Any

from rabbitretry import ledger, tracing
from rabbitretry.amqp import ConfirmingPublisher
from rabbitretry.db import Pool, Record, query
from rabbitretry.ledger import operator
from rabbitretry.message import headers


async def replay_one(
    pool: Pool,
    publisher: ConfirmingPublisher,
    key: ledger.Key,
    *,
    actor: str,
    body: bytes | None = None,
    comment: str | None = None,
    batch: str | None = None,
) -> bool:
    """Replay one dead letter; False when it is no longer dead (already replayed, ignored).

    With ``body``, the stored payload is replaced first (an operator's fix), in the same
    transaction, so the ledger always holds what was published. ``batch`` names the replay
    of many messages this one is part of, in its audit row.
    """
    async with pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(query("lock_dead"), key.queue, key.message_id)
        if row is None:
            return False
        snapshot = ledger.snapshot_of(row)
        replayed = snapshot.body if body is None else body
        with tracing.replay_span(
            key.queue,
            key.message_id,
            snapshot.headers,
            actor=actor,
            edited=body is not None,
            body_size=len(replayed),
        ) as traced:
            # The ledger keeps the replay's context: a re-drive of this copy, like the
            # worker's copies of it, continues the replay's trace, not the original one.
            replayed_headers = traced(dict(snapshot.headers))
            if body is not None:
                await operator.set_payload(conn, key, body)
            await operator.mark_replayed(conn, key, replayed_headers)
            await conn.execute(
                query("operations_audit"),
                actor,
                "replay" if body is None else "edit-replay",
                key.queue,
                key.message_id,
                _detail(row, edited_from=snapshot.body if body is not None else None),
                1,
                comment,
                batch,
            )
            await publisher.publish(
                replayed,
                routing_key=key.queue,
                message_id=key.message_id,
                headers=headers.republished(replayed_headers, row["attempts"]),
                properties=headers.copy_properties(snapshot.properties),
            )
    return True


def _detail(row: Record, *, edited_from: bytes | None = None) -> str:
    detail: dict[str, Any] = {
        "attempts": row["attempts"],
        "reason": row["reason"],
        "error_type": row["error_type"],
        "replays_before": row["replays"],
    }
    if edited_from is not None:
        detail["previous_payload"] = edited_from.decode("utf-8", errors="replace")
    return json.dumps(detail)
