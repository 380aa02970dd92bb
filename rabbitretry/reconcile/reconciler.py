"""The reconciler (对账): find what the broker dropped and re-drive it from the ledger.

Retries alone leave gaps: a delay copy lost with a classic queue (dead-lettering is
at-most-once), a worker that died holding a lease whose delivery was then lost, an outbox row
no relay published, a message that was never published at all. The ledger knows what must
happen next for every key, so each run of the reconciler scans it and repairs, step by step:

* ``retrying`` rows overdue by more than ``grace`` seconds, and ``processing`` rows whose lease
  ran out more than ``grace`` seconds ago, are re-published from the ledger, or finished
  ``skipped`` when past their consumer's ``expires_after``
  (:mod:`rabbitretry.reconcile.redrive`);
* outbox rows still pending ``grace`` seconds after they were due are published
  (:mod:`rabbitretry.reconcile.stuck_outbox`);
* messages the broker itself dead-lettered into a dead-letter queue without a ledger row are
  recorded dead (:mod:`rabbitretry.reconcile.dead_queue`);
* registered :class:`~rabbitretry.reconcile.expected.Reconciliation` s: expected keys that were
  never seen are re-published, orphans reported (:mod:`rabbitretry.reconcile.windows`).

Several reconcilers may run at once: each scan takes a bounded batch with ``FOR UPDATE SKIP
LOCKED`` and marks it re-driven in the same statement, and a re-driven row is left alone for
``grace`` seconds, so no message is published twice. Publishing is paced (``publish_rate``,
:mod:`rabbitretry.reconcile.pacing`) so that a recovering downstream is not flooded. Each run
is recorded in the ``reconciler`` heartbeat, success or failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rabbitretry import amqp, db
from rabbitretry.consumer import Consumer
from rabbitretry.db import UNAVAILABLE, Answering, Pool
from rabbitretry.errors import ConnectionLost, ServiceUnavailable
from rabbitretry.ledger import repairs
from rabbitretry.monitoring import heartbeat
from rabbitretry.reconcile import dead_queue
from rabbitretry.reconcile.expected import Reconciliation
from rabbitretry.reconcile.pacing import RateLimiter
from rabbitretry.reconcile.redrive import redrive
from rabbitretry.reconcile.run import Run, RunReport
from rabbitretry.reconcile.stuck_outbox import publish_stuck_outbox
from rabbitretry.reconcile.windows import check_window

__all__ = ["HEARTBEAT_NAME", "RateLimiter", "Reconciler", "RunReport"]

log = logging.getLogger("rabbitretry.reconcile.reconciler")

HEARTBEAT_NAME = "reconciler"


@dataclass
class Reconciler:
    """Scans the ledger and the outbox and repairs them; ``await run_once()`` or ``run()``.

    Embeddable next to a worker: ``asyncio.create_task(reconciler.run(interval=30))``, then
    ``reconciler.stop()``. ``consumers`` supply ``expires_after`` per queue; the scans cover
    every queue in the ledger whatever they are.
    """

    pool: Pool
    amqp_url: str
    consumers: Sequence[type[Consumer[Any]]] = ()
    reconciliations: Sequence[Reconciliation] = ()
    batch_size: int = 100
    max_batches: int = 10
    """Batches per scan and run: bounds one run; the rest waits for the next."""
    publish_rate: float = 200.0
    """Re-published messages per second, at most."""
    grace: float = 30.0
    """Seconds of lateness tolerated before a retry or lease counts as lost, and seconds a
    re-driven row (or re-published key) is left alone before it may be re-driven again."""
    heartbeat_name: str = HEARTBEAT_NAME
    expected_every: float = 60.0
    """Seconds between runs, for the heartbeat's staleness check (``run`` sets it)."""
    instance: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")

    _connection: amqp.Connection | None = field(default=None, init=False, repr=False)
    _publisher: amqp.ConfirmingPublisher | None = field(default=None, init=False, repr=False)
    _stopping: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)

    def __post_init__(self) -> None:
        # grace is also how long a re-driven row is left alone: at 0, a second reconciler
        # would find a row the first had just re-driven and publish it again.
        if self.batch_size < 1 or self.max_batches < 1 or self.grace < 1:
            raise ValueError("batch_size and max_batches must be >= 1, grace >= 1 second")
        self._limiter = RateLimiter(self.publish_rate)
        self._expiry = {c.queue: c.expires_after for c in self.consumers if c.expires_after}
        self._body_limits = {c.queue: c.max_body_bytes for c in self.consumers}
        # Every statement of a run is answered within db.SILENT_AFTER or given up: a silent
        # database fails the run as an outage, and the next run tries again.
        self._ledger = Answering(self.pool)

    def stop(self) -> None:
        self._stopping.set()

    async def run(self, interval: float) -> None:
        """Run every ``interval`` seconds until :meth:`stop`; a failed run is logged, not fatal."""
        self.expected_every = interval
        try:
            while not self._stopping.is_set():
                try:
                    await self.run_once()
                except Exception as error:
                    _log_failed_run(error, interval)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), interval)
        finally:
            await self.close()

    async def run_once(self) -> RunReport:
        """One pass over every step; recorded in the heartbeat, success or failure."""
        await heartbeat.started(
            self._ledger, self.heartbeat_name, self.instance, self.expected_every
        )
        report = RunReport()
        try:
            await self._steps(report)
        except BaseException as error:
            if isinstance(error, db.DatabaseSilent):
                raise  # it would not answer the heartbeat either; the heartbeat goes stale
            with contextlib.suppress(*UNAVAILABLE):
                await heartbeat.finished(
                    self._ledger,
                    self.heartbeat_name,
                    counts=report.counts(),
                    error=f"{type(error).__name__}: {error}",
                )
            raise
        await heartbeat.finished(
            self._ledger,
            self.heartbeat_name,
            counts=report.counts(),
            error="; ".join(report.errors[:5]) or None,
        )
        return report

    async def _steps(self, report: RunReport) -> None:
        """The steps of a run, in order; each adds what it did to ``report``."""
        run = Run(
            ledger=self._ledger,
            publisher=await self._open_publisher(),
            limiter=self._limiter,
            report=report,
            grace=self.grace,
            batch_size=self.batch_size,
            max_batches=self.max_batches,
        )
        connection = self._connection
        assert connection is not None  # opened with the publisher
        outage = _BrokerOutage(connection)

        async def overdue_retries() -> None:
            report.retries_redriven = await redrive(
                run, repairs.take_overdue_retries, self._expiry, self._body_limits
            )

        async def expired_leases() -> None:
            report.leases_redriven = await redrive(
                run, repairs.take_expired_leases, self._expiry, self._body_limits
            )

        async def stuck_outbox() -> None:
            report.outbox_published = await publish_stuck_outbox(run)

        async def dead_letter_queues() -> None:
            report.broker_dead_recorded = await dead_queue.scan(
                self._ledger,
                connection,
                run.publisher,
                self.consumers,
                limit=self.batch_size * self.max_batches,
                batch_size=self.batch_size,
                errors=report.errors,
            )

        await _isolated(report, outage, "overdue retries", overdue_retries)
        await _isolated(report, outage, "expired leases", expired_leases)
        await _isolated(report, outage, "stuck outbox", stuck_outbox)
        await _isolated(report, outage, "dead-letter queues", dead_letter_queues)
        for item in self.reconciliations:

            async def window(item: Reconciliation = item) -> None:
                report.windows.append(await check_window(run, item))

            await _isolated(report, outage, f"reconciliation {item.name}", window)
        outage.log()

    async def close(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(*amqp.CHANNEL_ERRORS):
                await self._connection.close()
        self._connection = self._publisher = None

    async def _open_publisher(self) -> amqp.ConfirmingPublisher:
        if self._publisher is None:
            self._connection = await amqp.connect(
                self.amqp_url, name=f"rabbitretry-reconciler {self.instance}"
            )
            self._publisher = await amqp.ConfirmingPublisher.open(self._connection)
        return self._publisher


def _log_failed_run(error: Exception, interval: float) -> None:
    """One line for a run an outage failed (the database or the broker is away: expected,
    and said without a traceback); a traceback for anything else, which is a bug."""
    if isinstance(error, (db.DatabaseSilent, *db.FAILED)) and db.is_outage(error):
        why = f"the database is {db.outage_kind(error)} ({type(error).__name__}: {error})"
    elif isinstance(error, (ServiceUnavailable, ConnectionLost, *amqp.CHANNEL_ERRORS, OSError)):
        why = str(error) or type(error).__name__
    else:
        log.exception("reconciler run failed; trying again in %g s", interval)
        return
    log.warning("reconciler run failed: %s; trying again in %g s", why, interval)


class _BrokerOutage:
    """Whether a step of this run found the broker away, and which steps that cost.

    A silent broker fails a step only after a bound (the heartbeat's verdict or a publish
    timeout): once one step has met it, or the run starts while the connection is down, the
    later steps fail at once without touching the broker, and the run says so in one line.
    """

    def __init__(self, connection: amqp.Connection) -> None:
        self.connection = connection
        self.why = None if amqp.is_up(connection) else "its connection is down, reconnecting"
        self.steps: list[str] = []

    def met(self, error: BaseException) -> bool:
        """Whether ``error`` says the broker is away (remembered for the later steps)."""
        if isinstance(error, amqp.CHANNEL_ERRORS) and not amqp.is_up(self.connection):
            pass  # whatever a channel raised, its connection is gone
        elif not isinstance(error, (ConnectionLost, ServiceUnavailable)):
            return False
        self.why = str(error) or type(error).__name__
        return True

    def log(self) -> None:
        if self.steps:
            log.warning(
                "reconciler run: the broker is unreachable (%s); not done: %s; the next run "
                "tries again",
                self.why,
                ", ".join(self.steps),
            )


async def _isolated(
    report: RunReport,
    outage: _BrokerOutage,
    step: str,
    run_step: Callable[[], Awaitable[None]],
) -> None:
    """Run one step; its failure is the step's alone: logged, reported, and the run goes on.

    A bug in one step no longer hides what the others would have found. A step that fails
    because a service is away fails fast, so the later steps cost little then; but a silent
    database fails each statement only after ``db.SILENT_AFTER``, so it ends the run, and once
    a step found the broker away (silent, within its bound) the later ones fail at once.
    """
    if outage.why is not None:
        report.failed_steps.append(step)
        report.errors.append(f"{step}: not run, the broker is unreachable")
        outage.steps.append(step)
        return
    try:
        await run_step()
    except db.DatabaseSilent:
        report.failed_steps.append(step)
        raise
    except asyncio.CancelledError as error:
        if not amqp.cancelled_by_a_closing_connection():
            raise
        lost = ConnectionLost("the connection to RabbitMQ closed before the broker answered")
        lost.__cause__ = error
        outage.met(lost)
        _failed_for_the_broker(report, outage, step, lost)
    except Exception as error:
        if outage.met(error):
            _failed_for_the_broker(report, outage, step, error)
            return
        log.error("reconciler step %s failed: %s: %s", step, type(error).__name__, error)
        log.debug("reconciler step %s failed", step, exc_info=error)
        report.failed_steps.append(step)
        report.errors.append(f"{step}: {type(error).__name__}: {error}")


def _failed_for_the_broker(
    report: RunReport, outage: _BrokerOutage, step: str, error: BaseException
) -> None:
    """An outage, not a bug: said once for the run (:meth:`_BrokerOutage.log`)."""
    log.debug("reconciler step %s failed: the broker is unreachable", step, exc_info=error)
    report.failed_steps.append(step)
    report.errors.append(f"{step}: {type(error).__name__}: {error}")
    outage.steps.append(step)
