"""Consumers run by the crash tests in a separate worker process (configured by environment)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pydantic import BaseModel, field_validator

from rabbitretry import Consumer, Context, RetryPolicy


class Job(BaseModel):
    n: int

    @field_validator("n")
    @classmethod
    def _validating(cls, n: int) -> int:
        if os.environ.get("RR_MODE") == "exit-validating":
            os._exit(17)  # the worker dies before the handler could start, every time
        return n


def _log(event: str, ctx: Context) -> None:
    with Path(os.environ["RR_EVENTS"]).open("a") as events:
        events.write(f"{event} {ctx.message_id} {ctx.attempt}\n")


class Crashy(Consumer[Job]):
    """``RR_MODE`` says how it misbehaves:

    hang-first   attempt 1 hangs (the test kills the worker), later attempts succeed
    exit-always  every attempt kills its own process with os._exit
    slow         every attempt takes RR_SLEEP seconds, then succeeds
    exit-validating  the payload's validation kills the process: the handler never starts
    """

    queue = os.environ.get("RR_TEST_QUEUE", "rr-test-crashy")
    lease = float(os.environ.get("RR_LEASE", "2"))
    retry = RetryPolicy(max_attempts=3, initial_delay=1.0, jitter=0.0)

    async def handle(self, msg: Job, ctx: Context) -> None:
        mode = os.environ["RR_MODE"]
        _log("start", ctx)
        if mode == "exit-always":
            os._exit(17)
        if mode == "hang-first" and ctx.attempt == 1:
            await asyncio.Event().wait()
        if mode == "slow":
            await asyncio.sleep(float(os.environ["RR_SLEEP"]))
        _log("done", ctx)
