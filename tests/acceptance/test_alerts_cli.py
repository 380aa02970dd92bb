"""``rabbitretry alerts`` in a subprocess against the real ledger and a local webhook."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from tests.acceptance.cli import env_for, rabbitretry
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


async def test_a_test_alert_reaches_the_webhook_or_says_why(
    amqp_url: str, database_url: str, receiver: WebhookReceiver
) -> None:
    env = env_for(amqp_url, database_url)
    refused = await rabbitretry(env, "alerts", "test", "--webhook-url", receiver.url)
    assert refused.code == 1 and "did not accept it: HTTP 503" in refused.stderr
    accepted = await rabbitretry(env, "alerts", "test", "--webhook-url", receiver.url)
    assert accepted.code == 0 and "accepted the test alert" in accepted.stdout
    (body,) = receiver.accepted
    assert body["id"] == 0 and body["error_type"] == "TestAlert"
    assert "secret-token" not in refused.stderr + accepted.stdout
