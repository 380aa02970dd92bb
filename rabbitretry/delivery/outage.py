"""Pausing deliveries while a service is away: one log line when it goes, one when it is back.

When a delivery finds the ledger (or the broker) unreachable, the worker must neither spin on
it nor charge the message anything. A database that refuses service for now (read-only after a
failover to a standby, not accepting connections, shutting down, out of connections or disk:
:func:`rabbitretry.db.is_outage`) is an outage too. The :class:`OutageGate` of that service
turns its state to "down", logs that once (saying which kind of outage), and probes the
service with a growing, capped pause until it answers; the ledger's probe also asks whether
the database would take a write, since a read-only one answers ``SELECT 1``.

Meanwhile every consumer slot holds its delivery at the gate (on a prefetch-1 channel that
means no new deliveries) for at most ``hold`` seconds, then requeues it. The hold is long
(``HOLD``, minutes) because every requeue counts against a quorum queue's
``x-delivery-limit``: an outage answered by frequent requeues would make the broker
dead-letter messages whose handler never ran. It stays well below RabbitMQ's
``consumer_timeout`` (30 minutes by default), past which the broker would take the delivery
back anyway. When the probe succeeds the gate logs once and opens, and the held deliveries go
on where they were.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from rabbitretry import db
from rabbitretry.errors import ConnectionLost

log = logging.getLogger("rabbitretry.worker")

FIRST_PAUSE = 0.5  # seconds before the first probe
MAX_PAUSE = 15.0  # the probes' pause doubles up to this
# Seconds a delivery waits at a closed gate before it is requeued: every requeue counts
# against a quorum queue's delivery limit, so as long as is safe below RabbitMQ's default
# consumer_timeout of 30 minutes (which would requeue it, and count it, anyway).
HOLD = 20 * 60.0


class OutageGate:
    """The state of one service (the ledger, the broker) as the worker's deliveries see it."""

    def __init__(
        self,
        service: str,
        probe: Callable[[], Awaitable[object]],
        *,
        first_pause: float = FIRST_PAUSE,
        max_pause: float = MAX_PAUSE,
        hold: float | None = None,
    ) -> None:
        self.service = service
        self._probe = probe
        self._first_pause = first_pause
        self._max_pause = max_pause
        self._hold = HOLD if hold is None else hold
        self.reason: str | None = None
        """While the gate is closed: what kind of outage closed it (for health and logs)."""
        self._open = asyncio.Event()
        self._open.set()
        self._prober: asyncio.Task[None] | None = None

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    def report(self, error: BaseException) -> None:
        """A delivery found the service unreachable: close the gate (logged once) and probe."""
        if not self._open.is_set():
            return
        self._open.clear()
        kind = db.outage_kind(error) if db.is_outage(error) else "unreachable"
        self.reason = kind
        if kind == "unreachable":
            what = f"the {self.service} is unreachable ({error})"
        else:
            what = f"the {self.service} is {kind}: {type(error).__name__}: {error}"
        log.error("%s; deliveries pause until it answers again", what)
        self._prober = asyncio.create_task(self._probe_until_back())

    async def passable(self) -> bool:
        """Wait (at most ``hold`` seconds) for the gate to open; False if it stayed closed."""
        if self._open.is_set():
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._open.wait(), self._hold)
        return self._open.is_set()

    async def close(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._prober

    async def _probe_until_back(self) -> None:
        pause = self._first_pause
        while True:
            await asyncio.sleep(pause)
            try:
                await self._probe()
            except Exception as error:
                log.debug("the %s is still unreachable (%s)", self.service, error)
                pause = min(pause * 2, self._max_pause)
                continue
            log.warning("the %s is reachable again; deliveries resume", self.service)
            self.reason = None
            self._open.set()
            return


def broker_probe(is_up: Callable[[], bool]) -> Callable[[], Awaitable[None]]:
    """A probe that fails while the publishing connection is down (``is_up`` says)."""

    async def probe() -> None:
        if not is_up():
            raise ConnectionLost("the publishing connection to RabbitMQ is not back yet")

    return probe


@dataclass(frozen=True)
class Gates:
    ledgers: dict[str | None, OutageGate]
    """One per ledger database, keyed as the worker's pools are."""
    broker: OutageGate


@dataclass(frozen=True)
class Health:
    """Each check's state: ``"ok"``, or what is wrong."""

    checks: dict[str, str]

    @property
    def ok(self) -> bool:
        return all(state == "ok" for state in self.checks.values())


def ledger_checks(
    labels: dict[str | None, str], gates: dict[str | None, OutageGate] | None
) -> dict[str, str]:
    """The health of each ledger database's gate: ``ledger`` with one database, else
    ``ledger:LABEL`` for each; ``"ok"``, or what is wrong (every closed gate, not the first)."""
    checks = {}
    for database, label in labels.items():
        gate = None if gates is None else gates.get(database)
        name = f"ledger:{label}" if len(labels) > 1 else "ledger"
        if gate is None or gate.is_open:
            checks[name] = "ok"
            continue
        why = gate.reason or "unreachable"
        checks[name] = f"the {gate.service} is {why}; deliveries paused"
    return checks
