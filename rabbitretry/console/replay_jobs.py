"""Replays of many messages run in the background; their pages show progress until done.

A rate-limited group replay or a canary waiting for its outcome takes longer than a request
should, so the console starts it as a task and redirects to the job's page, which refreshes
itself until the report is final. Jobs are written to the ledger's database when they start,
every few seconds while they run and when they end, so a restarted console, or a second one,
shows them; a job whose console stopped mid-way is shown as interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from rabbitretry import db
from rabbitretry.db import Pool, Record, query
from rabbitretry.operations import Progress, ReplayReport

log = logging.getLogger("rabbitretry.console")
SAVE_EVERY = 2.0  # seconds between two writes of a running job's progress
SHOWN = 50  # jobs listed on the audit page
SILENT_AFTER = timedelta(seconds=30)
"""A running job not written for this long belongs to a console that stopped."""


@dataclass
class Job:
    id: str
    title: str
    actor: str
    report: ReplayReport
    started: datetime = field(default_factory=lambda: datetime.now(UTC))
    done: bool = False
    error: str | None = None

    @property
    def state(self) -> str:
        """``running``, ``finished``, ``stopped`` (a failed canary) or ``failed``."""
        if not self.done:
            return "running"
        if self.error:
            return "failed"
        return "stopped" if self.report.stopped else "finished"


Runner = Callable[[str, Progress], Awaitable[ReplayReport]]
"""Runs a job, given its id (which names the replay in the audit) and where to report."""


class Jobs:
    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._running: dict[str, Job] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._saver = asyncio.create_task(self._save_running())

    async def start(self, title: str, actor: str, targets: int, run: Runner) -> Job:
        job = Job(id=secrets.token_hex(6), title=title, actor=actor, report=ReplayReport(targets))
        await self._save(job)
        self._running[job.id] = job
        task = asyncio.create_task(self._run(job, run))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job

    async def _run(self, job: Job, run: Runner) -> None:
        def progress(report: ReplayReport) -> None:
            job.report = report

        try:
            job.report = await run(job.id, progress)
        except asyncio.CancelledError:
            job.error = "interrupted: the console stopped"
            raise
        except Exception as error:  # shown on the job's page, not lost in a log
            log.exception("%s failed", job.title)
            job.error = f"{type(error).__name__}: {error}"
        finally:
            job.done = True
            # Until its final state is written, the saver (or close) keeps trying.
            with contextlib.suppress(*db.UNAVAILABLE):
                await self._save(job)
                self._running.pop(job.id, None)

    async def get(self, job_id: str) -> Job | None:
        if job_id in self._running:
            return self._running[job_id]
        row = await self._pool.fetchrow(query("console_job_get"), job_id)
        return _job_of(row) if row is not None else None

    async def recent(self) -> list[Job]:
        rows = await self._pool.fetch(query("console_jobs_recent"), SHOWN)
        return [self._running.get(r["id"]) or _job_of(r) for r in rows]

    async def _save(self, job: Job) -> None:
        report = {**asdict(job.report), "keys": []}  # a group may be a million keys
        await self._pool.execute(
            query("console_job_save"),
            job.id,
            job.title,
            job.actor,
            json.dumps(report),
            job.started,
            job.done,
            job.error,
        )

    async def _save_running(self) -> None:
        """Every few seconds, each running job's progress, so other consoles see it move."""
        while True:
            await asyncio.sleep(SAVE_EVERY)
            for job in list(self._running.values()):
                try:
                    await self._save(job)
                except db.UNAVAILABLE as error:
                    log.warning("could not save the progress of %s: %s", job.title, error)

    async def close(self) -> None:
        self._saver.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(self._saver, *self._tasks, return_exceptions=True)
        for job in list(self._running.values()):  # a final write the cancel cut short
            with contextlib.suppress(*db.UNAVAILABLE):
                await self._save(job)


def _job_of(row: Record) -> Job:
    report: dict[str, Any] = json.loads(row["report"])
    job = Job(
        id=row["id"],
        title=row["title"],
        actor=row["actor"],
        report=ReplayReport(**report),
        started=row["started_at"],
        done=row["done"],
        error=row["error"],
    )
    if not job.done and datetime.now(UTC) - row["updated_at"] > SILENT_AFTER:
        job.done = True
        job.error = "interrupted: the console running it stopped"
    return job
