"""``rabbitretry alerts`` and ``run --metrics-port`` in subprocesses against real services."""

from __future__ import annotations

import asyncio
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiormq
import asyncpg
import pytest

from tests.acceptance.cli import CLI, ROOT, env_for, rabbitretry
from tests.integration.conftest import BrokerCleanup
from tests.integration.harness import publish, queue_depth, wait_for, wait_status
from tests.webhook import WebhookReceiver

pytestmark = pytest.mark.slow


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    hook = await WebhookReceiver(fail_first=1).start()
    yield hook
    await hook.close()


async def test_deliver_retries_a_refused_alert_and_masks_the_webhook_secret(
    amqp_url: str, database_url: str, pool: asyncpg.Pool, receiver: WebhookReceiver
) -> None:
    await pool.execute(
        "INSERT INTO rabbitretry.ledger (queue, message_id, status, max_attempts, payload,"
        " error_type, error_message, error_fingerprint, finished_at)"
        " VALUES ('orders', 'o-1', 'dead', 1, '\\x'::bytea, 'KeyError', 'gone', 'fp', now())"
    )
    env = env_for(amqp_url, database_url, RABBITRETRY_ALERT_WEBHOOK_URL=receiver.url)
    refused = await rabbitretry(env, "alerts", "deliver", "--once", "--window", "0")
    assert refused.code == 1
    assert "0 delivered, 1 failed" in refused.stdout
    pending = await rabbitretry(env, "alerts", "list", "--status", "pending")
    assert "1 message dead on orders: KeyError" in pending.stdout
    assert "HTTP 503" in pending.stdout

    await pool.execute("UPDATE rabbitretry.alert SET next_try_at = now()")  # the backoff passed
    delivered = await rabbitretry(env, "alerts", "deliver", "--once", "--window", "0")
    assert delivered.code == 0, delivered.stderr
    assert "1 delivered" in delivered.stdout
    (body,) = receiver.accepted
    assert body["sample_keys"] == ["o-1"] and receiver.paths == [receiver.path] * 2

    listed = await rabbitretry(env, "alerts", "list")
    assert "sent" in listed.stdout
    for result in (refused, pending, delivered, listed):
        assert "secret-token" not in result.stdout + result.stderr
    assert "http://127.0.0.1:" in delivered.stdout and "/***" in delivered.stdout


async def test_deliver_without_a_webhook_is_a_usage_error(amqp_url: str, database_url: str) -> None:
    env = env_for(amqp_url, database_url)
    env.pop("RABBITRETRY_ALERT_WEBHOOK_URL", None)
    result = await rabbitretry(env, "alerts", "deliver", "--once")
    assert result.code == 2 and "RABBITRETRY_ALERT_WEBHOOK_URL" in result.stderr


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


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
    env = env_for(
        amqp_url,
        database_url,
        RR_TEST_QUEUE=queue_name,
        RR_MODE="slow",
        RR_SLEEP="0",
        RR_EVENTS=str(events),
    )
    broker_cleanup.queue(queue_name)
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
