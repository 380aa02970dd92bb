"""``rabbitretry status --json`` prints one document on one line, as docs/operations.md says."""

from __future__ import annotations

import json

import asyncpg
import pytest

from tests.acceptance.cli import env_for, rabbitretry

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("dead", [0, 1], ids=["healthy", "breached"])
async def test_status_json_is_one_line(
    amqp_url: str, database_url: str, pool: asyncpg.Pool, queue_name: str, dead: int
) -> None:
    await pool.execute(
        "INSERT INTO rabbitretry.ledger (queue, message_id, status, attempts, max_attempts,"
        " payload, first_seen, finished_at)"
        " VALUES ($1, 'done', 'succeeded', 1, 5, '\\x'::bytea, now() - interval '1 s', now())",
        queue_name,
    )
    if dead:
        await pool.execute(
            "INSERT INTO rabbitretry.ledger (queue, message_id, status, attempts, max_attempts,"
            " payload, first_seen, finished_at, error_type)"
            " VALUES ($1, 'poison', 'dead', 5, 5, '\\x'::bytea, now(), now(), 'KeyError')",
            queue_name,
        )

    result = await rabbitretry(env_for(amqp_url, database_url), "status", "--json")

    assert result.code == (3 if dead else 0), result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout  # `rabbitretry status --json | wc -l` is 1
    assert result.stdout.endswith("\n")
    report = json.loads(lines[0])
    assert report["healthy"] is not dead
    [level] = [q for q in report["queues"] if q["queue"] == queue_name]
    assert level["dead"] == dead
    assert level["backlog"] is None  # the queue is not on the broker: unknown, not judged
