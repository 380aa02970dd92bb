"""What an operator does to the downstream breakers: list them, hold one open, close one.

A breaker is a row of ``rabbitretry.downstream`` that every worker of the ledger database
reads each second (:mod:`rabbitretry.downstream`). Holding it open stops every consumer that
calls the downstream, with no probe, until an operator closes it; closing it lets the calls
go through again, with a failure count from zero. Each action locks the row, changes it and
writes its audit row in one transaction (:mod:`rabbitretry.ledger.downstreams` holds the
statements). The listing also asks the broker how many messages wait on each queue that
calls a downstream: a passive declare per queue, as ``rabbitretry status`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from rabbitretry import amqp
from rabbitretry.db import Pool, Record
from rabbitretry.errors import RabbitRetryError
from rabbitretry.ledger import downstreams as ledger
from rabbitretry.operations.audit import audit
from rabbitretry.operations.errors import OperationError

BROKER_TIMEOUT = 10.0
"""Seconds the listing waits for the broker's counts before it shows them as unknown."""


@dataclass(frozen=True)
class Breaker:
    """A downstream's breaker as the ledger has it."""

    name: str
    state: str
    """closed, open or half-open (one worker is trying one delivery: the probe)."""
    since: datetime
    """Closed since, or unavailable since."""
    failures: int
    last_error: str | None
    pause_seconds: float
    next_probe_at: datetime | None
    probe_worker: str | None
    probes: int
    """Probes that failed in this outage."""
    opened: int
    """How many times it has opened."""
    forced: str | None
    """'open' while an operator holds it open."""
    forced_by: str | None
    queues: tuple[str, ...]
    """The work queues whose handlers call it."""
    updated_at: datetime

    @property
    def held_open(self) -> bool:
        return self.forced == "open"

    @classmethod
    def of(cls, row: Record) -> Breaker:
        return cls(
            name=row["name"],
            state=row["state"],
            since=row["since"],
            failures=row["failures"],
            last_error=row["last_error"],
            pause_seconds=row["pause_seconds"],
            next_probe_at=row["next_probe_at"],
            probe_worker=row["probe_worker"],
            probes=row["probes"],
            opened=row["opened"],
            forced=row["forced"],
            forced_by=row["forced_by"],
            queues=tuple(row["queues"]),
            updated_at=row["updated_at"],
        )


@dataclass(frozen=True)
class Waiting:
    """Ready messages per queue, from the broker: None for a queue it does not have, and every
    count None (with ``error`` saying why) when it could not be asked."""

    counts: dict[str, int | None]
    error: str | None = None


@dataclass(frozen=True)
class Change:
    """What an operator's open or close did: the breaker before and after it."""

    before: Breaker
    after: Breaker


async def breakers(pool: Pool) -> list[Breaker]:
    """Every breaker recorded in the ledger database, by name."""
    return [Breaker.of(row) for row in await ledger.breakers(pool)]


async def waiting(amqp_url: str, queues: Sequence[str]) -> Waiting:
    """How many messages are ready on each of ``queues`` (a passive declare each)."""
    counts: dict[str, int | None] = dict.fromkeys(queues)
    if not counts:
        return Waiting(counts)
    try:
        async with asyncio.timeout(BROKER_TIMEOUT):
            connection = await amqp.connect(amqp_url, name="rabbitretry-downstream")
            try:
                async with amqp.Prober(connection) as prober:
                    for queue in counts:
                        counts[queue] = await _ready(prober, queue)
            finally:
                with contextlib.suppress(*amqp.CHANNEL_ERRORS):
                    await connection.close()
    except TimeoutError:
        return Waiting(dict.fromkeys(queues), f"RabbitMQ did not answer in {BROKER_TIMEOUT:g} s")
    except RabbitRetryError as error:
        return Waiting(dict.fromkeys(queues), str(error))
    except amqp.CHANNEL_ERRORS as error:
        return Waiting(dict.fromkeys(queues), amqp.error_text(error))
    return Waiting(counts)


async def _ready(prober: amqp.Prober, queue: str) -> int | None:
    found: list[int] = []

    async def declare(channel: amqp.Channel) -> None:
        declared = await channel.declare_queue(queue, passive=True)
        found.append(int(declared.declaration_result.message_count or 0))

    await prober.attempt(declare)
    return found[0] if found else None


async def hold_open(pool: Pool, name: str, *, actor: str, reason: str | None = None) -> Change:
    """Hold breaker ``name`` open until an operator closes it: the consumers that call it stop
    taking deliveries, and no worker probes it."""
    return await _change(pool, name, "downstream-open", actor, reason)


async def close(pool: Pool, name: str, *, actor: str, reason: str | None = None) -> Change:
    """Close breaker ``name`` now, whether it tripped or was held open: calls go through again,
    failures count from zero, and it trips again by itself if they cross its threshold."""
    return await _change(pool, name, "downstream-close", actor, reason)


async def _change(pool: Pool, name: str, action: str, actor: str, reason: str | None) -> Change:
    comment = (reason or "").strip() or None
    async with pool.acquire() as conn, conn.transaction():
        row = await ledger.lock(conn, name)
        if row is None:
            raise OperationError(unknown_message(name, await ledger.names(conn)))
        before = Breaker.of(row)
        if action == "downstream-open":
            await ledger.force_open(conn, name, actor)
        else:
            await ledger.force_close(conn, name, actor)
        after_row = await ledger.lock(conn, name)
        assert after_row is not None
        after = Breaker.of(after_row)
        await audit(
            conn,
            actor,
            action,
            queue=before.queues[0] if len(before.queues) == 1 else None,
            messages=0,
            comment=comment,
            detail={
                "downstream": name,
                "state_before": before.state,
                "held_open_before": before.held_open,
                "failures_before": before.failures,
                "state": after.state,
                "queues": list(before.queues),
            },
        )
    return Change(before, after)


def unknown_message(name: str, known: Sequence[str]) -> str:
    """One line: ``name`` is no breaker, and which ones there are."""
    if not known:
        return (
            f"no downstream named {name!r}: none has been recorded yet (a worker records the "
            "downstreams its consumers declare when it starts)"
        )
    return f"no downstream named {name!r}: known downstreams are {', '.join(known)}"
