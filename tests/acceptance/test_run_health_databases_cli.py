"""``rabbitretry run --metrics-port`` with consumers in two ledger databases, in a subprocess:
``/healthz`` checks each database, and the ledger gauges carry a ``database`` label."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest

from rabbitretry import topology_of
from rabbitretry.urls import database_labels
from tests.acceptance import ledger_consumers
from tests.acceptance.cli_runner import (  # noqa: F401 (a fixture, requested by name)
    CLI,
    ROOT,
    broker_cleanup_fixture,
)
from tests.integration.conftest import BrokerCleanup
from tests.integration.harness import publish, wait_for
from tests.integration.test_metrics import free_port, get

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


async def test_run_reports_health_and_gauges_per_database(
    amqp_url: str,
    database_url: str,
    second_database_url: str,
    queue_name: str,
    broker_cleanup: BrokerCleanup,
    tmp_path: Path,
) -> None:
    port = free_port()
    env = {
        **os.environ,
        "RABBITRETRY_AMQP_URL": amqp_url,
        "RABBITRETRY_DATABASE_URL": database_url,
        "RR_AWAY_DATABASE_URL": second_database_url,
        "RR_TEST_QUEUE": queue_name,
    }
    for name in ("home", "away"):  # what --declare declares for this test's queues
        named = type(f"Test{name}", (ledger_consumers.Home,), {"queue": f"{queue_name}-{name}"})
        broker_cleanup.topology(topology_of([named]))
    labels = database_labels([database_url, second_database_url])
    first, second = labels[database_url], labels[second_database_url]
    log = (tmp_path / "worker.log").open("wb")
    worker = await asyncio.create_subprocess_exec(
        *CLI,
        "run",
        "tests.acceptance.ledger_consumers:Home",
        "tests.acceptance.ledger_consumers:Away",
        "--declare",
        "--metrics-port",
        str(port),
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=log,
    )
    try:

        async def healthy() -> dict[str, str] | None:
            assert worker.returncode is None, (tmp_path / "worker.log").read_text()
            try:
                head, body = await get(port, "/healthz")
            except OSError:
                return None
            return json.loads(body)["checks"] if head.startswith(b"HTTP/1.1 200") else None

        checks = await wait_for(healthy, timeout=30)
        assert checks == {
            "broker": "ok",
            f"ledger:{first}": "ok",
            f"ledger:{second}": "ok",
            "consumers": "ok",
            f"database:{first}": "ok",
            f"database:{second}": "ok",
        }
        _, metrics = await get(port, "/metrics")
        for label in (first, second):
            assert f'rabbitretry_ledger_up{{database="{label}"}} 1.0' in metrics.decode()

        away = f"{queue_name}-away"
        await publish(amqp_url, away, {"n": 1}, message_id="a1")
        line = (
            f'rabbitretry_ledger_messages{{database="{second}",queue="{away}",status="dead"}} 0.0'
        )

        async def counted() -> bool:
            _, body = await get(port, "/metrics")
            return line in body.decode()

        await wait_for(counted, timeout=30)
    finally:
        worker.send_signal(signal.SIGTERM)
        await asyncio.wait_for(worker.wait(), 30)
        log.close()
    assert worker.returncode == 0, (tmp_path / "worker.log").read_text()
