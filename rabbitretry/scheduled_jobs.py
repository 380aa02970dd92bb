"""Scheduled jobs: periodic work that is safe to start from cron on several machines.

::

    @job(every=3600)
    async def expire_coupons(ctx: JobContext) -> dict[str, int]:
        last_id = ctx.checkpoint or 0
        while batch := await fetch_coupons_after(last_id):
            await expire(batch)
            last_id = batch[-1].id
            await ctx.save(last_id)  # a crash resumes from here
        await ctx.clear()           # the next run starts over
        return {"last_id": last_id}

Run it with ``rabbitretry job run myapp.jobs:expire_coupons`` (or :func:`run_job`). What the
cron problem needs, and each run gets:

* an overlap lock (a Postgres advisory lock per job name): a second instance, on this machine
  or another, finds the job running and exits cleanly instead of running it twice;
* a resumable checkpoint (``rabbitretry.job_checkpoint``): saved as the job goes, handed to
  the next run, so a job that crashed does not start from scratch;
* a heartbeat per run (start, end, counts, error), where ``rabbitretry status`` and the alerts
  see a job that failed or stopped running.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rabbitretry.db import UNAVAILABLE, Pool, query
from rabbitretry.monitoring import heartbeat

__all__ = ["Job", "JobContext", "JobOutcome", "job", "run_job"]

log = logging.getLogger("rabbitretry.scheduled_jobs")


class JobContext:
    """What a running job gets: its name and checkpoint, and a way to save progress."""

    def __init__(self, pool: Pool, name: str, checkpoint: Any) -> None:
        self.pool = pool
        self.name = name
        self.checkpoint = checkpoint
        """The last checkpoint saved (by this run or a previous one), or None."""

    async def save(self, checkpoint: Any) -> None:
        """Store progress (any JSON value); a later run starts from it if this one dies."""
        await self.pool.execute(query("job_checkpoint_save"), self.name, json.dumps(checkpoint))
        self.checkpoint = checkpoint

    async def clear(self) -> None:
        """Forget the checkpoint: the job's work is complete and the next run starts afresh."""
        await self.pool.execute(query("job_checkpoint_clear"), self.name)
        self.checkpoint = None


JobFunction = Callable[[JobContext], Awaitable[Mapping[str, Any] | None]]


@dataclass(frozen=True)
class Job:
    """A periodic job: ``function`` runs about every ``every`` seconds (cron decides when)."""

    name: str
    function: JobFunction
    every: float

    def __post_init__(self) -> None:
        if self.every <= 0:
            raise ValueError("a job's period (every) must be positive")


def job(*, every: float, name: str | None = None) -> Callable[[JobFunction], Job]:
    """Decorate ``async def f(ctx: JobContext) -> counts | None`` into a :class:`Job`."""

    def wrap(function: JobFunction) -> Job:
        return Job(name=name or function.__name__, function=function, every=every)

    return wrap


@dataclass(frozen=True)
class JobOutcome:
    """How a start of a job ended: it ``ran``, ``failed``, or found itself already running."""

    name: str
    status: Literal["ran", "failed", "overlap"]
    counts: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def message(self) -> str:
        if self.status == "overlap":
            return f"job {self.name} is already running elsewhere; this start does nothing"
        if self.status == "failed":
            return f"job {self.name} failed: {self.error}"
        summary = ", ".join(f"{key} {value}" for key, value in self.counts.items())
        return f"job {self.name} done" + (f": {summary}" if summary else "")


async def run_job(pool: Pool, job: Job, *, instance: str | None = None) -> JobOutcome:
    """Run ``job`` once unless another instance holds its lock; failures are recorded, not raised.

    The lock lives on one pooled connection for the whole run (the job's own statements use
    others, so the pool needs at least two); if this process dies, the server releases it.
    """
    instance = instance or f"{socket.gethostname()}:{os.getpid()}"
    async with pool.acquire() as lock_conn:
        if not await lock_conn.fetchval(query("job_try_lock"), job.name):
            log.info("job %s is already running elsewhere", job.name)
            return JobOutcome(job.name, "overlap")
        try:
            return await _run_locked(pool, job, instance)
        finally:
            with contextlib.suppress(*UNAVAILABLE):
                await lock_conn.fetchval(query("job_unlock"), job.name)


async def _run_locked(pool: Pool, job: Job, instance: str) -> JobOutcome:
    await heartbeat.started(pool, job.name, instance, job.every)
    stored = await pool.fetchval(query("job_checkpoint_load"), job.name)
    ctx = JobContext(pool, job.name, json.loads(stored) if stored is not None else None)
    try:
        counts = dict(await job.function(ctx) or {})
    except Exception as error:
        log.exception("job %s failed", job.name)
        message = f"{type(error).__name__}: {error}"
        await heartbeat.finished(pool, job.name, error=message)
        return JobOutcome(job.name, "failed", error=message)
    await heartbeat.finished(pool, job.name, counts=counts)
    return JobOutcome(job.name, "ran", counts=counts)
