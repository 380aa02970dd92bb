"""Commands given the ledger databases they act on (``--database``), in subprocesses."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from rabbitretry import Consumer
from tests.acceptance.cli_runner import (  # noqa: F401 (fixtures, requested by name)
    Run,
    broker_cleanup_fixture,
    cleanup_fixture,
    rabbitretry_fixture,
)
from tests.conftest import fresh_database
from tests.integration.harness import publish, running_worker, wait_status
from tests.integration.test_two_ledgers import EFFECTS, recording_consumer

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


async def test_db_migrate_and_status_act_on_each_database_given(
    server_database_url: str, rabbitretry: Run
) -> None:
    async with (
        fresh_database(server_database_url, None) as first,
        fresh_database(server_database_url, None) as second,
    ):
        given = ("--database", first, "--database", second)
        behind = await rabbitretry("db", "status", *given)
        assert behind.returncode == 1
        assert behind.stdout.count("pending: 0001_") == 2, behind.stdout

        migrated = await rabbitretry("db", "migrate", *given)
        assert migrated.returncode == 0, migrated.stderr
        for url in (first, second):
            assert f"{url}: applied 0001_" in migrated.stdout

        current = await rabbitretry("db", "status", *given)
        assert current.returncode == 0, current.stdout
        assert current.stdout.splitlines() == [
            f"{first}: the ledger schema is up to date",
            f"{second}: the ledger schema is up to date",
        ]


async def test_dead_list_and_reconcile_take_the_database_they_act_on(
    amqp_url: str,
    database_url: str,
    second_database_url: str,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    rabbitretry: Run,
) -> None:
    conn = await asyncpg.connect(second_database_url)
    try:
        await conn.execute(EFFECTS)
    finally:
        await conn.close()
    away = recording_consumer(queue_name, second_database_url)
    cleanup.append(away)
    async with running_worker([away], amqp_url, database_url):
        await publish(amqp_url, queue_name, {"fail": True}, message_id="a-dead")
        pool = await asyncpg.create_pool(second_database_url, min_size=1, max_size=1)
        try:
            await wait_status(pool, queue_name, "a-dead", "dead")
        finally:
            await pool.close()

    default = await rabbitretry("dead", "list", "--queue", queue_name)
    assert default.returncode == 0, default.stderr
    assert "a-dead" not in default.stdout
    second = await rabbitretry(
        "dead", "list", "--queue", queue_name, "--database", second_database_url
    )
    assert second.returncode == 0, second.stderr
    assert "a-dead" in second.stdout and "1 dead message(s)" in second.stdout

    both = await rabbitretry(
        "reconcile", "--once", "--database", database_url, "--database", second_database_url
    )
    assert both.returncode == 0, both.stderr
    assert both.stdout.count("reconciler pass") == 2
    assert database_url in both.stdout and second_database_url in both.stdout


async def test_a_malformed_database_option_is_one_line_naming_it(rabbitretry: Run) -> None:
    done = await rabbitretry("ledger", "stats", "--database", "postgresql://u:s3cret@h:x/db")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "error: --database (postgresql://u:***@h:x/db) has port 'x', which is not a number; "
        "expected postgresql://USER:PASSWORD@HOST:PORT/DATABASE"
    ]
