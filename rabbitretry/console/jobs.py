"""Replays of many messages run in the background; their pages show progress until done.

A rate-limited group replay or a canary waiting for its outcome takes longer than a request
should, so the console starts it as a task and redirects to the job's page, which refreshes
itself until the report is final.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from rabbitretry.operations import Progress, ReplayReport

log = logging.getLogger("rabbitretry.console")
KEEP = 50  # finished jobs remembered for their pages


@dataclass
class Job:
    id: str
    title: str
    actor: str
    report: ReplayReport
    started: datetime = field(default_factory=lambda: datetime.now(UTC))
    done: bool = False
    error: str | None = None


Runner = Callable[[Progress], Awaitable[ReplayReport]]


class Jobs:
    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, title: str, actor: str, targets: int, run: Runner) -> Job:
        job = Job(id=secrets.token_hex(6), title=title, actor=actor, report=ReplayReport(targets))
        self._jobs[job.id] = job
        task = asyncio.create_task(self._run(job, run))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._forget_old()
        return job

    async def _run(self, job: Job, run: Runner) -> None:
        def progress(report: ReplayReport) -> None:
            job.report = report

        try:
            job.report = await run(progress)
        except Exception as error:  # shown on the job's page, not lost in a log
            log.exception("%s failed", job.title)
            job.error = f"{type(error).__name__}: {error}"
        finally:
            job.done = True

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def recent(self) -> list[Job]:
        return sorted(self._jobs.values(), key=lambda j: j.started, reverse=True)

    def _forget_old(self) -> None:
        finished = [j for j in self.recent() if j.done]
        for job in finished[KEEP:]:
            del self._jobs[job.id]

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
