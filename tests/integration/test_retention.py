"""Retention against the real database: old finished rows go, dead and live rows stay."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from rabbitretry.db import query
from rabbitretry.ledger import retention

DAY = timedelta(days=1)


async def add_row(pool: asyncpg.Pool, key: str, status: str, finished_ago: timedelta) -> None:
    finished = datetime.now(UTC) - finished_ago
    await pool.execute(
        """
        INSERT INTO rabbitretry.ledger (queue, message_id, status, attempts, max_attempts,
                                        next_retry_at, lease_until, finished_at, payload)
        VALUES ('q', $1, $2, 1, 3,
                CASE WHEN $2 = 'retrying' THEN now() END,
                CASE WHEN $2 = 'processing' THEN now() END,
                CASE WHEN $2 NOT IN ('retrying', 'processing') THEN $3::timestamptz END, '{}')
        """,
        key,
        status,
        finished,
    )
    await pool.execute(
        "INSERT INTO rabbitretry.attempt (queue, message_id, attempt, worker)"
        " VALUES ('q', $1, 1, 'w')",
        key,
    )


async def keys(pool: asyncpg.Pool) -> set[str]:
    return {r["message_id"] for r in await pool.fetch("SELECT message_id FROM rabbitretry.ledger")}


async def test_prune_removes_only_old_finished_rows(pool: asyncpg.Pool) -> None:
    for status in ("succeeded", "skipped", "ignored", "dead"):
        await add_row(pool, f"old-{status}", status, 40 * DAY)
        await add_row(pool, f"new-{status}", status, DAY)
    await add_row(pool, "live-retrying", "retrying", 40 * DAY)
    await add_row(pool, "live-processing", "processing", 40 * DAY)
    await pool.execute(
        "INSERT INTO rabbitretry.outbox (exchange, routing_key, message_id, payload, status,"
        " sent_at)"
        " VALUES ('x', '', 'sent-old', '{}', 'sent', now() - interval '40 days'),"
        "        ('x', '', 'sent-new', '{}', 'sent', now()),"
        "        ('x', '', 'pending-old', '{}', 'pending', NULL)"
    )
    before = datetime.now(UTC) - 30 * DAY

    assert await retention.prunable(pool, before) == retention.Pruned(ledger=3, outbox=1, alerts=0)
    assert await retention.prune(pool, before, batch=2) == retention.Pruned(
        ledger=3, outbox=1, alerts=0
    )

    assert await keys(pool) == {
        "old-dead",
        "new-succeeded",
        "new-skipped",
        "new-ignored",
        "new-dead",
        "live-retrying",
        "live-processing",
    }
    orphans = await pool.fetchval(
        "SELECT count(*) FROM rabbitretry.attempt a WHERE NOT EXISTS (SELECT 1 FROM "
        "rabbitretry.ledger l WHERE l.queue = a.queue AND l.message_id = a.message_id)"
    )
    assert orphans == 0
    outbox = {
        r["message_id"] for r in await pool.fetch("SELECT message_id FROM rabbitretry.outbox")
    }
    assert outbox == {"sent-new", "pending-old"}


async def test_prune_takes_succeeded_rows_queue_by_queue_in_batches_through_the_index(
    pool: asyncpg.Pool,
) -> None:
    """Batches of two over three queues, with rows that ended at the same instant across a
    batch's edge: every old row goes, every new one stays, and each batch is an index range
    (no scan of the whole ledger)."""
    old = datetime.now(UTC) - 40 * DAY
    rows = [
        (queue, f"{queue}-{n}", old + timedelta(seconds=n // 3))
        for queue in "abc"
        for n in range(7)
    ]
    rows += [(queue, f"{queue}-new", datetime.now(UTC)) for queue in "abc"]
    await pool.executemany(
        "INSERT INTO rabbitretry.ledger (queue, message_id, status, attempts, max_attempts,"
        " finished_at) VALUES ($1, $2, 'succeeded', 1, 3, $3)",
        rows,
    )
    before = datetime.now(UTC) - 30 * DAY
    assert (await retention.prune(pool, before, batch=2)).ledger == 21
    assert await keys(pool) == {"a-new", "b-new", "c-new"}
    async with pool.acquire() as conn, conn.transaction():
        # A tiny table may be read whole by choice; what matters is that the index can serve it.
        await conn.execute("SET LOCAL enable_seqscan = off")
        plan = await conn.fetchval(
            "EXPLAIN (FORMAT JSON) " + query("prune_succeeded"), "a", before, 2, old
        )
        assert "ledger_succeeded_idx" in plan and "Seq Scan" not in plan, plan
        plan = await conn.fetchval("EXPLAIN (FORMAT JSON) " + query("prune_ledger"), before, 2)
        assert "ledger_set_aside_idx" in plan and "Seq Scan" not in plan, plan


def test_a_window_shorter_than_the_longest_park_is_refused() -> None:
    with pytest.raises(ValueError, match="deduplicates only the keys it remembers"):
        retention.check_window(3 * DAY - timedelta(hours=1))
    retention.check_window(3 * DAY)


async def test_prune_removes_old_callback_receipts(pool: asyncpg.Pool) -> None:
    await pool.execute(
        "INSERT INTO rabbitretry.callback_receipt (kind, message_id, received_at)"
        " VALUES ('payment', 'old', now() - interval '40 days'), ('payment', 'new', now())"
    )
    before = datetime.now(UTC) - 30 * DAY
    assert (await retention.prunable(pool, before)).callback_receipts == 1
    assert (await retention.prune(pool, before, batch=1)).callback_receipts == 1
    left = await pool.fetch("SELECT message_id FROM rabbitretry.callback_receipt")
    assert [r["message_id"] for r in left] == ["new"]
