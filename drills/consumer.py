"""The consumer the drill's worker runs: ``rabbitretry run drills.consumer:DrillConsumer``.

It behaves as its message's body says (see :mod:`drills.plan`). Every attempt first writes a
row to the effects table inside ``ctx.transaction()``; only a successful attempt may leave one.
The queue name comes from ``RABBITRETRY_DRILL_QUEUE``, so that every drill has its own.
"""

from __future__ import annotations

import asyncio
import os

from pydantic import BaseModel

from rabbitretry import Consumer, Context, Permanent, Retry, RetryPolicy

EFFECTS_TABLE = "drill_effect"
CRASH_EXIT_CODE = 17

CREATE_EFFECTS = f"""
CREATE TABLE IF NOT EXISTS {EFFECTS_TABLE} (
    id         bigserial   PRIMARY KEY,
    message_id text        NOT NULL,
    attempt    integer     NOT NULL,
    pid        integer     NOT NULL,
    written_at timestamptz NOT NULL DEFAULT now()
)
"""
# No unique constraint on message_id, on purpose: a second effect must be visible, not refused.


class DrillMessage(BaseModel):
    id: str
    kind: str
    fail_times: int = 0


class DrillConsumer(Consumer[DrillMessage]):
    queue = os.environ.get("RABBITRETRY_DRILL_QUEUE", "rabbitretry-drill")
    # A short lease: a killed worker's messages are taken up again two seconds later.
    lease = 2.0
    # Six attempts: transient messages fail at most twice, leaving room for attempts lost when
    # a crasher or a SIGKILL takes down the process while they were in flight.
    retry = RetryPolicy(max_attempts=6, initial_delay=0.5, max_delay=4.0, jitter=0.2)
    timeout = 30.0

    async def handle(self, msg: DrillMessage, ctx: Context) -> None:
        async with ctx.transaction() as conn:
            await conn.execute(
                f"INSERT INTO {EFFECTS_TABLE} (message_id, attempt, pid) VALUES ($1, $2, $3)",
                ctx.message_id,
                ctx.attempt,
                os.getpid(),
            )
        if msg.kind == "transient" and ctx.attempt <= msg.fail_times:
            raise Retry(f"transient failure {ctx.attempt} of {msg.fail_times}")
        if msg.kind == "poison":
            raise Permanent("poison message: this will never work")
        if msg.kind == "crasher":
            # Die mid-attempt, the effect written but not committed. The short pause lets the
            # neighbours' (fast) attempts finish first, as a real crash does not always hit them.
            await asyncio.sleep(0.2)
            os._exit(CRASH_EXIT_CODE)
