"""One reconciler run: what its steps share, and the report they fill in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rabbitretry import amqp
from rabbitretry.db import Answering
from rabbitretry.reconcile.expected import WindowReport
from rabbitretry.reconcile.pacing import RateLimiter


@dataclass
class RunReport:
    """What one reconciler run did."""

    retries_redriven: int = 0
    leases_redriven: int = 0
    outbox_published: int = 0
    expired_skipped: int = 0
    broker_dead_recorded: int = 0
    """Messages found on a dead-letter queue without a ledger row, recorded dead."""
    errors: list[str] = field(default_factory=list)
    failed_steps: list[str] = field(default_factory=list)
    """The steps that failed (each also in ``errors``); the others ran."""
    windows: list[WindowReport] = field(default_factory=list)

    @property
    def orphaned(self) -> int:
        return sum(window.orphaned for window in self.windows)

    def counts(self) -> dict[str, Any]:
        """The numbers recorded in the heartbeat."""
        return {
            "retries_redriven": self.retries_redriven,
            "leases_redriven": self.leases_redriven,
            "outbox_published": self.outbox_published,
            "expired_skipped": self.expired_skipped,
            "broker_dead_recorded": self.broker_dead_recorded,
            "republished": sum(window.republished for window in self.windows),
            "missing": sum(window.missing for window in self.windows),
            "orphaned": self.orphaned,
            "errors": len(self.errors),
            "failed_steps": list(self.failed_steps),
        }


@dataclass(frozen=True)
class Run:
    """What every step of one run is given. A step adds what it did to ``report`` as it goes
    (errors, skipped rows), so that a run cut short still records how far it got."""

    ledger: Answering
    """The ledger's statements, each answered within ``db.SILENT_AFTER`` or given up."""
    publisher: amqp.ConfirmingPublisher
    limiter: RateLimiter
    report: RunReport
    grace: float
    """Seconds of lateness tolerated, and seconds a re-driven row is left alone."""
    batch_size: int
    max_batches: int
    """Batches per scan: bounds one run; the rest waits for the next."""
