"""Fixtures for the dead-letter and console CLI tests: a runner and the broker cleanup.

Test modules import them by name (a plain module, so that it adds no conftest of its own).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from rabbitretry import Consumer, amqp, topology_of
from tests.integration.conftest import BrokerCleanup

__all__ = ["CLI", "ROOT", "Run", "broker_cleanup_fixture", "cleanup_fixture", "rabbitretry_fixture"]

CLI = [sys.executable, "-c", "from rabbitretry.cli import main; main()"]
ROOT = Path(__file__).resolve().parents[2]  # so that MODULE:CLASS targets in tests/ import

Run = Callable[..., Awaitable[subprocess.CompletedProcess[str]]]


@pytest.fixture(name="rabbitretry")
def rabbitretry_fixture(amqp_url: str, database_url: str) -> Run:
    """``await rabbitretry(ARGS...)`` against this test's database; returns the finished process."""

    async def run(*args: str, database: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "RABBITRETRY_AMQP_URL": amqp_url,
            "RABBITRETRY_DATABASE_URL": database or database_url,
            "COLUMNS": "250",
            "NO_COLOR": "1",
        }
        # In a thread: a test's in-process worker keeps running while the command waits on it.
        return await asyncio.to_thread(
            subprocess.run,
            [*CLI, *args],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=90,
        )

    return run


# The integration tier's cleanup fixtures, under their own names for this tier.


@pytest.fixture(name="broker_cleanup")
async def broker_cleanup_fixture(amqp_url: str) -> AsyncIterator[BrokerCleanup]:
    cleanup = BrokerCleanup()
    yield cleanup
    connection = await amqp.connect(amqp_url, name="rabbitretry-tests-cleanup")
    try:
        await cleanup.delete_all(connection)
    finally:
        await connection.close()


@pytest.fixture(name="cleanup")
async def cleanup_fixture(
    broker_cleanup: BrokerCleanup,
) -> AsyncIterator[list[type[Consumer[Any]]]]:
    """Append consumer classes; their queues are deleted after the test."""
    consumers: list[type[Consumer[Any]]] = []
    yield consumers
    for consumer in consumers:
        broker_cleanup.topology(topology_of([consumer]))
