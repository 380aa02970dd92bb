"""``rabbitretry reconcile`` and ``rabbitretry job run`` as a user calls them."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator, Callable
from datetime import datetime

import asyncpg
import pytest

from rabbitretry import Topology, WorkQueue, amqp
from rabbitretry.reconcile.expected import Expected, Reconciliation
from rabbitretry.topology import declare
from tests.acceptance.cli_runner import (  # noqa: F401 (fixtures, requested by name)
    Run,
    broker_cleanup_fixture,
    rabbitretry_fixture,
)
from tests.integration.conftest import BrokerCleanup
from tests.integration.harness import queue_depth, status_of
from tests.integration.test_reconciler import Scene

Cli = Callable[..., subprocess.CompletedProcess[str]]


def test_reconcile_once_prints_its_report(cli: Cli) -> None:
    done = cli("reconcile", "--once")
    assert done.returncode == 0, done.stderr
    assert "overdue retries re-driven" in done.stdout
    assert "expired leases re-driven" in done.stdout


def test_reconcile_says_how_to_call_it(cli: Cli) -> None:
    unsure = cli("reconcile")
    assert unsure.returncode == 2
    assert unsure.stderr.strip() == "error: say --once, or --interval SECONDS to keep running"


def test_reconcile_refuses_a_target_it_cannot_use(cli: Cli) -> None:
    wrong = cli("reconcile", "--once", "rabbitretry.consumer:Context")
    assert wrong.returncode == 2
    assert "neither a Consumer class nor a Reconciliation" in wrong.stderr
    assert "Traceback" not in wrong.stderr


def test_job_run_refuses_what_is_not_a_job(cli: Cli) -> None:
    wrong = cli("job", "run", "rabbitretry.consumer:Context")
    assert wrong.returncode == 2
    assert "is not a job" in wrong.stderr


async def _broken_hook(start: datetime, end: datetime) -> AsyncIterator[Expected]:
    raise KeyError("a bug in the application's hook")
    yield  # an async generator


broken = Reconciliation("broken", "orders", _broken_hook, lookback=600, settle=0)
"""A reconciliation whose hook has a bug: ``tests.acceptance.test_reconcile_cli:broken``."""


@pytest.mark.asyncio
async def test_reconcile_json_names_a_failed_step_and_the_others_still_ran(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    broker_cleanup: BrokerCleanup,
    rabbitretry: Run,
) -> None:
    """A reconciliation's hook with a bug fails its step alone: the JSON line names it in
    failed_steps and errors, the re-drive before it was done, and the exit code is 1."""
    connection = await amqp.connect(amqp_url)
    try:
        topology = Topology(queues=[WorkQueue(name=queue_name)])
        await declare(connection, broker_cleanup.topology(topology))
    finally:
        await connection.close()
    await Scene(amqp_url, database_url, pool, queue_name, []).lost_retries(["lost"])

    done = await rabbitretry(
        "reconcile",
        "--once",
        "--json",
        "--grace",
        "1",
        "tests.acceptance.test_reconcile_cli:broken",
    )

    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = done.stdout.strip().splitlines()
    report = json.loads(line)
    assert report["failed_steps"] == ["reconciliation broken"]
    assert report["errors"] == [
        'reconciliation broken: KeyError: "a bug in the application\'s hook"'
    ]
    assert report["retries_redriven"] == 1  # the step before it ran
    assert report["windows"] == []
    assert "Traceback" not in done.stderr
    assert await status_of(pool, queue_name, "lost") == "retrying"
    assert await queue_depth(amqp_url, queue_name) == 1
