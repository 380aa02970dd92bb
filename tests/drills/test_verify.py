"""The drill's verdict catches what it exists to catch: each rule broken once, by name."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import asyncpg

from drills.consumer import CREATE_EFFECTS, EFFECTS_TABLE
from drills.plan import Message
from drills.verify import HandlerStarts, read_handler_starts, unfinished, verify

QUEUE = "rr-drill-verify"


async def _row(
    conn: asyncpg.Connection, key: str, status: str, attempts: int, logged: int, effects: int
) -> None:
    await conn.execute(
        "INSERT INTO rabbitretry.ledger (queue, message_id, status, attempts, max_attempts,"
        " lease_until, next_retry_at, payload) VALUES ($1, $2, $3, $4, 6, now(), now(), '')",
        QUEUE,
        key,
        status,
        attempts,
    )
    for attempt in range(1, logged + 1):
        await conn.execute(
            "INSERT INTO rabbitretry.attempt (queue, message_id, attempt, worker, outcome)"
            " VALUES ($1, $2, $3, 'w', 'retry')",
            QUEUE,
            key,
            attempt,
        )
    for attempt in range(1, effects + 1):
        await conn.execute(
            f"INSERT INTO {EFFECTS_TABLE} (message_id, attempt, pid) VALUES ($1, $2, 1)",
            key,
            attempt,
        )


async def test_every_rule_names_the_key_that_breaks_it(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(CREATE_EFFECTS)
        await _row(conn, "fine", "succeeded", 2, 2, 1)
        await _row(conn, "fine-dead", "dead", 1, 1, 0)
        await _row(conn, "twice", "succeeded", 1, 1, 2)
        await _row(conn, "dead-with-effect", "dead", 1, 1, 1)
        await _row(conn, "stuck", "retrying", 1, 1, 0)
        await _row(conn, "poison-succeeded", "succeeded", 1, 1, 1)
        await _row(conn, "miscounted", "succeeded", 3, 2, 1)
        await _row(conn, "no-effect", "succeeded", 1, 1, 0)
        messages = [
            Message("fine", "transient", 1),
            Message("fine-dead", "poison"),
            Message("twice", "ok"),
            Message("dead-with-effect", "crasher"),
            Message("stuck", "ok"),
            Message("poison-succeeded", "poison"),
            Message("miscounted", "ok"),
            Message("no-effect", "ok"),
            Message("never-seen", "ok"),
        ]
        verdict = await verify(conn, QUEUE, messages)
        assert await unfinished(conn, QUEUE, [m.message_id for m in messages]) == 2
    finally:
        await conn.close()

    assert not verdict.ok
    assert [key.split()[0] for key in verdict.lost] == ["stuck", "never-seen", "no-effect"]
    assert [key.split()[0] for key in verdict.duplicate_effects] == ["twice", "dead-with-effect"]
    assert [key.split()[0] for key in verdict.wrong_state] == ["poison-succeeded"]
    assert [key.split()[0] for key in verdict.miscounted] == ["miscounted"]
    assert verdict.succeeded == 5 and verdict.dead == 2
    assert "drill: 3 lost: stuck (retrying), never-seen (no ledger row)" in verdict.explain()[0]


async def test_handler_runs_are_compared_with_the_attempt_log(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(CREATE_EFFECTS)
        await _row(conn, "ran", "succeeded", 2, 2, 1)
        await _row(conn, "charged", "succeeded", 2, 2, 1)
        await _row(conn, "forgotten", "succeeded", 1, 1, 1)
        await _row(conn, "interrupted", "succeeded", 2, 2, 1)
        await _row(conn, "given-back", "succeeded", 2, 2, 1)
        await _row(conn, "died-unmarked", "succeeded", 2, 2, 1)
        await conn.execute(
            "UPDATE rabbitretry.attempt SET outcome = 'crashed', error_type = 'WorkerLost'"
            " WHERE message_id = 'charged' AND attempt = 1"
        )
        await conn.execute(
            "UPDATE rabbitretry.attempt SET outcome = 'interrupted', error_type = 'NotStarted'"
            " WHERE message_id IN ('given-back', 'died-unmarked') AND attempt = 1"
        )
        await conn.execute(
            "UPDATE rabbitretry.attempt SET outcome = 'interrupted'"
            " WHERE message_id = 'interrupted' AND attempt = 1"
        )
        starts: HandlerStarts = Counter(
            {
                ("ran", 1): 1,
                ("ran", 2): 1,
                ("charged", 2): 1,  # attempt 1 was charged, its handler never started
                ("forgotten", 1): 2,  # a claim lost, its attempt number given again
                ("interrupted", 1): 2,  # forgiven: the next attempt is 1 again in the budget
                ("given-back", 1): 1,  # attempt 1's handler never ran, and was not counted
                ("died-unmarked", 1): 2,  # attempt 1's worker died before its start mark
                ("not-sent", 1): 1,
            }
        )
        keys = ("ran", "charged", "forgotten", "interrupted", "given-back", "died-unmarked")
        messages = [Message(key, "ok") for key in keys]
        verdict = await verify(conn, QUEUE, messages, starts)
        unknown = await verify(conn, QUEUE, messages)
    finally:
        await conn.close()

    assert verdict.handler_runs == 10
    assert verdict.charged_without_run == ["charged (attempt 1: crashed WorkerLost)"]
    assert verdict.uncharged_runs == ["forgotten (attempt 1: 2 run(s), 1 attempt row(s))"]
    assert verdict.ok  # figures, not rules (yet)
    assert verdict.figures()[0].startswith("drill: 1 attempts charged without a handler run")
    assert unknown.handler_runs is None
    assert unknown.figures() == ["drill: handler starts were not recorded"]


def test_handler_starts_are_read_from_the_consumers_file(tmp_path: Path) -> None:
    path = tmp_path / "starts"
    assert read_handler_starts(path) == Counter()
    path.write_text("m1 1 100\nm1 1 101\nm2 3 100\nm3 2")  # the last line cut short
    assert read_handler_starts(path) == Counter({("m1", 1): 2, ("m2", 3): 1})
