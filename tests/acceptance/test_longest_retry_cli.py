"""A message retrying with the longest delay a policy may set stays readable everywhere.

A handler asks for ``Retry(delay=1e300)`` under a policy whose ``max_delay`` is the absolute
bound (:data:`rabbitretry.retry.MAX_DELAY`, 46 hours): the wait is capped, with a warning,
and every command and page that reads the retrying row answers without error.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import asyncpg
import pytest
from pydantic import BaseModel

from rabbitretry import Consumer, Context, Retry, RetryPolicy
from rabbitretry.console import Auth, ConsoleConfig
from rabbitretry.retry import MAX_DELAY
from tests.acceptance.cli_runner import (  # noqa: F401 (fixtures, requested by name)
    Run,
    broker_cleanup_fixture,
    cleanup_fixture,
    rabbitretry_fixture,
)
from tests.integration.console_harness import TOKEN, console_client, log_in
from tests.integration.harness import publish, running_worker, wait_status

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


class Item(BaseModel):
    n: int


def no_traceback(result: Any) -> str:
    assert result.returncode in (0, 3), result.stderr  # 3: status's breach, not a failure
    assert "Traceback" not in result.stderr and "rror" not in result.stderr, result.stderr
    return str(result.stdout)


async def test_the_longest_delay_is_capped_and_its_row_reads_everywhere(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    rabbitretry: Run,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="rabbitretry")

    class Patient(Consumer[Item]):
        retry = RetryPolicy(max_attempts=3, initial_delay=1.0, max_delay=MAX_DELAY, jitter=0.0)

        async def handle(self, msg: Item, ctx: Context) -> None:
            raise Retry("come back in a googol of years", delay=1e300)

    Patient.queue = queue_name
    cleanup.append(Patient)
    async with running_worker([Patient], amqp_url, database_url):
        await publish(amqp_url, queue_name, {"n": 1}, message_id="later")
        await wait_status(pool, queue_name, "later", "retrying", timeout=30)
    row = await pool.fetchrow(
        "SELECT extract(epoch FROM next_retry_at - now()) AS wait, attempts"
        " FROM rabbitretry.ledger WHERE queue = $1 AND message_id = 'later'",
        queue_name,
    )
    assert row is not None and row["attempts"] == 1
    assert MAX_DELAY - 60 < row["wait"] <= MAX_DELAY, row["wait"]
    capped = [r.getMessage() for r in caplog.records if "a retry was asked for" in r.getMessage()]
    assert len(capped) == 1 and "1e+300" in capped[0] and "165600.0 s" in capped[0], capped

    listed = json.loads(
        no_traceback(await rabbitretry("dead", "list", "--status", "retrying", "--json"))
    )
    assert [(m["message_id"], m["status"]) for m in listed] == [("later", "retrying")]
    shown = no_traceback(await rabbitretry("dead", "show", "later", "--queue", queue_name))
    assert "retrying" in shown and "googol" in shown
    stats = no_traceback(await rabbitretry("ledger", "stats"))
    assert queue_name in stats
    status = no_traceback(await rabbitretry("status", "--json"))
    assert queue_name in status
    reconciled = await rabbitretry("reconcile", "--once")
    assert reconciled.returncode == 0, reconciled.stdout + reconciled.stderr
    assert await pool.fetchval(
        "SELECT status FROM rabbitretry.ledger WHERE message_id = 'later'"
    ) == ("retrying")  # not due: the reconciler leaves it parked

    config = ConsoleConfig(
        database_url=database_url,
        amqp_url=amqp_url,
        auth=Auth(token=TOKEN),
        allowed_hosts=("console.test",),
    )
    async with console_client(config) as client:
        await log_in(client)
        for path in (
            "/",
            "/messages?status=retrying",
            f"/message?queue={queue_name}&id=later",
            "/export.jsonl?status=retrying",
        ):
            page = await client.get(path)
            assert page.status_code == 200, (path, page.text)
        assert "later" in (await client.get("/messages?status=retrying")).text
