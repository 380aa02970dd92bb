"""``/healthz`` on the metrics port of a real worker: 200 while the broker connection is open,
the database answers and the consumers run; 503 naming the check that failed otherwise. Also
``rabbitretry run`` in a subprocess: ``--metrics-host``, and JSON logs with delivery fields."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest

from rabbitretry import Consumer, Context, Worker, db
from rabbitretry.monitoring import metrics
from rabbitretry.topology import Topology
from tests.integration import crash_consumers
from tests.integration.conftest import BrokerCleanup
from tests.integration.harness import publish, running_worker, wait_for, wait_status
from tests.integration.test_metrics import _declared, free_port, get
from tests.integration.test_pipeline import Job, make_consumer
from tests.proxy import Proxy

ROOT = Path(__file__).resolve().parents[2]


async def _ok(msg: Job, ctx: Context) -> None:
    pass


async def healthz(port: int) -> tuple[int, dict[str, Any]]:
    head, body = await get(port, "/healthz")
    status = int(head.split(b" ", 2)[1])
    assert b"Content-Type: application/json" in head
    return status, json.loads(body)


def answers(port: int, status: int, **checks: str) -> Any:
    """A condition for wait_for: /healthz answers ``status``, with checks that start so."""

    async def condition() -> dict[str, Any] | None:
        code, document = await healthz(port)
        if code != status:
            return None
        if any(not document["checks"][k].startswith(v) for k, v in checks.items()):
            return None
        return document

    condition.__name__ = f"/healthz answers {status} {checks}"
    return condition


async def test_healthz_follows_the_broker_the_database_and_the_consumers(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    broker_proxy: Proxy,
) -> None:
    parts = urlsplit(database_url)
    database_proxy = await Proxy(parts.hostname or "127.0.0.1", parts.port or 5432).start()
    consumer = make_consumer(queue_name, _ok)
    cleanup.append(consumer)
    assert Worker([consumer], amqp_url).health().checks["consumers"] == "not started"
    endpoint_pool = await db.create_pool(database_proxy.url_for(database_url), max_size=2)
    try:
        async with running_worker(
            [consumer], broker_proxy.url_for(amqp_url), database_proxy.url_for(database_url)
        ) as worker:
            observed = metrics.WorkerMetrics(endpoint_pool)
            async with metrics.serving(
                observed, endpoint_pool, port=0, health=worker.health
            ) as port:
                status, document = await healthz(port)
                assert status == 200
                assert document == {
                    "status": "ok",
                    "checks": {
                        "broker": "ok",
                        "ledger": "ok",
                        "consumers": "ok",
                        "database": "ok",
                    },
                }

                await broker_proxy.cut(refuse=True)
                down = await wait_for(answers(port, 503, broker="the connection to RabbitMQ"))
                assert down["status"] == "unavailable"
                assert down["checks"]["database"] == "ok"
                broker_proxy.restore()
                await wait_for(answers(port, 200), timeout=30)
                # The consumers were restored with the connection: work flows again.
                await publish(amqp_url, queue_name, {"n": 1}, message_id="after-blip")
                await wait_status(pool, queue_name, "after-blip", "succeeded")

                await database_proxy.cut(refuse=True)
                down = await wait_for(answers(port, 503, database="the database"))
                assert down["checks"]["broker"] == "ok"
                database_proxy.restore()
                await wait_for(answers(port, 200), timeout=30)

                worker.stop()
                stopping = await wait_for(answers(port, 503, consumers="stopping"))
                assert stopping["checks"]["consumers"] == "stopping"
    finally:
        await endpoint_pool.close()
        await database_proxy.close()


@pytest.mark.slow
async def test_run_serves_healthz_on_loopback_and_logs_json(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    broker_cleanup: BrokerCleanup,
    tmp_path: Path,
) -> None:
    """``python -m rabbitretry --log-format json run -v --metrics-port P``: the port listens on
    127.0.0.1 by default; every log line is a JSON object; delivery lines carry their fields."""
    events = tmp_path / "events.log"
    events.touch()
    port = free_port()
    env = {
        **os.environ,
        "RABBITRETRY_AMQP_URL": amqp_url,
        "RABBITRETRY_DATABASE_URL": database_url,
        "RABBITRETRY_LOG_FORMAT": "json",
        "RR_TEST_QUEUE": queue_name,
        "RR_MODE": "slow",
        "RR_SLEEP": "0",
        "RR_EVENTS": str(events),
    }
    declared = crash_consumers.Crashy.work_queue().model_copy(update={"name": queue_name})
    broker_cleanup.topology(Topology(queues=[declared]))
    stderr = tmp_path / "worker.log"
    with stderr.open("wb") as log:
        worker = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "rabbitretry",
            "run",
            "tests.integration.crash_consumers:Crashy",
            "--declare",
            "-v",
            "--metrics-port",
            str(port),
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=log,
        )
        try:

            async def healthy() -> dict[str, Any] | None:
                try:
                    status, document = await healthz(port)
                except OSError:
                    return None
                return document if status == 200 else None

            document = await wait_for(healthy, timeout=30)
            assert document["checks"]["database"] == "ok"
            await wait_for(lambda: _declared(amqp_url, queue_name), timeout=30)
            await publish(amqp_url, queue_name, {"n": 1}, message_id="m1")
            await wait_status(pool, queue_name, "m1", "succeeded")
        finally:
            worker.send_signal(signal.SIGTERM)
            await asyncio.wait_for(worker.wait(), 30)
    text = stderr.read_text()
    assert worker.returncode == 0, text
    lines = [json.loads(line) for line in text.splitlines()]  # every line is one JSON object
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    started = [line for line in lines if "health on" in line["message"]]
    assert started and f"http://127.0.0.1:{port}/healthz" in started[0]["message"]
    (done,) = [line for line in lines if line.get("message_id") == "m1"]
    assert done["level"] == "DEBUG"
    assert done["queue"] == queue_name
    assert (done["attempt"], done["outcome"]) == (1, "succeeded")
    assert done["duration"] >= 0 and done["handler_duration"] >= 0
    assert done["worker"].endswith(":0")
