"""The drill's verdict catches what it exists to catch: each rule broken once, by name."""

from __future__ import annotations

import asyncpg

from drills.consumer import CREATE_EFFECTS, EFFECTS_TABLE
from drills.plan import Message
from drills.verify import unfinished, verify

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
