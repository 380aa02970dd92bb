"""The heart of both drills: publish while the faults strike, wait for the work to settle,
verify.

The worker processes, the reconcilers and the queue are already running; this part only
publishes the plan's messages, strikes its faults on time, waits until the ledger says every
message is finished (or the settle timeout passes), and hands the ledger to :mod:`drills.verify`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import asyncpg

from drills.clock import Clock
from drills.plan import Fault, Plan
from drills.sending import Enqueue, publish
from drills.verify import Verdict, read_handler_starts, unfinished, verify


class Injector(Protocol):
    """What strikes the faults of a plan (:class:`drills.faults.Faults` and the cluster's)."""

    async def inject(self, fault: Fault) -> None: ...


@dataclass(frozen=True)
class Settled:
    """How a drill's work ended."""

    verdict: Verdict
    republished: int
    """Publishes sent again because the broker did not confirm them."""
    recovered_seconds: float
    """From the last fault restored until every message was finished."""


async def publish_and_settle(
    amqp_url: str,
    plan: Plan,
    queue: str,
    database_url: str,
    faults: Injector,
    clock: Clock,
    starts: Path,
    settle_timeout: float,
    enqueue: Enqueue | None = None,
) -> Settled:
    # Fault times count from the start of publishing, as the plan's message times do.
    published_from = clock.now()
    clock.say(f"publishing starts ({plan.publish_seconds:.0f} s)")
    publisher = asyncio.create_task(publish(amqp_url, queue, plan, clock, enqueue))
    try:
        for scheduled in plan.faults:
            await asyncio.sleep(max(0.0, published_from + scheduled.at - clock.now()))
            await faults.inject(scheduled.fault)
        last_fault_restored = clock.now()
        republished = await publisher
    finally:
        publisher.cancel()
    clock.say(f"all {len(plan.messages)} messages published ({republished} sent again)")

    conn = await asyncpg.connect(database_url)
    try:
        settled = await _wait_until_finished(conn, plan, queue, clock, settle_timeout)
        redriven = await conn.fetchval(
            "SELECT coalesce(sum(redrives), 0) FROM rabbitretry.ledger WHERE queue = $1", queue
        )
        clock.say(f"the reconciler re-drove {redriven} message(s) the broker had lost")
        verdict = await verify(conn, queue, plan.messages, read_handler_starts(starts))
    finally:
        await conn.close()
    return Settled(verdict, republished, max(0.0, settled - last_fault_restored))


async def _wait_until_finished(
    conn: asyncpg.Connection, plan: Plan, queue: str, clock: Clock, settle_timeout: float
) -> float:
    """Poll the ledger until every message of the plan is finished or the timeout passes; the
    clock's time then."""
    ids = [m.message_id for m in plan.messages]
    deadline = clock.now() + settle_timeout
    left = await unfinished(conn, queue, ids)
    while left and clock.now() < deadline:
        await asyncio.sleep(0.5)
        left = await unfinished(conn, queue, ids)
    settled = clock.now()
    clock.say(
        "every message is finished"
        if not left
        else f"{left} message(s) still unfinished after {settle_timeout:.0f} s"
    )
    return settled
