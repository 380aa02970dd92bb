"""Grouped ledger writes against the real database, and a busy worker through them."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from rabbitretry import Consumer, Context
from rabbitretry.db import query
from rabbitretry.ledger import Key, Snapshot
from rabbitretry.ledger.commits import ClaimRequest, LedgerCommits, Success
from tests.integration.harness import lock_waited_by, publish, running_worker, wait_for

pytestmark = pytest.mark.asyncio

SNAPSHOT = Snapshot(body=b"{}", headers={"h": 1}, properties={}, exchange="", routing_key="q")


def claim_request(message_id: str, queue: str = "q") -> ClaimRequest:
    return ClaimRequest(
        Key(queue, message_id),
        max_attempts=3,
        lease_seconds=30,
        worker="w",
        copy_attempts=0,
        snapshot=SNAPSHOT,
    )


async def test_a_group_of_claims_and_success_marks_writes_what_single_ones_would(
    pool: asyncpg.Pool,
) -> None:
    commits = LedgerCommits(pool)
    ids = ["c", "a", "b", "a"]  # unsorted, with a duplicate delivery of "a"
    claims = await asyncio.gather(*(commits.claims.submit(claim_request(i)) for i in ids))
    verdicts = [(c.verdict, c.attempt) for c in claims]
    assert verdicts.count(("claimed", 1)) == 3
    assert ("busy", 1) in verdicts  # the second copy of "a" found the first one's lease
    rows = await pool.fetch(
        "SELECT message_id, status, attempts, headers::text FROM rabbitretry.ledger"
        " ORDER BY message_id"
    )
    assert [(r["message_id"], r["status"], r["attempts"]) for r in rows] == [
        ("a", "processing", 1),
        ("b", "processing", 1),
        ("c", "processing", 1),
    ]
    assert all('"h": 1' in r["headers"] for r in rows)

    marks = await asyncio.gather(
        commits.successes.submit(Success(Key("q", "a"), 1)),
        commits.successes.submit(Success(Key("q", "b"), 2)),  # not the current attempt
        commits.successes.submit(Success(Key("q", "c"), 1, keep_snapshot=True)),
    )
    assert list(marks) == [True, False, True]
    statuses = await pool.fetch(
        "SELECT l.message_id, l.status, a.outcome, a.finished_at IS NOT NULL AS closed,"
        " l.payload IS NOT NULL AND l.headers IS NOT NULL AND l.properties IS NOT NULL AS kept"
        " FROM rabbitretry.ledger l JOIN rabbitretry.attempt_history a USING (queue, message_id)"
        " ORDER BY l.message_id"
    )
    assert [tuple(r) for r in statuses] == [
        ("a", "succeeded", "succeeded", True, False),  # its snapshot dropped on success
        ("b", "processing", None, False, True),
        ("c", "succeeded", "succeeded", True, True),  # keep_payload = "always"
    ]


async def commit_mode_after(conn: asyncpg.Connection, statement: str, *args: Any) -> str:
    async with conn.transaction():
        await conn.fetch(statement, *args)
        mode: str = await conn.fetchval("SHOW synchronous_commit")
    return mode


def one_claim_args(message_id: str) -> list[Any]:
    return ["q", message_id, 3, 30.0, "w", 0, b"{}", "{}", "{}", "", "q"]


def many_claim_args(message_ids: list[str]) -> list[Any]:
    columns = [[value] * len(message_ids) for value in one_claim_args("")]
    columns[1] = message_ids
    return columns


async def test_a_claim_outlives_its_callers_cancellation(pool: asyncpg.Pool) -> None:
    commits = LedgerCommits(pool)
    claiming = commits.claims.enqueue(claim_request("m"))

    async def caller() -> None:
        await claiming

    task = asyncio.create_task(caller())
    await asyncio.sleep(0)  # the caller now waits for the claim
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The cancellation reached the caller only once its claim was written, so it can give
    # the claim back.
    assert claiming.done() and not claiming.cancelled()
    assert claiming.result().verdict == "claimed"


async def test_only_successful_claims_skip_the_wait_for_their_flush(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        assert await commit_mode_after(conn, query("batching_claim"), *one_claim_args("x")) == "off"
        # "x" is now held: a second claim is busy, and may lead straight to an ack
        assert await commit_mode_after(conn, query("batching_claim"), *one_claim_args("x")) == "on"
        many = query("batching_claim_many")
        assert await commit_mode_after(conn, many, *many_claim_args(["y", "z"])) == "off"
        assert await commit_mode_after(conn, many, *many_claim_args(["w", "x"])) == "on"


async def test_a_key_inserted_meanwhile_fails_a_group_of_new_keys(pool: asyncpg.Pool) -> None:
    # New keys go in with a plain INSERT, not a speculative one (migration 0022): a key
    # another transaction inserted first fails the group once that transaction commits.
    async with pool.acquire() as conn, pool.acquire() as other:
        async with other.transaction():
            await other.fetch(query("batching_claim"), *one_claim_args("raced"))
            grouped = asyncio.create_task(
                conn.fetch(query("batching_claim_many"), *many_claim_args(["calm", "raced"]))
            )
            await wait_for(lock_waited_by(pool, "rabbitretry.claim_many("), timeout=10)
        with pytest.raises(asyncpg.UniqueViolationError):
            await grouped
    # Nothing of the failed group stayed.
    assert await pool.fetchval("SELECT count(*) FROM rabbitretry.ledger") == 1


async def test_claims_that_lose_the_insert_of_their_key_meet_the_winners_row(
    pool: asyncpg.Pool,
) -> None:
    commits = LedgerCommits(pool)
    async with pool.acquire() as other:
        async with other.transaction():
            await other.fetch(query("batching_claim"), *one_claim_args("raced"))
            claiming = [commits.claims.enqueue(claim_request(i)) for i in ("raced", "calm")]
            await wait_for(lock_waited_by(pool, "rabbitretry.claim"), timeout=10)
        claims = await asyncio.gather(*claiming)
    # Claimed again one by one through `claim`, which finds the other transaction's lease:
    # the copy is parked, not taken for content the ledger refuses (a unique violation is).
    assert [(c.verdict, c.attempt) for c in claims] == [("busy", 1), ("claimed", 1)]


async def test_a_group_statement_is_planned_once_whatever_its_size(pool: asyncpg.Pool) -> None:
    # A custom plan counts the arrays' elements: under 10 it looked cheaper than the generic
    # plan every time, and each group of a few writes was planned again (migration 0021).
    async with pool.acquire() as conn:
        for group in range(8):
            ids = [f"{group}-{i}" for i in range(4)]
            await conn.fetch(query("batching_claim_many"), *many_claim_args(ids))
            await conn.fetch(query("batching_succeeded_many"), ["q"] * 4, ids, [1] * 4, [False] * 4)
            await conn.fetch(query("batching_started_many"), ["q"] * 4, ids, [1] * 4)
        plans = await conn.fetch(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement = ANY($1::text[])",
            [query(name) for name in GROUPED],
        )
        # The statements run by the functions those call keep a generic plan too.
        settings = await conn.fetch(
            "SELECT proname, proconfig FROM pg_proc"
            " WHERE pronamespace = 'rabbitretry'::regnamespace AND proname = ANY($1::text[])",
            ["claim_many", "succeed_many", "mark_started_many"],
        )
    assert len(plans) == len(GROUPED)
    for plan in plans:
        # PostgreSQL tries five custom plans before it compares them with the generic one.
        assert plan["custom_plans"] <= 5 and plan["generic_plans"] >= 3, dict(plan)
    assert len(settings) == 3
    for function in settings:
        assert function["proconfig"] == ["plan_cache_mode=force_generic_plan"], dict(function)


GROUPED = ["batching_claim_many", "batching_succeeded_many", "batching_started_many"]


async def test_a_busy_worker_records_every_message_once(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    handled: list[str] = []

    class Many(Consumer[dict[str, int]]):
        queue = queue_name

        async def handle(self, msg: dict[str, int], ctx: Context) -> None:
            handled.append(ctx.message_id)

    cleanup.append(Many)
    count = 300
    async with running_worker([Many], amqp_url, database_url, concurrency=16):
        await asyncio.gather(
            *(publish(amqp_url, queue_name, {"n": i}, message_id=f"m{i}") for i in range(count))
        )

        async def all_succeeded() -> bool:
            done = await pool.fetchval(
                "SELECT count(*) FROM rabbitretry.ledger WHERE status = 'succeeded'"
            )
            return bool(done == count)

        await wait_for(all_succeeded, timeout=60)
    assert sorted(handled) == sorted(f"m{i}" for i in range(count))
    counts = await pool.fetchrow(
        "SELECT count(*) AS attempts, count(*) FILTER (WHERE outcome = 'succeeded') AS ok,"
        " (SELECT sum(attempts) FROM rabbitretry.ledger) AS counted"
        " FROM rabbitretry.attempt_history"
    )
    assert tuple(counts) == (count, count, count)
