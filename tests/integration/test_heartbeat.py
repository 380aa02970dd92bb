"""Heartbeats against the real database."""

from __future__ import annotations

from datetime import timedelta

import asyncpg

from rabbitretry.monitoring import heartbeat


async def test_a_run_is_recorded_and_ages_into_stale(pool: asyncpg.Pool) -> None:
    await heartbeat.started(pool, "reconciler", "host:1", expected_every=30)
    (running,) = await heartbeat.read_all(pool)
    assert running.ok is None and running.finished_at is None

    await heartbeat.finished(pool, "reconciler", counts={"redriven": 3})
    (done,) = await heartbeat.read_all(pool)
    assert done.ok is True and done.counts == {"redriven": 3} and done.error is None
    assert done.finished_at is not None
    assert not done.is_stale(done.finished_at + timedelta(seconds=60))
    assert done.is_stale(done.finished_at + timedelta(seconds=61))


async def test_a_failed_run_keeps_its_error(pool: asyncpg.Pool) -> None:
    await heartbeat.started(pool, "nightly", "host:2", expected_every=3600)
    await heartbeat.finished(pool, "nightly", error="ConnectionError: refused")
    (beat,) = await heartbeat.read_all(pool)
    assert beat.failing and beat.error == "ConnectionError: refused"
