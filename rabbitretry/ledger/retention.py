"""Retention: remove finished ledger rows, sent outbox rows, sent alerts and callback receipts
older than a window.

The ledger deduplicates by key only while it remembers the key: a duplicate that arrives after
its row was pruned runs again. So the window must be longer than any redelivery, replay or
reconciliation window, and rows that still matter to people are never removed: dead letters
stay until someone replays or ignores them, and rows in flight stay until they finish.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from rabbitretry.db import Pool, query

# Shorter windows would forget keys whose duplicates can still arrive: a copy parked in the
# delay chain comes back up to about 47 hours later (topology.delays.MAX_DELAY_SECONDS; a test
# keeps this above it), and finds its row only if it is still there; a redelivery after a long
# broker outage, an outbox relay that resends, a reconciliation window.
MIN_WINDOW = timedelta(days=3)
BATCH = 5_000  # rows per statement: short transactions, no long locks on a busy ledger


@dataclass(frozen=True)
class Pruned:
    ledger: int
    outbox: int
    alerts: int
    callback_receipts: int = 0


def check_window(window: timedelta) -> None:
    if window < MIN_WINDOW:
        raise ValueError(
            f"a retention window under {MIN_WINDOW.days} days would forget keys whose duplicates "
            "may still arrive (a copy parked in the delay chain comes back up to 47 hours later), "
            "and the ledger deduplicates only the keys it remembers"
        )


async def prunable(pool: Pool, before: datetime) -> Pruned:
    counts = {row["what"]: row["rows"] for row in await pool.fetch(query("prunable"), before)}
    return Pruned(
        ledger=counts["ledger"],
        outbox=counts["outbox"],
        alerts=counts["alerts"],
        callback_receipts=counts["callback_receipts"],
    )


async def prune(pool: Pool, before: datetime, *, batch: int = BATCH) -> Pruned:
    """Delete, batch by batch, what finished before ``before``; how many rows went."""
    return Pruned(
        ledger=await _succeeded(pool, before, batch)
        + await _in_batches(pool, "prune_ledger", before, batch),
        outbox=await _in_batches(pool, "prune_outbox", before, batch),
        alerts=await _in_batches(pool, "prune_alerts", before, batch),
        callback_receipts=await _in_batches(pool, "prune_callback_receipts", before, batch),
    )


async def _succeeded(pool: Pool, before: datetime, batch: int) -> int:
    """The succeeded rows, queue by queue, each batch from where the last one ended."""
    total = 0
    for queue in [row["queue"] for row in await pool.fetch(query("ledger_queues"))]:
        start = datetime.min.replace(tzinfo=UTC)
        while True:
            (row,) = await pool.fetch(query("prune_succeeded"), queue, before, batch, start)
            total += row["deleted"]
            if row["deleted"] < batch:
                break
            start = row["last"]
    return total


async def _in_batches(pool: Pool, statement: str, before: datetime, batch: int) -> int:
    total = 0
    while True:
        deleted: int = await pool.fetchval(query(statement), before, batch)
        total += deleted
        if deleted < batch:
            return total
