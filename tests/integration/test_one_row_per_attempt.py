"""One row per attempt (migration 0018): the running attempt lives on its ledger row, a success
writes nothing else, and the attempt log keeps only the attempts that ended otherwise.
A ledger upgraded while attempts were open keeps every message's history whole."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from rabbitretry.ledger import migrations
from rabbitretry.ledger.attempts import AttemptLedger
from rabbitretry.ledger.commits import ClaimRequest
from rabbitretry.ledger.failures import Failure
from rabbitretry.ledger.statements import Key, Snapshot
from tests.conftest import fresh_database

SNAPSHOT = Snapshot(body=b"{}", headers={}, properties={}, exchange="", routing_key="q")
# The claim of a 0017 ledger: it also opens the attempt's log row.
OLD_CLAIM = (
    "SELECT * FROM rabbitretry.claim($1, $2, 3, $3, 'old-worker', 0, '', '{}', '{}', '', 'q')"
)
HISTORY = (
    "SELECT attempt, outcome, worker FROM rabbitretry.attempt_history"
    " WHERE queue = 'q' AND message_id = $1 ORDER BY attempt"
)


def request(message_id: str, lease_seconds: float = 30.0) -> ClaimRequest:
    return ClaimRequest(
        Key("q", message_id),
        max_attempts=3,
        lease_seconds=lease_seconds,
        worker="w-1",
        copy_attempts=0,
        snapshot=SNAPSHOT,
    )


async def logged(pool: asyncpg.Pool) -> int:
    count: int = await pool.fetchval("SELECT count(*) FROM rabbitretry.attempt")
    return count


async def test_a_first_attempt_success_writes_the_ledger_row_alone(pool: asyncpg.Pool) -> None:
    ledger = AttemptLedger(pool)
    claim = await ledger.claim(request("ok"))
    assert claim.verdict == "claimed"
    assert await ledger.succeed(Key("q", "ok"), claim.attempt)
    assert await logged(pool) == 0
    assert [tuple(r) for r in await pool.fetch(HISTORY, "ok")] == [(1, "succeeded", "w-1")]


async def test_a_retried_message_logs_its_failure_and_shows_its_success(
    pool: asyncpg.Pool,
) -> None:
    ledger = AttemptLedger(pool)
    key = Key("q", "flaky")
    first = await ledger.claim(request("flaky"))
    failure = Failure(type="Boom", message="boom", traceback="", fingerprint="f")
    await ledger.schedule_retry(key, first.attempt, 0.0, failure)
    second = await ledger.claim(request("flaky"))
    assert second.verdict == "claimed" and second.attempt == 2
    assert await ledger.mark_started(key, second.attempt)
    assert await ledger.succeed(key, second.attempt)
    history = await pool.fetch(HISTORY, "flaky")
    assert [(r["attempt"], r["outcome"]) for r in history] == [(1, "retry"), (2, "succeeded")]
    assert await logged(pool) == 1
    started = await pool.fetchval(
        "SELECT handler_started_at IS NOT NULL FROM rabbitretry.attempt_history"
        " WHERE message_id = 'flaky' AND attempt = 2"
    )
    assert started is True


@pytest.fixture
async def ledger_at_0017(
    server_database_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[str]:
    """An empty database migrated to 0017, the last version with two rows per attempt."""
    every = migrations.shipped()
    async with fresh_database(server_database_url, None) as url:
        conn = await asyncpg.connect(url)
        try:
            with monkeypatch.context() as patch:
                patch.setattr(migrations, "shipped", lambda: [m for m in every if m[0] <= 17])
                await migrations.migrate(conn)
        finally:
            await conn.close()
        yield url


async def test_an_upgrade_with_attempts_open_keeps_every_history_whole(
    ledger_at_0017: str,
) -> None:
    conn = await asyncpg.connect(ledger_at_0017)
    try:
        # Before: a message that succeeded (its attempt logged), one in flight, one whose
        # worker died (its lease lapsed), each with its open attempt-log row.
        await conn.execute(OLD_CLAIM, "q", "done", 30.0)
        await conn.execute(
            "WITH f AS (UPDATE rabbitretry.ledger SET status = 'succeeded', finished_at = now(),"
            " lease_until = NULL, payload = NULL, headers = NULL, properties = NULL"
            " WHERE message_id = 'done' RETURNING 1)"
            " UPDATE rabbitretry.attempt SET outcome = 'succeeded', finished_at = now()"
            " WHERE message_id = 'done'"
        )
        await conn.execute(OLD_CLAIM, "q", "running", 30.0)
        await conn.execute(OLD_CLAIM, "q", "lost", 30.0)
        await conn.execute(
            "UPDATE rabbitretry.attempt SET handler_started_at = now() WHERE message_id = 'lost'"
        )
        await conn.execute(  # its worker died, and its lease has run out since
            "UPDATE rabbitretry.ledger SET lease_until = now() - interval '1 second'"
            " WHERE message_id = 'lost'"
        )
        assert (await migrations.migrate(conn))[0] == "0018_one_row_per_attempt"

        history = {
            key: [tuple(r) for r in await conn.fetch(HISTORY, key)]
            for key in ("done", "running", "lost")
        }
        assert history == {
            "done": [(1, "succeeded", "old-worker")],
            "running": [(1, None, "old-worker")],
            "lost": [(1, None, "old-worker")],
        }
        # The open attempts moved to their rows: only the old success is still logged.
        assert await conn.fetchval("SELECT count(*) FROM rabbitretry.attempt") == 1

        # The lost worker's attempt had started: the next claim closes it as crashed, logged.
        claim = await conn.fetchrow(
            "SELECT * FROM rabbitretry.claim('q', 'lost', 3, 30, 'new-worker', 1, '', '{}',"
            " '{}', '', 'q')"
        )
        assert (claim["verdict"], claim["attempt"]) == ("claimed", 2)
        assert [tuple(r) for r in await conn.fetch(HISTORY, "lost")] == [
            (1, "crashed", "old-worker"),
            (2, None, "new-worker"),
        ]
    finally:
        await conn.close()
