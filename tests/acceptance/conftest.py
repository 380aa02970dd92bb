"""The CLI in subprocesses against the real services: fixtures and a runner."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tests.integration.conftest import amqp_connection, broker_cleanup, cleanup

__all__ = ["amqp_connection", "broker_cleanup", "cleanup"]

CLI = [sys.executable, "-c", "from rabbitretry.cli import main; main()"]
ROOT = Path(__file__).resolve().parents[2]  # so that MODULE:CLASS targets in tests/ import

Run = Callable[..., Awaitable[subprocess.CompletedProcess[str]]]


@pytest.fixture
def rabbitretry(amqp_url: str, database_url: str) -> Run:
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
