"""``rabbitretry status`` in a subprocess against the real ledger and broker."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import asyncpg
import pytest

from rabbitretry import amqp
from tests.acceptance.cli import env_for, rabbitretry
from tests.integration.conftest import BrokerCleanup
from tests.integration.harness import publish

pytestmark = pytest.mark.slow


async def ledger_row(
    pool: asyncpg.Pool, queue: str, message_id: str, status: str, seconds: float, attempts: int
) -> None:
    await pool.execute(
        "INSERT INTO rabbitretry.ledger (queue, message_id, status, attempts, max_attempts,"
        " payload, first_seen, finished_at, error_type)"
        " VALUES ($1, $2, $3, $4, 10, '\\x'::bytea, now() - make_interval(secs => $5), now(),"
        " CASE WHEN $3 = 'dead' THEN 'KeyError' END)",
        queue,
        message_id,
        status,
        attempts,
        seconds,
    )


@pytest.fixture
async def busy_queue(amqp_url: str, pool: asyncpg.Pool, queue_name: str) -> AsyncIterator[str]:
    """A queue with 2 ready messages on the broker and 21 successes in the ledger."""
    connection = await amqp.connect(amqp_url, name="rabbitretry-tests")
    cleanup = BrokerCleanup()
    cleanup.queue(queue_name)
    try:
        channel = await connection.channel()
        await channel.declare_queue(queue_name, durable=True)
        await publish(amqp_url, queue_name, {"n": 1}, message_id="waiting", times=2)
        for i in range(20):
            await ledger_row(pool, queue_name, f"ok-{i}", "succeeded", 0.1 * i, attempts=1)
        await ledger_row(pool, queue_name, "slow-retrier", "succeeded", 1.0, attempts=7)
        yield queue_name
    finally:
        await cleanup.delete_all(connection)
        await connection.close()


async def test_healthy_queues_exit_zero_with_a_table(
    amqp_url: str, database_url: str, busy_queue: str
) -> None:
    result = await rabbitretry(env_for(amqp_url, database_url), "status")
    assert result.code == 0, result.stderr
    line = next(row for row in result.stdout.splitlines() if busy_queue in row)
    # latencies 0.0 .. 1.9 s and one 1.0 s: p95 and p99 by linear interpolation
    cells = [cell.strip() for cell in line.split("│")[2:8]]
    assert cells == ["21", "1.800s", "1.880s", "2", "1", "0"]
    assert "healthy" in result.stdout


async def test_a_dead_letter_breaches_and_json_says_why(
    amqp_url: str, database_url: str, pool: asyncpg.Pool, busy_queue: str
) -> None:
    await ledger_row(pool, busy_queue, "poison", "dead", 1.0, attempts=3)
    table = await rabbitretry(env_for(amqp_url, database_url), "status")
    assert table.code == 3
    assert f"{busy_queue}: dead 1 (limit <= 0)" in table.stdout

    result = await rabbitretry(env_for(amqp_url, database_url), "status", "--json")
    assert result.code == 3
    report = json.loads(result.stdout)
    assert report["healthy"] is False
    assert report["breaches"] == [
        {"subject": busy_queue, "level": "dead", "value": "1", "limit": "<= 0"}
    ]
    (levels,) = report["queues"]
    assert levels["dead"] == 1 and levels["backlog"] == 2 and levels["finished"] == 21


async def test_thresholds_are_options(amqp_url: str, database_url: str, busy_queue: str) -> None:
    env = env_for(amqp_url, database_url)
    backlog = await rabbitretry(env, "status", "--json", "--max-backlog", "2")
    assert backlog.code == 3
    assert [b["level"] for b in json.loads(backlog.stdout)["breaches"]] == ["backlog"]
    latency = await rabbitretry(env, "status", "--json", "--p95", "1.5", "--max-retried", "0")
    assert [b["level"] for b in json.loads(latency.stdout)["breaches"]] == ["p95", "retried"]
    missing = await rabbitretry(env, "status", "--json", "--require-heartbeat", "reconciler")
    assert json.loads(missing.stdout)["breaches"][0]["subject"] == "reconciler"


async def test_an_unreachable_broker_leaves_the_backlog_unknown(
    database_url: str, busy_queue: str
) -> None:
    env = env_for("amqp://guest:guest@127.0.0.1:1/", database_url)
    result = await rabbitretry(env, "status", "--json")
    assert result.code == 0, result.stderr
    (levels,) = json.loads(result.stdout)["queues"]
    assert levels["backlog"] is None
    table = await rabbitretry(env, "status")
    assert "unknown" in table.stdout and "Traceback" not in table.stderr


async def test_an_unreachable_ledger_is_one_line_and_exit_one(amqp_url: str) -> None:
    env = env_for(amqp_url, "postgresql://postgres:hunter2@127.0.0.1:1/postgres")
    result = await rabbitretry(env, "status")
    assert result.code == 1
    assert "hunter2" not in result.stderr and "Traceback" not in result.stderr
