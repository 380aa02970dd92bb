"""The Prometheus endpoint of a real worker that processed real messages, in-process and as
``rabbitretry run --metrics-port`` in a subprocess."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aio_pika
import aiormq
import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from rabbitretry import Consumer, Context, Permanent, Retry, RetryPolicy
from rabbitretry.monitoring import heartbeat, metrics
from rabbitretry.outbox import Outbox
from rabbitretry.topology import Topology
from tests.integration import crash_consumers
from tests.integration.conftest import BrokerCleanup
from tests.integration.harness import publish, queue_depth, running_worker, wait_for, wait_status

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-c", "from rabbitretry.cli import main; main()"]


class Job(BaseModel):
    n: int


def consumer_for(queue: str) -> type[Consumer[Job]]:
    class Mixed(Consumer[Job]):
        async def handle(self, msg: Job, ctx: Context) -> None:
            if msg.n == 1 and ctx.attempt == 1:
                raise Retry("not yet")
            if msg.n == 2:
                raise Permanent("never")

    Mixed.queue = queue
    Mixed.retry = RetryPolicy(max_attempts=3, initial_delay=0.5, jitter=0.0)
    return Mixed


async def get(port: int, path: str) -> tuple[bytes, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return head, body


async def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    head, body = await get(port, "/metrics")
    assert head.startswith(b"HTTP/1.1 200")
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


async def publish_stamped(amqp_url: str, queue: str, message_id: str, at: datetime) -> None:
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        await channel.default_exchange.publish(
            aio_pika.Message(b'{"n": 0}', message_id=message_id, timestamp=at),
            routing_key=queue,
        )
    finally:
        await connection.close()


async def test_a_worker_serves_delivery_and_ledger_metrics(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    consumer = consumer_for(queue_name)
    cleanup.append(consumer)
    await heartbeat.started(pool, "reconciler", "host:1", expected_every=30)
    await heartbeat.finished(pool, "reconciler")
    async with pool.acquire() as conn, conn.transaction():
        await Outbox().enqueue(conn, "", {"x": 1}, routing_key="nowhere", message_id="o-1")

    observed = metrics.WorkerMetrics(pool)
    async with (
        metrics.serving(observed, pool, port=0, host="127.0.0.1") as port,
        running_worker([consumer], amqp_url, database_url, on_outcome=observed.observe),
    ):
        an_hour_ago = datetime.now(UTC) - timedelta(hours=1)
        await publish_stamped(amqp_url, queue_name, "stamped", an_hour_ago)
        for n in (1, 2):
            await publish(amqp_url, queue_name, {"n": n}, message_id=f"m{n}")
        await wait_status(pool, queue_name, "stamped", "succeeded")
        await wait_status(pool, queue_name, "m1", "succeeded")
        await wait_status(pool, queue_name, "m2", "dead")
        samples = await scrape(port)
        missing, _ = await get(port, "/nope")
        assert missing.startswith(b"HTTP/1.1 404")

    q = queue_name
    processed = "rabbitretry_processed_total"
    assert value(samples, processed, queue=q, outcome="succeeded") == 2
    assert value(samples, processed, queue=q, outcome="retrying") == 1
    assert value(samples, processed, queue=q, outcome="dead") == 1
    handler = "rabbitretry_handler_duration_seconds_count"
    assert value(samples, handler, queue=q, outcome="succeeded") == 2
    assert value(samples, handler, queue=q, outcome="retrying") == 1
    assert value(samples, "rabbitretry_attempts_sum", queue=q, outcome="succeeded") == 1 + 2
    assert value(samples, "rabbitretry_attempts_count", queue=q, outcome="dead") == 1

    latency = "rabbitretry_end_to_end_latency_seconds"
    assert value(samples, f"{latency}_count", queue=q, outcome="succeeded") == 2
    # The stamped message counts from its publish timestamp, an hour before it was consumed.
    assert value(samples, f"{latency}_sum", queue=q, outcome="succeeded") >= 3600
    assert value(samples, f"{latency}_bucket", queue=q, outcome="succeeded", le="900.0") == 1

    ledger = "rabbitretry_ledger_messages"
    assert value(samples, ledger, queue=q, status="dead") == 1
    assert value(samples, ledger, queue=q, status="retrying") == 0
    assert value(samples, "rabbitretry_outbox_messages", status="pending") == 1
    assert value(samples, "rabbitretry_outbox_oldest_pending_age_seconds") >= 0
    assert value(samples, "rabbitretry_heartbeat_age_seconds", component="reconciler") >= 0
    assert value(samples, "rabbitretry_heartbeat_healthy", component="reconciler") == 1
    assert value(samples, "rabbitretry_ledger_up") == 1


async def test_ledger_metrics_say_when_the_ledger_is_down(pool: asyncpg.Pool) -> None:
    await pool.close()
    text = (await metrics.render_ledger_metrics(pool)).decode()
    assert "rabbitretry_ledger_up 0.0" in text


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.slow
async def test_run_serves_metrics_on_its_port(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    broker_cleanup: BrokerCleanup,
    tmp_path: Path,
) -> None:
    events = tmp_path / "events.log"
    events.touch()
    port = free_port()
    env = {
        **os.environ,
        "RABBITRETRY_AMQP_URL": amqp_url,
        "RABBITRETRY_DATABASE_URL": database_url,
        "RR_TEST_QUEUE": queue_name,
        "RR_MODE": "slow",
        "RR_SLEEP": "0",
        "RR_EVENTS": str(events),
    }
    # The worker declares Crashy's whole topology on this test's queue: delete all of it.
    declared = crash_consumers.Crashy.work_queue().model_copy(update={"name": queue_name})
    broker_cleanup.topology(Topology(queues=[declared]))
    log = (tmp_path / "worker.log").open("wb")
    worker = await asyncio.create_subprocess_exec(
        *CLI,
        "run",
        "tests.integration.crash_consumers:Crashy",
        "--declare",
        "--metrics-port",
        str(port),
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=log,
    )
    try:

        async def scraped() -> str:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                return ""
            writer.write(b"GET /metrics HTTP/1.1\r\n\r\n")
            text = (await reader.read()).decode()
            writer.close()
            return text

        await wait_for(scraped, timeout=30)
        await wait_for(lambda: _declared(amqp_url, queue_name), timeout=30)
        for n in range(3):
            await publish(amqp_url, queue_name, {"n": n}, message_id=f"m{n}")
        for n in range(3):
            await wait_status(pool, queue_name, f"m{n}", "succeeded")

        async def counted() -> str:
            text = await scraped()
            line = f'rabbitretry_processed_total{{outcome="succeeded",queue="{queue_name}"}} 3.0'
            return text if line in text else ""

        text = await wait_for(counted, timeout=15)
        assert "rabbitretry_ledger_up 1.0" in text
        assert f'rabbitretry_ledger_messages{{queue="{queue_name}",status="dead"}} 0.0' in text
    finally:
        worker.send_signal(signal.SIGTERM)
        await asyncio.wait_for(worker.wait(), 30)
        log.close()
    assert worker.returncode == 0, (tmp_path / "worker.log").read_text()


async def _declared(amqp_url: str, queue: str) -> bool:
    try:
        await queue_depth(amqp_url, queue)
    except aiormq.exceptions.ChannelNotFoundEntity:
        return False
    return True
