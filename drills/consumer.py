"""The consumer the drill's worker runs: ``rabbitretry run drills.consumer:DrillConsumer``.

It behaves as its message's body says (see :mod:`drills.plan`). Every attempt writes a row to
the effects table inside ``ctx.transaction()``; only a successful attempt may leave one.
The queue name comes from ``RABBITRETRY_DRILL_QUEUE``, so that every drill has its own.

Before anything else, every handler run appends ``message_id attempt pid`` to the file named by
``RABBITRETRY_DRILL_HANDLER_STARTS``: a record of handler starts kept outside the ledger and
outside the database (which the drill crashes), so that the verdict can tell an attempt the
ledger charged from a handler that actually ran. A line is one ``write`` on a file opened with
``O_APPEND``: it is in the kernel's hands as soon as the call returns, and a SIGKILL or an
``os._exit`` right after it loses nothing.
"""

from __future__ import annotations

import asyncio
import os

from pydantic import BaseModel

from rabbitretry import Consumer, Context, Permanent, Retry, RetryPolicy

EFFECTS_TABLE = "drill_effect"
CRASH_EXIT_CODE = 17
STARTS_ENV = "RABBITRETRY_DRILL_HANDLER_STARTS"
QUEUE_TYPE_ENV = "RABBITRETRY_DRILL_QUEUE_TYPE"

_starts_fd: int | None = None


def record_handler_start(message_id: str, attempt: int) -> None:
    """Append one line for this handler run to the starts file, if the drill named one."""
    global _starts_fd
    path = os.environ.get(STARTS_ENV)
    if not path:
        return
    if _starts_fd is None:
        _starts_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_starts_fd, f"{message_id} {attempt} {os.getpid()}\n".encode())


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
    sleep: float = 0.0


class DrillConsumer(Consumer[DrillMessage]):
    queue = os.environ.get("RABBITRETRY_DRILL_QUEUE", "rabbitretry-drill")
    # The cluster drill runs on quorum queues (RABBITRETRY_DRILL_QUEUE_TYPE=quorum).
    queue_type = "quorum" if os.environ.get(QUEUE_TYPE_ENV) == "quorum" else "classic"
    # A short lease: a killed worker's messages are taken up again two seconds later.
    lease = 2.0
    # Six attempts: transient messages fail at most twice, leaving room for attempts lost when
    # a crasher or a SIGKILL takes down the process while they were in flight.
    retry = RetryPolicy(max_attempts=6, initial_delay=0.5, max_delay=4.0, jitter=0.2)
    timeout = 30.0

    async def handle(self, msg: DrillMessage, ctx: Context) -> None:
        record_handler_start(ctx.message_id, ctx.attempt)
        if msg.kind == "slow" and ctx.attempt == 1:
            # The claim is committed and the handler busy while a fault strikes: when the
            # handler's transaction finally commits, the ledger must still hold its claim.
            # Only the first attempt is slow: a crasher nearby takes its worker down six times
            # in a few seconds, and a handler slow every time would lose its whole budget to it.
            await asyncio.sleep(msg.sleep)
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
