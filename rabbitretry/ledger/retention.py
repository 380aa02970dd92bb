"""Retention: remove finished ledger rows, sent outbox rows, sent alerts and callback receipts
older than a window.

The ledger deduplicates by key only while it remembers the key: a duplicate that arrives after
its row was pruned runs again. So the window must be longer than any redelivery, replay or
reconciliation window, and rows that still matter to people are never removed: dead letters
stay until someone replays or ignores them, and rows in flight stay until they finish.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from rabbitretry.db import Pool, Record, query

# Shorter windows would forget keys whose duplicates can still arrive: a copy parked in the
# delay chain comes back up to about 47 hours later (topology.delays.MAX_DELAY_SECONDS; a test
# keeps this above it), and finds its row only if it is still there; a redelivery after a long
# broker outage, an outbox relay that resends, a reconciliation window.
MIN_WINDOW = timedelta(days=3)
BATCH = 5_000  # rows per statement: short transactions, no long locks on a busy ledger
# After each batch, rest this many times as long as it took: a prune then keeps at most half of
# one database backend busy, and the workers the rest (docs/operations.md, "Retention").
REST = 1.0


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


async def prune(pool: Pool, before: datetime, *, batch: int = BATCH, rest: float = REST) -> Pruned:
    """Delete, batch by batch, what finished before ``before``; how many rows went. After each
    batch it rests ``rest`` times as long as the batch took, so that the workers writing to
    the same database keep most of it (0: no rest)."""
    paced = _Paced(pool, batch, rest)
    return Pruned(
        ledger=await paced.succeeded(before) + await paced.all(before, "prune_ledger"),
        outbox=await paced.all(before, "prune_outbox"),
        alerts=await paced.all(before, "prune_alerts"),
        callback_receipts=await paced.all(before, "prune_callback_receipts"),
    )


@dataclass(frozen=True)
class _Paced:
    pool: Pool
    batch: int
    rest: float

    async def succeeded(self, before: datetime) -> int:
        """The succeeded rows, queue by queue, each batch from where the last one ended."""
        total = 0
        for queue in [row["queue"] for row in await self.pool.fetch(query("ledger_queues"))]:
            start = datetime.min.replace(tzinfo=UTC)
            while True:
                row = await self._batch("prune_succeeded", queue, before, self.batch, start)
                total += row["deleted"]
                if row["deleted"] < self.batch:
                    break
                start = row["last"]
        return total

    async def all(self, before: datetime, statement: str) -> int:
        total = 0
        while True:
            deleted: int = (await self._batch(statement, before, self.batch))[0]
            total += deleted
            if deleted < self.batch:
                return total

    async def _batch(self, statement: str, *args: object) -> Record:
        started = time.monotonic()
        (row,) = await self.pool.fetch(query(statement), *args)
        await asyncio.sleep((time.monotonic() - started) * self.rest)
        return row
