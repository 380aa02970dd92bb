"""Heartbeats: every periodic component (the reconciler, a scheduled job) records its runs.

A component that stopped running, or whose runs keep failing, must be visible rather than
silent: its row in ``rabbitretry.heartbeat`` ages, and ``stale`` says when it is overdue.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rabbitretry.db import Executor, Record, query

# A component is stale once it has not finished a run for this many of its own periods.
STALE_AFTER_PERIODS = 2.0


@dataclass(frozen=True)
class Heartbeat:
    name: str
    instance: str
    started_at: datetime
    finished_at: datetime | None
    ok: bool | None
    counts: dict[str, Any]
    error: str | None
    expected_every: float

    def age(self, now: datetime) -> float:
        """Seconds since the last run finished (or, before any finished, since it started)."""
        return (now - (self.finished_at or self.started_at)).total_seconds()

    def is_stale(self, now: datetime) -> bool:
        return self.age(now) > STALE_AFTER_PERIODS * self.expected_every

    @property
    def failing(self) -> bool:
        return self.ok is False


async def started(executor: Executor, name: str, instance: str, expected_every: float) -> None:
    """Record that a run of ``name`` began (the previous run's outcome is kept until it ends)."""
    await executor.execute(query("heartbeat_started"), name, instance, expected_every)


async def finished(
    executor: Executor,
    name: str,
    *,
    counts: dict[str, Any] | None = None,
    error: str | None = None,
) -> None:
    """Record the end of the current run: ``ok`` unless ``error`` is given."""
    await executor.execute(
        query("heartbeat_finished"), name, json.dumps(counts or {}, default=str), error
    )


async def read_all(executor: Executor) -> list[Heartbeat]:
    return [_heartbeat(row) for row in await executor.fetch(query("heartbeat_all"))]


def _heartbeat(row: Record) -> Heartbeat:
    return Heartbeat(
        name=row["name"],
        instance=row["instance"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        ok=row["ok"],
        counts=json.loads(row["counts"]),
        error=row["error"],
        expected_every=row["expected_every"],
    )
