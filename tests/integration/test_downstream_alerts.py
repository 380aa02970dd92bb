"""A downstream breaker's alerts, from the SQL transitions that raise them to the webhook:
one per transition, sent in order (a refused "unavailable" holds back the "recovered"), with
the messages waiting on the downstream's queues asked of the real broker."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest

from rabbitretry import amqp
from rabbitretry.ledger import downstreams
from rabbitretry.monitoring import alerts
from rabbitretry.monitoring.alert_content import Alert, duration, title
from tests.acceptance.cli import env_for, rabbitretry
from tests.integration.conftest import BrokerCleanup
from tests.integration.harness import publish
from tests.webhook import WebhookReceiver

UNREACHABLE_BROKER = "amqp://guest:guest@127.0.0.1:1/"
CLOCK = r"\d\d:\d\d:\d\d UTC"


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    hook = await WebhookReceiver().start()
    yield hook
    await hook.close()


async def trip(pool: asyncpg.Pool, name: str = "wms", error: str = "HTTP 500") -> None:
    """A failure that opens ``name`` at once (threshold 1), as a worker's would."""
    await pool.fetch(
        "SELECT * FROM rabbitretry.downstream_failed($1, 'w1', 1, 30, 1, 15, $2, 'q', 'm', 1)",
        name,
        error,
    )


async def recover(pool: asyncpg.Pool, name: str = "wms", failed_probes: int = 0) -> None:
    """``failed_probes`` probes of worker w1 fail, then one succeeds: the breaker closes."""
    for _ in range(failed_probes):
        await pool.execute(
            "UPDATE rabbitretry.downstream SET state = 'half-open', probe_worker = 'w1'"
            " WHERE name = $1",
            name,
        )
        await trip(pool, name)
    await pool.execute(
        "UPDATE rabbitretry.downstream SET state = 'half-open', probe_worker = 'w1'"
        " WHERE name = $1",
        name,
    )
    assert await downstreams.succeeded(pool, name, "w1") == "closed"


async def alert_rows(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    return await pool.fetch("SELECT * FROM rabbitretry.alert ORDER BY id")


async def declared_queue(
    amqp_url: str, connection: amqp.Connection, cleanup: BrokerCleanup, name: str, ready: int
) -> str:
    channel = await connection.channel()
    await channel.declare_queue(cleanup.queue(name), durable=True)
    await channel.close()
    if ready:
        await publish(amqp_url, name, {"n": 1}, message_id=None, times=ready)
    return name


async def test_an_outage_sends_unavailable_then_recovered_with_the_messages_waiting(
    amqp_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    amqp_connection: amqp.Connection,
    broker_cleanup: BrokerCleanup,
    receiver: WebhookReceiver,
) -> None:
    ship = await declared_queue(amqp_url, amqp_connection, broker_cleanup, queue_name, 3)
    await downstreams.declare(pool, ["wms"], ship)
    await downstreams.declare(pool, ["wms"], f"{queue_name}-missing")
    await trip(pool, error="wms is unavailable: WmsUnavailable: HTTP 500\nInternal Server Error")
    await trip(pool, error="HTTP 502")  # met while open: no second alert
    await recover(pool, failed_probes=2)
    await trip(pool, error="HTTP 503")  # a second outage is a second alert
    kinds = [(r["kind"], r["error_type"]) for r in await alert_rows(pool)]
    assert kinds == [
        ("downstream", "DownstreamUnavailable"),
        ("downstream", "DownstreamRecovered"),
        ("downstream", "DownstreamUnavailable"),
    ]

    deliverer = alerts.AlertDeliverer(pool, receiver.url, amqp_url=amqp_url)
    stats = await deliverer.round()
    assert (stats.sent, stats.failed) == (3, 0)
    opened, recovered, again = receiver.accepted
    assert [body["id"] for body in receiver.accepted] == sorted(
        body["id"] for body in receiver.accepted
    )
    waiting = f"3 messages waiting on {ship}, {queue_name}-missing unknown"
    assert re.fullmatch(
        rf"wms unavailable since {CLOCK} \(1 failure, last: wms is unavailable: "
        rf"WmsUnavailable: HTTP 500 Internal Server Error\); {re.escape(waiting)}",
        opened["text"],
    ), opened["text"]
    assert opened["kind"] == "downstream" and opened["group"] == "wms" and opened["count"] == 1
    assert opened["detail"]["state"] == "open"
    assert opened["detail"]["waiting"] == [
        {"queue": ship, "ready": 3},
        {"queue": f"{queue_name}-missing", "ready": None},
    ]
    assert re.fullmatch(
        rf"wms recovered at {CLOCK} after \d+ s down \(2 failed probes\)", recovered["text"]
    ), recovered["text"]
    assert recovered["error_type"] == "DownstreamRecovered"
    assert again["text"].startswith("wms unavailable since ") and "last: HTTP 503)" in again["text"]

    rows = await alert_rows(pool)
    assert [r["status"] for r in rows] == ["sent"] * 3
    # What was sent is kept: the listing shows the same text.
    assert json.loads(rows[0]["detail"])["waiting"] == opened["detail"]["waiting"]
    listed = await alerts.recent(pool)
    assert [title(alert) for alert in reversed(listed)] == [b["text"] for b in receiver.accepted]


async def test_a_refused_unavailable_holds_back_the_recovered_until_it_is_sent(
    pool: asyncpg.Pool, receiver: WebhookReceiver
) -> None:
    await trip(pool)
    await recover(pool)
    receiver.fail_first = 1
    first = await alerts.deliver_due(pool, receiver.url, retry_base=0.3)
    assert (first.sent, first.failed) == (0, 1) and receiver.requests == 1
    opened, recovered = await alert_rows(pool)
    assert opened["status"] == "pending" and opened["tries"] == 1
    assert opened["last_error"] == "HTTP 503 Refused"
    assert recovered["status"] == "pending" and recovered["tries"] == 0  # held, not tried
    assert recovered["next_try_at"] >= opened["next_try_at"]

    # Even when due, the recovered alert waits behind the unavailable one that backs off.
    await pool.execute(
        "UPDATE rabbitretry.alert SET next_try_at = now() WHERE id = $1", recovered["id"]
    )
    held = await alerts.deliver_due(pool, receiver.url)
    assert (held.sent, held.failed) == (0, 0) and receiver.requests == 1

    await pool.execute("UPDATE rabbitretry.alert SET next_try_at = now()")
    sent = await alerts.deliver_due(pool, receiver.url)
    assert (sent.sent, sent.failed) == (2, 0)
    assert [body["error_type"] for body in receiver.accepted] == [
        "DownstreamUnavailable",
        "DownstreamRecovered",
    ]


async def test_an_older_alert_leased_to_another_deliverer_holds_back_the_newer(
    pool: asyncpg.Pool, receiver: WebhookReceiver
) -> None:
    await trip(pool)
    (opened,) = await alert_rows(pool)
    # Another deliverer took the unavailable alert (its lease runs) and has not sent it yet.
    await pool.execute(
        "UPDATE rabbitretry.alert SET tries = 1, next_try_at = now() + interval '1 minute'"
    )
    await recover(pool)
    await trip(pool, name="billing")  # another downstream's alert is not held back
    stats = await alerts.deliver_due(pool, receiver.url)
    assert stats.sent == 1 and [b["group"] for b in receiver.accepted] == ["billing"]
    await pool.execute("UPDATE rabbitretry.alert SET status = 'sent' WHERE id = $1", opened["id"])
    stats = await alerts.deliver_due(pool, receiver.url)
    assert stats.sent == 1 and receiver.accepted[-1]["error_type"] == "DownstreamRecovered"


@pytest.mark.parametrize("broker", [UNREACHABLE_BROKER, None], ids=["broker-away", "no-broker"])
async def test_the_messages_waiting_are_unknown_when_the_broker_cannot_be_asked(
    pool: asyncpg.Pool, receiver: WebhookReceiver, broker: str | None
) -> None:
    await downstreams.declare(pool, ["wms"], "orders.ship")
    await trip(pool, error="HTTP 500")
    stats = await alerts.deliver_due(pool, receiver.url, amqp_url=broker)
    assert stats.sent == 1
    (body,) = receiver.accepted
    assert re.fullmatch(
        rf"wms unavailable since {CLOCK} \(1 failure, last: HTTP 500\); messages waiting: unknown",
        body["text"],
    ), body["text"]
    (row,) = await alert_rows(pool)
    assert "waiting" not in json.loads(row["detail"])  # unknown is not kept: a retry asks again


async def test_alerts_list_shows_the_downstream_alerts(
    amqp_url: str, database_url: str, pool: asyncpg.Pool
) -> None:
    await trip(pool, error="HTTP 500")
    await recover(pool, failed_probes=1)
    listed = await rabbitretry(env_for(amqp_url, database_url), "alerts", "list", "--json")
    assert listed.code == 0, listed.stderr
    recovered, opened = json.loads(listed.stdout)
    assert opened["kind"] == "downstream" and opened["status"] == "pending"
    assert opened["title"].endswith("(1 failure, last: HTTP 500); messages waiting: unknown")
    assert re.fullmatch(
        rf"wms recovered at {CLOCK} after \d+ s down \(1 failed probe\)", recovered["title"]
    )


def downstream_alert(detail: dict[str, object], count: int = 5, message: str = "HTTP 500") -> Alert:
    at = datetime(2026, 1, 31, 22, 0, 3, 250000, tzinfo=UTC)
    return Alert(
        id=1,
        kind="downstream",
        group_key="wms",
        queue=None,
        error_type="DownstreamUnavailable",
        error_message=message,
        count=count,
        sample_keys=[],
        first_seen=at,
        last_seen=at,
        detail=detail,
        status="pending",
        tries=0,
        next_try_at=at,
        last_error=None,
        sent_at=None,
    )


def test_the_texts_of_an_outage() -> None:
    opened = downstream_alert(
        {
            "state": "open",
            "since": "2026-01-31T23:00:03.25+01:00",  # as PostgreSQL writes it in another zone
            "forgiven": 4,
            "waiting": [{"queue": "orders.ship", "ready": 1203}],
        }
    )
    assert title(opened) == (
        "wms unavailable since 22:00:03 UTC (5 failures, last: HTTP 500); "
        "1,203 messages waiting on orders.ship"
    )
    several = downstream_alert(
        {
            "state": "open",
            "waiting": [
                {"queue": "orders.ship", "ready": 1},
                {"queue": "orders.bill", "ready": 5},
                {"queue": "orders.gone", "ready": None},
            ],
        },
        message="x" * 500,
    )
    text = title(several)
    assert text.endswith(
        "…); 1 message waiting on orders.ship, 5 on orders.bill, orders.gone unknown"
    )
    assert len(text) < 300
    closed = downstream_alert(
        {
            "state": "closed",
            "since": "2026-01-31T22:30:10.9+00:00",
            "down_since": "2026-01-31T22:01:03.1+00:00",
            "probes": 12,
        }
    )
    assert title(closed) == "wms recovered at 22:30:10 UTC after 29 min 7 s down (12 failed probes)"
    assert [duration(s) for s in (0, 59, 60, 3599, 3600, 7500, 90000)] == [
        "0 s",
        "59 s",
        "1 min",
        "59 min 59 s",
        "1 h",
        "2 h 5 min",
        "1 d 1 h",
    ]
