"""The CLI as a user runs it: a subprocess with the services' URLs in its environment."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rabbitretry import topology_of
from tests.acceptance.cli_runner import broker_cleanup_fixture  # noqa: F401 (fixture)
from tests.acceptance.slow import Slow
from tests.integration.conftest import BrokerCleanup


@pytest.fixture
def cli(amqp_url: str, database_url: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``rabbitretry ARGS`` against this test's database; the finished process."""

    def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "RABBITRETRY_AMQP_URL": amqp_url,
            "RABBITRETRY_DATABASE_URL": database_url,
            "COLUMNS": "200",
        }
        return subprocess.run(
            [str(Path(sys.executable).parent / "rabbitretry"), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run


@pytest.fixture
def slow_queue(queue_name: str, broker_cleanup: BrokerCleanup) -> str:
    """A queue of this test's for ``tests.acceptance.slow:Slow`` (``RR_SLOW_QUEUE``)."""
    consumer: Any = type("SlowHere", (Slow,), {"queue": queue_name})
    broker_cleanup.topology(topology_of([consumer]))
    return queue_name
