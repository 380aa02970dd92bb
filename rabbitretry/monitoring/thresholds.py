"""Service levels: each queue's measured levels judged against thresholds. Pure, no I/O.

The levels are those the reference articles recommend watching: p95 and p99 end-to-end
latency over a recent window, the broker backlog, messages retried many times, dead letters
waiting for a person, and the age of every periodic component's heartbeat.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from rabbitretry.monitoring.heartbeat import Heartbeat

RETRIED_OVER = 5
"""A message counts as "retried many times" once it has been retried more than this."""


@dataclass(frozen=True)
class Thresholds:
    """What healthy means; a level at or over its limit is a breach."""

    p95: float = 5.0
    """seconds"""
    p99: float = 10.0
    """seconds"""
    backlog: int = 500
    """messages ready in the work queue"""
    dead: int = 0
    """dead letters allowed to wait before it is a breach"""
    retried: int | None = None
    """messages retried more than RETRIED_OVER times; None: reported, never a breach"""
    required_heartbeats: tuple[str, ...] = ()
    """components that must have a heartbeat row (a missing one is a breach)"""


@dataclass(frozen=True)
class QueueLevels:
    queue: str
    finished: int = 0
    """messages that succeeded or were skipped within the window"""
    p95: float | None = None
    """seconds from publish (or first seen) to finish; None when nothing finished"""
    p99: float | None = None
    backlog: int | None = None
    """messages ready on the broker; None when unknown (broker unreachable, queue missing)"""
    retried: int = 0
    dead: int = 0


@dataclass(frozen=True)
class HeartbeatLevel:
    name: str
    age: float | None
    """seconds since its last run finished; None when it never ran"""
    stale: bool
    failing: bool
    error: str | None = None


@dataclass(frozen=True)
class Breach:
    subject: str
    """the queue or component"""
    level: str
    """p95, p99, backlog, dead, retried or heartbeat"""
    value: str
    limit: str

    def __str__(self) -> str:
        return f"{self.subject}: {self.level} {self.value} (limit {self.limit})"


@dataclass(frozen=True)
class Report:
    window: float
    """seconds of history the latencies cover"""
    queues: list[QueueLevels]
    heartbeats: list[HeartbeatLevel]
    breaches: list[Breach] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.breaches

    def as_json(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "window_seconds": self.window,
            "queues": [asdict(q) for q in self.queues],
            "heartbeats": [asdict(h) for h in self.heartbeats],
            "breaches": [asdict(b) for b in self.breaches],
        }


def queue_breaches(levels: QueueLevels, limits: Thresholds) -> list[Breach]:
    found: list[Breach] = []
    if levels.p95 is not None and levels.p95 >= limits.p95:
        found.append(Breach(levels.queue, "p95", _seconds(levels.p95), f"< {_seconds(limits.p95)}"))
    if levels.p99 is not None and levels.p99 >= limits.p99:
        found.append(Breach(levels.queue, "p99", _seconds(levels.p99), f"< {_seconds(limits.p99)}"))
    if levels.backlog is not None and levels.backlog >= limits.backlog:
        found.append(Breach(levels.queue, "backlog", str(levels.backlog), f"< {limits.backlog}"))
    if levels.dead > limits.dead:
        found.append(Breach(levels.queue, "dead", str(levels.dead), f"<= {limits.dead}"))
    if limits.retried is not None and levels.retried > limits.retried:
        found.append(Breach(levels.queue, "retried", str(levels.retried), f"<= {limits.retried}"))
    return found


def heartbeat_level(beat: Heartbeat, now: datetime) -> HeartbeatLevel:
    return HeartbeatLevel(
        name=beat.name,
        age=round(beat.age(now), 3),
        stale=beat.is_stale(now),
        failing=beat.failing,
        error=beat.error,
    )


def heartbeat_breaches(level: HeartbeatLevel) -> list[Breach]:
    if level.age is None:
        return [Breach(level.name, "heartbeat", "never ran", "a recent run")]
    if level.stale:
        return [Breach(level.name, "heartbeat", f"stale for {_seconds(level.age)}", "a recent run")]
    if level.failing:
        return [Breach(level.name, "heartbeat", f"failing: {level.error}", "a successful run")]
    return []


def evaluate(
    queues: Sequence[QueueLevels],
    heartbeats: Iterable[Heartbeat],
    now: datetime,
    limits: Thresholds,
    window: float,
) -> Report:
    """Judge every queue and heartbeat; a required heartbeat that never ran is a breach."""
    beats = [heartbeat_level(beat, now) for beat in heartbeats]
    seen = {beat.name for beat in beats}
    beats += [
        HeartbeatLevel(name, age=None, stale=True, failing=False)
        for name in limits.required_heartbeats
        if name not in seen
    ]
    breaches = [b for q in queues for b in queue_breaches(q, limits)]
    breaches += [b for beat in beats for b in heartbeat_breaches(beat)]
    return Report(window=window, queues=list(queues), heartbeats=beats, breaches=breaches)


def _seconds(value: float) -> str:
    return f"{value:.3g}s" if value < 100 else f"{value:.0f}s"
