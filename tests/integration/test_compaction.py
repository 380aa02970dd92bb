"""Compaction (migration 0019): a succeeded message past its window leaves the ledger for its
key's hash, and still drops every late duplicate: at the claim, the refusals before it and
the reconciler's check."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import asyncpg

from rabbitretry.db import query
from rabbitretry.ledger import retention
from rabbitretry.ledger.attempts import AttemptLedger
from rabbitretry.ledger.commits import ClaimRequest
from rabbitretry.ledger.failures import Failure
from rabbitretry.ledger.statements import Key, Snapshot
from tests.integration.harness import lock_waited_by, wait_for

DAY = timedelta(days=1)
T = TypeVar("T")
SNAPSHOT = Snapshot(body=b"{}", headers={}, properties={}, exchange="", routing_key="q")


def request(message_id: str) -> ClaimRequest:
    return ClaimRequest(
        Key("q", message_id),
        max_attempts=3,
        lease_seconds=30.0,
        worker="w-1",
        copy_attempts=0,
        snapshot=SNAPSHOT,
    )


async def succeeded(pool: asyncpg.Pool, message_id: str, ago: timedelta, *, retried: bool = False,
                    keep_payload: bool = False) -> None:  # fmt: skip
    """A message that succeeded ``ago``, through the real claim and success mark."""
    ledger = AttemptLedger(pool)
    key = Key("q", message_id)
    claim = await ledger.claim(request(message_id))
    if retried:
        failure = Failure("Blip", "a blip", "", "fp")
        await ledger.schedule_retry(key, claim.attempt, 0.0, failure)
        claim = await ledger.claim(request(message_id))
    assert await ledger.succeed(key, claim.attempt, keep_snapshot=keep_payload)
    await pool.execute(
        "UPDATE rabbitretry.ledger SET finished_at = now() - $2::interval WHERE message_id = $1",
        message_id,
        ago,
    )


async def ledger_keys(pool: asyncpg.Pool) -> set[str]:
    return {r["message_id"] for r in await pool.fetch("SELECT message_id FROM rabbitretry.ledger")}


async def compact(pool: asyncpg.Pool, batch: int = retention.BATCH) -> retention.Pruned:
    """``ledger prune --older-than 30d --compact-after 7d``."""
    now = datetime.now(UTC)
    return await retention.prune(
        pool, now - 30 * DAY, compact_before=now - 7 * DAY, batch=batch, rest=0.0
    )


async def test_a_success_past_its_window_keeps_only_its_key_hash(pool: asyncpg.Pool) -> None:
    await succeeded(pool, "old", 10 * DAY, retried=True)
    await succeeded(pool, "kept-whole", 10 * DAY, keep_payload=True)
    await succeeded(pool, "recent", DAY)

    assert await compact(pool) == retention.Pruned(ledger=0, outbox=0, alerts=0, compacted=1)

    assert await ledger_keys(pool) == {"kept-whole", "recent"}
    row = await pool.fetchrow(
        "SELECT attempts, finished_at < now() - interval '9 days' AS old"
        " FROM rabbitretry.succeeded_key WHERE key_hash = rabbitretry.key_hash('q', 'old')"
    )
    assert row is not None and (row["attempts"], row["old"]) == (2, True)
    # Its attempt log went with its row.
    assert await pool.fetchval("SELECT count(*) FROM rabbitretry.attempt") == 0
    assert await compact(pool) == retention.Pruned(ledger=0, outbox=0, alerts=0)


async def test_a_late_duplicate_of_a_compacted_key_is_dropped(pool: asyncpg.Pool) -> None:
    await succeeded(pool, "done", 10 * DAY)
    await compact(pool)

    claim = await AttemptLedger(pool).claim(request("done"))

    assert (claim.verdict, claim.status, claim.attempt) == ("finished", "succeeded", 1)
    assert await ledger_keys(pool) == set()  # the row the claim inserted is gone again
    assert (await AttemptLedger(pool).claim(request("new"))).verdict == "claimed"


async def test_a_claim_that_meets_a_compaction_moving_its_key_drops_it(
    pool: asyncpg.Pool,
) -> None:
    await succeeded(pool, "moving", 10 * DAY)
    async with pool.acquire() as conn, conn.transaction():
        now = datetime.now(UTC)
        moved = await conn.fetchrow(
            query("compact_succeeded"), "q", now - 7 * DAY, 10, now - 30 * DAY
        )
        assert moved is not None and moved["deleted"] == 1
        claiming = asyncio.create_task(AttemptLedger(pool).claim(request("moving")))

        # The claim waits for the compaction's lock on the row it moves.
        await wait_for(lock_waited_by(pool, "rabbitretry.claim("), timeout=10)
        assert not claiming.done()
    claim = await claiming
    assert (claim.verdict, claim.status) == ("finished", "succeeded")
    assert await ledger_keys(pool) == set()


async def broker_dead(pool: asyncpg.Pool, message_ids: list[str]) -> list[asyncpg.Record]:
    """The reconciler recording ``message_ids`` found on the work queue's dead-letter queue."""
    n = len(message_ids)
    return await pool.fetch(
        query("dead_queue_record"), "q", 3, "dead-lettered", message_ids, [b"{}"] * n,
        ["{}"] * n, ["{}"] * n, [""] * n, ["q"] * n, ["e"] * n, ["f"] * n,
    )  # fmt: skip


async def compacted_under(pool: asyncpg.Pool, message_id: str, writer: Awaitable[T]) -> T:
    """Run ``writer`` while another transaction holds the row of ``message_id`` locked, then
    compacts it and commits: ``writer`` first meets the row alive, then finds it gone."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "SELECT 1 FROM rabbitretry.ledger WHERE message_id = $1 FOR UPDATE", message_id
        )
        writing = asyncio.ensure_future(writer)
        await wait_for(lock_waited_by(pool, "rabbitretry."), timeout=10)
        now = datetime.now(UTC)
        moved = await conn.fetchrow(
            query("compact_succeeded"), "q", now - 7 * DAY, 10, now - 30 * DAY
        )
        assert moved is not None and moved["deleted"] == 1
    return await writing


async def test_a_claim_whose_row_is_compacted_while_it_waits_drops_the_copy(
    pool: asyncpg.Pool,
) -> None:
    await succeeded(pool, "racing", 10 * DAY)

    claim = await compacted_under(pool, "racing", AttemptLedger(pool).claim(request("racing")))

    assert (claim.verdict, claim.status, claim.attempt) == ("finished", "succeeded", 1)
    assert await ledger_keys(pool) == set()


async def test_a_refusal_whose_row_is_compacted_while_it_waits_stores_nothing(
    pool: asyncpg.Pool,
) -> None:
    await succeeded(pool, "refused", 10 * DAY)
    refusing = AttemptLedger(pool).record_rejected(
        Key("q", "refused"),
        max_attempts=3,
        reason="too-large",
        failure=Failure("TooLarge", "too large", "", "fp"),
        snapshot=SNAPSHOT,
    )

    assert not await compacted_under(pool, "refused", refusing)
    await succeeded(pool, "dead-lettered", 10 * DAY)
    recorded = await compacted_under(pool, "dead-lettered", broker_dead(pool, ["dead-lettered"]))

    assert recorded == []
    assert await ledger_keys(pool) == set()


async def test_refusals_and_the_reconciler_see_a_compacted_key_as_done(
    pool: asyncpg.Pool,
) -> None:
    await succeeded(pool, "done", 10 * DAY)
    await compact(pool)

    stored = await AttemptLedger(pool).record_rejected(
        Key("q", "done"),
        max_attempts=3,
        reason="too-large",
        failure=Failure("TooLarge", "too large", "", "fp"),
        snapshot=SNAPSHOT,
    )
    assert not stored  # a duplicate, not a new dead letter
    recorded = await broker_dead(pool, ["done", "other"])
    assert [r["message_id"] for r in recorded] == ["other"]
    statuses = await pool.fetch(query("reconcile_key_statuses"), "q", ["done", "other", "never"])
    assert {r["message_id"]: r["status"] for r in statuses} == {
        "done": "succeeded",
        "other": "dead",
    }


async def test_compacted_keys_go_when_the_retention_window_ends(pool: asyncpg.Pool) -> None:
    await succeeded(pool, "young", 10 * DAY)
    await compact(pool)
    await pool.execute("INSERT INTO rabbitretry.succeeded_key SELECT rabbitretry.key_hash('q', k),"
                       " now() - interval '40 days', 1 FROM generate_series(1, 5) AS g,"
                       " format('x%s', g) AS k")  # fmt: skip

    pruned = await compact(pool, batch=2)

    assert (pruned.ledger, pruned.succeeded_keys) == (0, 5)
    assert await pool.fetchval("SELECT count(*) FROM rabbitretry.succeeded_key") == 1
    assert (await AttemptLedger(pool).claim(request("x1"))).verdict == "claimed"  # forgotten


async def test_the_hash_keeps_queue_and_message_id_apart(pool: asyncpg.Pool) -> None:
    same = await pool.fetchval(
        "SELECT rabbitretry.key_hash('ab', 'c') = rabbitretry.key_hash('a', 'bc')"
    )
    assert same is False
