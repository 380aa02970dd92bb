"""A handler's transaction that cannot commit is the attempt's failure, with the database's error.

Never ``crashed``/``WorkerLost``, never an outage of the ledger: the error the database gave
(a swallowed error that aborted the block, a deferred constraint, a serialization failure, a
deadlock) is recorded on the attempt and classified, lost races retried, the rest by the retry
policy.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, ClassVar
from urllib.parse import urlsplit

import asyncpg
import pytest
from pydantic import BaseModel

from rabbitretry import Consumer, Context, RetryPolicy
from tests.integration.harness import publish, running_worker, wait_for, wait_status

pytestmark = pytest.mark.asyncio


class Item(BaseModel):
    n: int


async def attempts_of(pool: asyncpg.Pool, message_id: str) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT attempt, outcome, error_type, error_message FROM rabbitretry.attempt_history"
        " WHERE message_id = $1 ORDER BY attempt",
        message_id,
    )


async def row_of(pool: asyncpg.Pool, message_id: str) -> asyncpg.Record:
    row = await pool.fetchrow(
        "SELECT status, reason, attempts, error_type, error_message FROM rabbitretry.ledger"
        " WHERE message_id = $1",
        message_id,
    )
    assert row is not None
    return row


def no_outage(caplog: pytest.LogCaptureFixture) -> None:
    lines = [r.getMessage() for r in caplog.records if "deliveries pause" in r.getMessage()]
    assert lines == [], lines
    unexpected = [r.getMessage() for r in caplog.records if "unexpected" in r.getMessage()]
    assert unexpected == [], unexpected


async def test_an_error_swallowed_inside_the_block_is_recorded_as_itself(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Swallows(Consumer[Item]):
        retry = RetryPolicy(max_attempts=2, initial_delay=0.5, jitter=0.0)

        async def handle(self, msg: Item, ctx: Context) -> None:
            async with ctx.transaction() as conn:
                with contextlib.suppress(asyncpg.DataError):  # the transaction is aborted
                    await conn.execute("SELECT 1 / 0")

    Swallows.queue = queue_name
    cleanup.append(Swallows)
    async with running_worker([Swallows], amqp_url, database_url):
        await publish(amqp_url, queue_name, {"n": 1}, message_id="s-1")
        await wait_status(pool, queue_name, "s-1", "dead", timeout=30)
    row = await row_of(pool, "s-1")
    assert row["reason"] == "attempts-exhausted" and row["attempts"] == 2, dict(row)
    assert row["error_type"] == "DivisionByZeroError", dict(row)
    assert "division by zero" in row["error_message"]
    outcomes = [(a["outcome"], a["error_type"]) for a in await attempts_of(pool, "s-1")]
    assert outcomes == [("retry", "DivisionByZeroError"), ("dead", "DivisionByZeroError")]
    no_outage(caplog)


async def test_a_deferred_constraint_broken_at_commit_follows_the_policy(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    await pool.execute(
        "CREATE TABLE booking (seat int, CONSTRAINT one_per_seat UNIQUE (seat)"
        " DEFERRABLE INITIALLY DEFERRED); INSERT INTO booking VALUES (7)"
    )

    class Books(Consumer[Item]):
        retry = RetryPolicy(max_attempts=3, permanent_on=(asyncpg.UniqueViolationError,))

        async def handle(self, msg: Item, ctx: Context) -> None:
            async with ctx.transaction() as conn:
                await conn.execute("INSERT INTO booking VALUES ($1)", msg.n)  # checked at commit

    Books.queue = queue_name
    cleanup.append(Books)
    async with running_worker([Books], amqp_url, database_url):
        await publish(amqp_url, queue_name, {"n": 7}, message_id="b-1")
        await wait_status(pool, queue_name, "b-1", "dead", timeout=30)
    row = await row_of(pool, "b-1")
    assert row["reason"] == "permanent-error" and row["attempts"] == 1, dict(row)
    assert row["error_type"] == "UniqueViolationError", dict(row)
    assert "one_per_seat" in row["error_message"]
    assert await pool.fetchval("SELECT count(*) FROM booking") == 1
    no_outage(caplog)


async def test_a_serialization_failure_at_commit_is_retried(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A write skew under SERIALIZABLE: the handler's transaction loses at commit."""
    await pool.execute(
        "CREATE TABLE on_call (doctor int PRIMARY KEY, on_duty bool NOT NULL);"
        "INSERT INTO on_call VALUES (1, true), (2, true)"
    )
    wrote = asyncio.Event()
    other_committed = asyncio.Event()

    class GoesOffDuty(Consumer[Item]):
        # Only ValueError is retried by the policy: the lost race is retried regardless.
        retry = RetryPolicy(max_attempts=3, initial_delay=0.5, jitter=0.0, retry_on=(ValueError,))

        async def handle(self, msg: Item, ctx: Context) -> None:
            async with ctx.transaction() as conn:
                if ctx.attempt == 1:
                    await conn.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
                await conn.fetchval("SELECT count(*) FROM on_call WHERE on_duty")
                await conn.execute("UPDATE on_call SET on_duty = false WHERE doctor = 1")
            if ctx.attempt == 1:
                wrote.set()
                await other_committed.wait()

    GoesOffDuty.queue = queue_name
    cleanup.append(GoesOffDuty)
    other = await asyncpg.connect(database_url)
    try:
        async with running_worker([GoesOffDuty], amqp_url, database_url):
            await publish(amqp_url, queue_name, {"n": 1}, message_id="d-1")
            await asyncio.wait_for(wrote.wait(), 15)
            async with other.transaction(isolation="serializable"):
                await other.fetchval("SELECT count(*) FROM on_call WHERE on_duty")
                await other.execute("UPDATE on_call SET on_duty = false WHERE doctor = 2")
            other_committed.set()
            await wait_status(pool, queue_name, "d-1", "succeeded", timeout=30)
    finally:
        await other.close()
    outcomes = [(a["outcome"], a["error_type"]) for a in await attempts_of(pool, "d-1")]
    assert outcomes == [("retry", "SerializationError"), ("succeeded", None)], outcomes
    no_outage(caplog)


@pytest.mark.parametrize("caught", [False, True], ids=["raised", "caught-then-commit"])
async def test_a_deadlock_between_two_handlers_is_retried(
    caught: bool,
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two handlers' transactions lock two rows in opposite order: the database ends one.

    Raised out of the block, or caught inside it (the block goes on; the commit then meets the
    aborted transaction and the deadlock is what the attempt records)."""
    await pool.execute(
        "CREATE TABLE stock (sku int PRIMARY KEY, count int NOT NULL);"
        "INSERT INTO stock VALUES (1, 10), (2, 10)"
    )
    locked = {1: asyncio.Event(), 2: asyncio.Event()}

    class Moves(Consumer[Item]):
        # Only ValueError is retried by the policy: the lost race is retried regardless.
        retry = RetryPolicy(max_attempts=3, initial_delay=0.5, jitter=0.0, retry_on=(ValueError,))

        async def handle(self, msg: Item, ctx: Context) -> None:
            first, second = msg.n, 3 - msg.n
            async with ctx.transaction() as conn:
                await conn.execute("UPDATE stock SET count = count - 1 WHERE sku = $1", first)
                if ctx.attempt == 1:  # each waits until the other holds its first row
                    locked[first].set()
                    await locked[second].wait()
                with contextlib.suppress(*((asyncpg.DeadlockDetectedError,) if caught else ())):
                    await conn.execute("UPDATE stock SET count = count + 1 WHERE sku = $1", second)

    Moves.queue = queue_name
    cleanup.append(Moves)
    async with running_worker([Moves], amqp_url, database_url, concurrency=2):
        await publish(amqp_url, queue_name, {"n": 1}, message_id="x-1")
        await publish(amqp_url, queue_name, {"n": 2}, message_id="x-2")
        await wait_status(pool, queue_name, "x-1", "succeeded", timeout=30)
        await wait_status(pool, queue_name, "x-2", "succeeded", timeout=30)
    histories = {
        key: [(a["outcome"], a["error_type"]) for a in await attempts_of(pool, key)]
        for key in ("x-1", "x-2")
    }
    assert sorted(histories.values()) == [
        [("retry", "DeadlockDetectedError"), ("succeeded", None)],
        [("succeeded", None)],
    ], histories
    (loser,) = [key for key, history in histories.items() if len(history) == 2]
    row = await row_of(pool, loser)
    assert row["attempts"] == 2, dict(row)
    (first,) = [a for a in await attempts_of(pool, loser) if a["outcome"] == "retry"]
    assert "deadlock detected" in first["error_message"], first["error_message"]
    # Both moves committed once each; the loser's first try left nothing behind.
    counts = await pool.fetch("SELECT count FROM stock ORDER BY sku")
    assert [r["count"] for r in counts] == [10, 10]
    no_outage(caplog)


async def test_a_repeatable_read_database_runs_handlers_longer_than_a_lease_renewal(
    amqp_url: str,
    server_database_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    name = urlsplit(database_url).path.lstrip("/")
    admin = await asyncpg.connect(server_database_url)
    try:
        await admin.execute(
            f"ALTER DATABASE {name} SET default_transaction_isolation = 'repeatable read'"
        )
    finally:
        await admin.close()
    await pool.execute("CREATE TABLE done (n int)")

    class Slow(Consumer[Item]):
        retry = RetryPolicy(max_attempts=1)
        lease = 3.0  # renewed every second: the handler outlasts two renewals
        levels: ClassVar[list[str]] = []

        async def handle(self, msg: Item, ctx: Context) -> None:
            if msg.n % 2:  # odd: without ctx.transaction()
                await asyncio.sleep(2.2)
                return
            async with ctx.transaction() as conn:
                self.levels.append(await conn.fetchval("SHOW transaction_isolation"))
                await conn.execute("INSERT INTO done VALUES ($1)", msg.n)
                await asyncio.sleep(2.2)

    Slow.queue = queue_name
    cleanup.append(Slow)
    ids = [f"r-{n}" for n in range(4)]
    async with running_worker([Slow], amqp_url, database_url, concurrency=2):
        for n, message_id in enumerate(ids):
            await publish(amqp_url, queue_name, {"n": n}, message_id=message_id)

        async def finished() -> bool:
            rows = await pool.fetch(
                "SELECT status FROM rabbitretry.ledger WHERE message_id = ANY($1)"
                " AND status IN ('succeeded', 'dead')",
                ids,
            )
            return len(rows) == len(ids)

        await wait_for(finished, timeout=40)
    for message_id in ids:
        row = await row_of(pool, message_id)
        assert row["status"] == "succeeded" and row["attempts"] == 1, (message_id, dict(row))
    assert sorted(await pool.fetch("SELECT n FROM done")) == [(0,), (2,)]
    assert Slow.levels == ["read committed", "read committed"]
    no_outage(caplog)
