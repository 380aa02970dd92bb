"""What an alert says, its retry backoff, and webhook URLs masked (pure)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from rabbitretry.monitoring.alert_content import Alert, backoff, mask_secret_url, payload, title

AT = datetime(2026, 1, 31, 12, 0, tzinfo=UTC)


def alert(kind: str = "dead", count: int = 3, **fields: object) -> Alert:
    values: dict[str, object] = {
        "id": 7,
        "kind": kind,
        "group_key": "ab12cd34ef56",
        "queue": "orders",
        "error_type": "KeyError",
        "error_message": "order 42 not found",
        "count": count,
        "sample_keys": ["o-1", "o-2"],
        "first_seen": AT,
        "last_seen": AT,
        "detail": {},
        "status": "pending",
        "tries": 0,
        "next_try_at": AT,
        "last_error": None,
        "sent_at": None,
    }
    values.update(fields)
    return Alert(**values)  # type: ignore[arg-type]


def test_a_dead_letter_alert_counts_its_messages() -> None:
    assert title(alert(count=1)) == "1 message dead on orders: KeyError"
    body = payload(alert())
    assert body["text"] == "3 messages dead on orders: KeyError"
    assert body["id"] == 7 and body["count"] == 3 and body["sample_keys"] == ["o-1", "o-2"]
    assert body["first_seen"] == "2026-01-31T12:00:00+00:00"


def test_condition_alerts_say_what_is_wrong() -> None:
    stale = alert("heartbeat", group_key="reconciler", error_message="stale for 90s")
    assert title(stale) == "reconciler heartbeat: stale for 90s"
    backlog = alert("backlog", error_message="600 messages ready (threshold 500)")
    assert title(backlog) == "backlog on orders: 600 messages ready (threshold 500)"


def test_backoff_doubles_up_to_a_cap_and_never_gives_up() -> None:
    assert [backoff(t) for t in (1, 2, 3, 4)] == [5.0, 10.0, 20.0, 40.0]
    assert backoff(50) == 300.0 and backoff(10_000) == 300.0


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://hooks.slack.com/services/T0/B0/XXXX", "https://hooks.slack.com/***"),
        ("https://user:pw@example.com:8443/hook?token=s3", "https://user:***@example.com:8443/***"),
        ("http://127.0.0.1:9000", "http://127.0.0.1:9000"),
        ("http://[::1", "<unparsable URL>"),
    ],
)
def test_webhook_urls_are_masked(url: str, shown: str) -> None:
    assert mask_secret_url(url) == shown
