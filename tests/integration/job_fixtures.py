"""Scheduled jobs run by the job tests, in-process or through ``rabbitretry job run``."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from rabbitretry.scheduled_jobs import JobContext, job


@job(every=60)
async def blocking(ctx: JobContext) -> dict[str, int]:
    """Says it started (RR_JOB_STARTED), then runs until RR_JOB_RELEASE exists."""
    await asyncio.to_thread(Path(os.environ["RR_JOB_STARTED"]).touch)
    release = Path(os.environ["RR_JOB_RELEASE"])
    # The test releases the job from another process: a file is the signal.
    while not await asyncio.to_thread(release.exists):  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    return {"ran": 1}


@job(every=60)
async def crashing(ctx: JobContext) -> None:
    raise RuntimeError("the report service is down")
