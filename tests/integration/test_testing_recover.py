"""``rabbitretry.testing.recover`` tells a hook what a worker's run is told: the run it builds
is the one the ledger's trigger queues."""

from __future__ import annotations

import json

import asyncpg
import pytest

from rabbitretry.consumer import Death
from rabbitretry.delivery.recovery_runs import run_headers, run_message_id
from rabbitretry.ledger import recover_hooks
from rabbitretry.topology import names

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize(
    ("message_id", "error"),
    [("order-7", "the WMS refused this order"), ("ü" * 101, "é" * 3000)],
    ids=["short", "hashed-id-cut-error"],
)
async def test_the_run_is_the_one_the_trigger_queues(
    pool: asyncpg.Pool, queue_name: str, message_id: str, error: str
) -> None:
    await recover_hooks.register(pool, queue_name, names.recover_queue(queue_name))
    await pool.execute(
        "INSERT INTO rabbitretry.ledger (queue, message_id, status, attempts, max_attempts,"
        " replays, payload, reason, error_type, error_message, finished_at)"
        " VALUES ($1, $2, 'dead', 3, 3, 2, '{}', 'attempts-exhausted', 'TimeoutError', $3, now())",
        queue_name,
        message_id,
        error,
    )
    queued = await pool.fetchrow("SELECT message_id, headers FROM rabbitretry.outbox")
    death = Death(queue_name, message_id, "attempts-exhausted", "TimeoutError", error, 3)
    assert queued["message_id"] == run_message_id(message_id, replays=2)
    assert json.loads(queued["headers"]) == run_headers(death)
