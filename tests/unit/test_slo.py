"""Judging service levels against thresholds (pure)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from rabbitretry.monitoring.heartbeat import Heartbeat
from rabbitretry.monitoring.thresholds import QueueLevels, Thresholds, evaluate, queue_breaches

NOW = datetime(2026, 1, 31, 12, 0, tzinfo=UTC)
HEALTHY = QueueLevels("orders", finished=100, p95=1.0, p99=2.0, backlog=10, retried=3, dead=0)


def beat(name: str, seconds_ago: float, *, every: float = 30, ok: bool | None = True) -> Heartbeat:
    finished = NOW - timedelta(seconds=seconds_ago)
    return Heartbeat(name, "host:1", finished, finished, ok, {}, None if ok else "boom", every)


def levels_breached(levels: QueueLevels, limits: Thresholds | None = None) -> list[str]:
    return [b.level for b in queue_breaches(levels, limits or Thresholds())]


def test_healthy_levels_breach_nothing() -> None:
    report = evaluate([HEALTHY], [beat("reconciler", 10)], NOW, Thresholds(), 900)
    assert report.healthy and report.breaches == []


def test_defaults_are_the_recommended_service_levels() -> None:
    assert Thresholds() == Thresholds(p95=5.0, p99=10.0, backlog=500, dead=0)


def test_each_level_breaches_at_its_limit() -> None:
    assert levels_breached(QueueLevels("q", p95=5.0, p99=5.0)) == ["p95"]
    assert levels_breached(QueueLevels("q", p95=4.9, p99=10.0)) == ["p99"]
    assert levels_breached(QueueLevels("q", backlog=500)) == ["backlog"]
    assert levels_breached(QueueLevels("q", backlog=499)) == []
    assert levels_breached(QueueLevels("q", dead=1)) == ["dead"]
    assert levels_breached(QueueLevels("q", dead=2), Thresholds(dead=2)) == []


def test_unknown_levels_are_not_breaches() -> None:
    assert levels_breached(QueueLevels("q", p95=None, p99=None, backlog=None)) == []


def test_retried_messages_breach_only_with_a_limit() -> None:
    many = QueueLevels("q", retried=50)
    assert levels_breached(many) == []
    assert levels_breached(many, Thresholds(retried=10)) == ["retried"]


def test_stale_failing_and_missing_heartbeats_breach() -> None:
    beats = [beat("fresh", 10), beat("stale", 61), beat("failing", 5, ok=False)]
    report = evaluate([], beats, NOW, Thresholds(required_heartbeats=("reconciler",)), 900)
    assert [(b.subject, b.value.split(" ")[0]) for b in report.breaches] == [
        ("stale", "stale"),
        ("failing", "failing:"),
        ("reconciler", "never"),
    ]
    assert not report.healthy


def test_a_required_heartbeat_that_ran_is_not_missing() -> None:
    report = evaluate([], [beat("reconciler", 1)], NOW, Thresholds(("reconciler",)), 900)
    assert report.healthy


def test_the_report_is_json() -> None:
    report = evaluate([HEALTHY, QueueLevels("b", dead=3)], [], NOW, Thresholds(), 900)
    data = json.loads(json.dumps(report.as_json()))
    assert data["healthy"] is False
    assert data["queues"][0]["p95"] == 1.0
    assert data["breaches"] == [{"subject": "b", "level": "dead", "value": "3", "limit": "<= 0"}]
