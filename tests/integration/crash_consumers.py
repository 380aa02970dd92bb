"""Consumers run by the crash tests in a separate worker process (configured by environment)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import asyncpg
from pydantic import BaseModel, field_validator

from rabbitretry import Consumer, Context, RetryPolicy
from tests.integration.harness import is_marked, wait_for


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


def _runs(ctx: Context) -> int:
    """How many times a handler has started for this message (this start included)."""
    lines = Path(os.environ["RR_EVENTS"]).read_text().splitlines()
    return sum(1 for line in lines if line.split()[:2] == ["start", ctx.message_id])


class Crashy(Consumer[Job]):
    """``RR_MODE`` says how it misbehaves:

    hang-first   attempt 1 hangs (the test kills the worker), later attempts succeed
    exit-always  every attempt kills its own process with os._exit, at once (before the
                 ledger marks it started)
    exit-marked  every attempt kills its own process once the ledger has marked it started
    exit-amid    job 0's handler kills its process the first time it runs for a message, in
                 its first step, amid the other slots' handlers; everything else succeeds
    slow         every attempt takes RR_SLEEP seconds, then succeeds
    exit-validating  the payload's validation kills the process: the handler never starts
    """

    queue = os.environ.get("RR_TEST_QUEUE", "rr-test-crashy")
    lease = float(os.environ.get("RR_LEASE", "2"))
    retry = RetryPolicy(max_attempts=3, initial_delay=1.0, jitter=0.0)

    async def handle(self, msg: Job, ctx: Context) -> None:
        mode = os.environ["RR_MODE"]
        _log("start", ctx)
        if mode == "exit-always" or (mode == "exit-amid" and msg.n == 0 and _runs(ctx) == 1):
            os._exit(17)
        if mode == "exit-marked":
            await _until_marked(ctx)
            os._exit(17)
        if mode == "hang-first" and ctx.attempt == 1:
            await asyncio.Event().wait()
        if mode == "slow":
            await asyncio.sleep(float(os.environ["RR_SLEEP"]))
        _log("done", ctx)


async def _until_marked(ctx: Context) -> None:
    """Return once the ledger has marked this attempt started (its handler has run a while)."""
    conn = await asyncpg.connect(os.environ["RABBITRETRY_DATABASE_URL"])
    try:
        await wait_for(
            lambda: is_marked(conn, ctx.queue, ctx.message_id), timeout=10, interval=0.02
        )
    finally:
        await conn.close()
