"""Retention: remove finished ledger rows, sent outbox rows, sent alerts and callback receipts
older than a window, and compact succeeded messages older than a shorter one.

The ledger deduplicates by key only while it remembers the key: a duplicate that arrives after
its row was pruned runs again. So the window must be longer than any redelivery, replay or
reconciliation window, and rows that still matter to people are never removed: dead letters
stay until someone replays or ignores them, and rows in flight stay until they finish.

Compaction keeps the deduplication whole at less than half the size: a succeeded message past the
compaction window leaves the ledger for ``rabbitretry.succeeded_key`` (its key's hash, when it
finished, its attempts), and the claim drops a duplicate of such a key as it would one of a
ledger row. The message id, its attempt history and its listing by queue go.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from rabbitretry import db
from rabbitretry.db import Pool, Record, query

# Shorter windows would forget keys whose duplicates can still arrive: a copy parked in the
# delay chain comes back up to about 47 hours later (topology.delays.MAX_DELAY_SECONDS; a test
# keeps this above it), and finds its row only if it is still there; a redelivery after a long
# broker outage, an outbox relay that resends, a reconciliation window.
MIN_WINDOW = timedelta(days=3)
BATCH = 5_000  # rows per statement: short transactions, no long locks on a busy ledger
# After each batch, rest this many times as long as it took: a prune then keeps at most a
# seventh of one database backend busy, and the workers the rest. With rows that are all in
# memory a batch is pure CPU, and on a saturated two-core machine a rest of 1 cost the workers a
# quarter of their rate, 4 a tenth, 6 nothing measurable (docs/benchmarks.md, "Ten million
# rows"); since batches delete by ctid, 6 prunes as fast as 4 did before.
REST = 6.0
RACE_TRIES = 3  # a batch that loses a deadlock to a worker is taken again, up to this often
# Compact succeeded messages after this long by default: well past a reconciliation's look-back
# (its orphan check lists succeeded keys by queue, which a compacted key cannot give) and the
# days in which people look a message up.
COMPACT_AFTER = timedelta(days=7)
MIN_COMPACT_AFTER = timedelta(days=1)


@dataclass(frozen=True)
class Pruned:
    ledger: int
    outbox: int
    alerts: int
    callback_receipts: int = 0
    succeeded_keys: int = 0  # compacted keys removed
    compacted: int = 0  # succeeded rows moved to their key's hash


def check_window(window: timedelta) -> None:
    if window < MIN_WINDOW:
        raise ValueError(
            f"a retention window under {MIN_WINDOW.days} days would forget keys whose duplicates "
            "may still arrive (a copy parked in the delay chain comes back up to 47 hours later), "
            "and the ledger deduplicates only the keys it remembers"
        )


def check_compaction(compact_after: timedelta, window: timedelta) -> None:
    if compact_after < MIN_COMPACT_AFTER:
        raise ValueError(
            f"compacting sooner than {MIN_COMPACT_AFTER.days} day would take the message ids "
            "of recent successes, which reconciliations and people still look up"
        )
    if compact_after >= window:
        raise ValueError("it must be shorter than the retention window, or nothing is compacted")


async def prunable(pool: Pool, before: datetime, compact_before: datetime | None = None) -> Pruned:
    counts = {
        row["what"]: row["rows"]
        for row in await pool.fetch(query("prunable"), before, compact_before)
    }
    return Pruned(
        ledger=counts["ledger"],
        outbox=counts["outbox"],
        alerts=counts["alerts"],
        callback_receipts=counts["callback_receipts"],
        succeeded_keys=counts["succeeded_keys"],
        compacted=counts["compacted"],
    )


async def prune(
    pool: Pool,
    before: datetime,
    *,
    compact_before: datetime | None = None,
    batch: int = BATCH,
    rest: float = REST,
) -> Pruned:
    """Delete, batch by batch, what finished before ``before``, then compact the succeeded
    messages that finished before ``compact_before`` (None: none); how many rows went. After
    each batch it rests ``rest`` times as long as the batch took, so that the workers writing
    to the same database keep most of it (0: no rest)."""
    paced = _Paced(pool, batch, rest)
    ledger = await paced.per_queue("prune_succeeded", before)
    ledger += await paced.all(before, "prune_ledger")
    succeeded_keys = await paced.oldest_first("prune_succeeded_keys", before)
    await paced.all(before, "prune_compacted_queues")  # queues none of whose keys are left
    return Pruned(
        ledger=ledger,
        succeeded_keys=succeeded_keys,
        outbox=await paced.all(before, "prune_outbox"),
        alerts=await paced.all(before, "prune_alerts"),
        callback_receipts=await paced.all(before, "prune_callback_receipts"),
        compacted=0
        if compact_before is None
        else await paced.per_queue("compact_succeeded", compact_before),
    )


@dataclass(frozen=True)
class _Paced:
    pool: Pool
    batch: int
    rest: float

    async def per_queue(self, statement: str, before: datetime) -> int:
        """The succeeded rows, queue by queue, oldest first."""
        total = 0
        for queue in [row["queue"] for row in await self.pool.fetch(query("ledger_queues"))]:
            total += await self.oldest_first(statement, queue, before)
        return total

    async def oldest_first(self, statement: str, *args: object) -> int:
        """Batches of ``statement`` (``args``, then the batch size and where to start), each
        from where the last one ended, until one takes fewer rows than a batch."""
        start = datetime.min.replace(tzinfo=UTC)
        total = 0
        while True:
            row = await self._batch(statement, *args, self.batch, start)
            deleted: int = row["deleted"]
            total += deleted
            if row["taken"] < self.batch:
                return total
            # A whole batch of rows it leaves (snapshots kept), all ended at one instant: step
            # past that instant rather than take the same rows again.
            stuck = deleted == 0 and row["last"] == start
            start = row["last"] + timedelta(microseconds=1) if stuck else row["last"]

    async def all(self, before: datetime, statement: str) -> int:
        total = 0
        while True:
            deleted: int = (await self._batch(statement, before, self.batch))[0]
            total += deleted
            if deleted < self.batch:
                return total

    async def _batch(self, statement: str, *args: object) -> Record:
        for tries in range(1, RACE_TRIES + 1):
            started = time.monotonic()
            row: Record | None = None
            try:
                (row,) = await self.pool.fetch(query(statement), *args)
            except Exception as error:
                # A batch locks its rows oldest first, the workers' groups theirs by key: a
                # deadlock between them fails the batch, which is simply taken again.
                if not db.is_lost_race(error) or tries == RACE_TRIES:
                    raise
            await asyncio.sleep((time.monotonic() - started) * self.rest)
            if row is not None:
                return row
        raise AssertionError("a batch is returned or raised within RACE_TRIES")
