"""The reconciler (对账): find what the broker dropped and re-drive it from the ledger.

Retries alone leave gaps: a delay copy lost with a classic queue (dead-lettering is
at-most-once), a worker that died holding a lease whose delivery was then lost, an outbox row
no relay published, a message that was never published at all. The ledger knows what must
happen next for every key, so the reconciler scans it and repairs:

* ``retrying`` rows overdue by more than ``grace`` seconds: their delay copy never came back;
* ``processing`` rows whose lease ran out more than ``grace`` seconds ago: the worker died and
  its delivery was lost (a delivery that survives re-claims the row by itself, sooner);
* outbox rows still pending ``grace`` seconds after they were due: no relay published them;
* work past its consumer's ``expires_after``: finished ``skipped``, never published;
* registered :class:`~rabbitretry.reconcile.expected.Reconciliation` s: expected keys that were
  never seen are re-published, orphans reported;
* messages the broker itself dead-lettered into a dead-letter queue without a ledger row:
  recorded dead (:mod:`rabbitretry.reconcile.dead_queue`).

A re-driven copy is the ledger's snapshot, published to the work queue through the default
exchange under the same ``message_id`` (broker headers stripped, attempts header set), with
confirms and ``mandatory``. A copy that arrives twice is dropped by the claim, so a re-drive
can never run a handler twice. Several reconcilers may run at once: each scan takes a bounded
batch with ``FOR UPDATE SKIP LOCKED`` and marks it re-driven in the same statement, and a
re-driven row is left alone for ``grace`` seconds, so no message is published twice. Publishing
is paced (``publish_rate``) so that a recovering downstream is not flooded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rabbitretry import amqp, ledger
from rabbitretry.consumer import Consumer
from rabbitretry.db import UNAVAILABLE, Connection, Pool, Record, query
from rabbitretry.delivery import validity
from rabbitretry.errors import ConnectionLost, PublishError, UnpublishableError
from rabbitretry.message import headers
from rabbitretry.monitoring import heartbeat
from rabbitretry.outbox import fail_unpublishable, publish_row
from rabbitretry.publisher import encode
from rabbitretry.reconcile import dead_queue
from rabbitretry.reconcile.expected import Expected, Reconciliation, WindowReport, classify

log = logging.getLogger("rabbitretry.reconcile.reconciler")

HEARTBEAT_NAME = "reconciler"
KEY_CHUNK = 1000  # expected keys looked up per query
ORPHAN_EXAMPLES = 20


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
        }


class RateLimiter:
    """Spaces calls at least ``1 / per_second`` apart (no bursts: a recovering queue is fragile)."""

    def __init__(self, per_second: float) -> None:
        if per_second <= 0:
            raise ValueError("the publish rate must be positive")
        self.interval = 1.0 / per_second
        self._next = 0.0

    def delay(self, now: float) -> float:
        """Seconds to wait before a call at monotonic time ``now``; books that call."""
        start = max(now, self._next)
        self._next = start + self.interval
        return start - now

    async def wait(self) -> None:
        pause = self.delay(time.monotonic())
        if pause > 0:
            await asyncio.sleep(pause)


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

    def stop(self) -> None:
        self._stopping.set()

    async def run(self, interval: float) -> None:
        """Run every ``interval`` seconds until :meth:`stop`; a failed run is logged, not fatal."""
        self.expected_every = interval
        try:
            while not self._stopping.is_set():
                try:
                    await self.run_once()
                except Exception:
                    log.exception("reconciler run failed; trying again in %.0f s", interval)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), interval)
        finally:
            await self.close()

    async def run_once(self) -> RunReport:
        """One pass over every scan; recorded in the heartbeat, success or failure."""
        await heartbeat.started(self.pool, self.heartbeat_name, self.instance, self.expected_every)
        report = RunReport()
        try:
            await self._open_publisher()
            report.retries_redriven = await self._redrive(report, "reconcile_overdue_retries")
            report.leases_redriven = await self._redrive(report, "reconcile_expired_leases")
            report.outbox_published = await self._publish_stuck_outbox(report)
            report.broker_dead_recorded = await dead_queue.scan(
                self.pool,
                self._connection,
                self._publisher_or_fail(),
                self.consumers,
                limit=self.batch_size * self.max_batches,
                batch_size=self.batch_size,
                errors=report.errors,
            )
            for item in self.reconciliations:
                report.windows.append(await self._reconcile(item, report))
        except BaseException as error:
            with contextlib.suppress(*UNAVAILABLE):
                await heartbeat.finished(
                    self.pool,
                    self.heartbeat_name,
                    counts=report.counts(),
                    error=f"{type(error).__name__}: {error}",
                )
            raise
        await heartbeat.finished(
            self.pool,
            self.heartbeat_name,
            counts=report.counts(),
            error="; ".join(report.errors[:5]) or None,
        )
        return report

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

    # --- ledger rows whose broker copy was lost --------------------------------------------

    async def _redrive(self, report: RunReport, scan: str) -> int:
        """Take marked batches of ``scan`` and publish (or skip) each row; how many published."""
        published = 0
        for _ in range(self.max_batches):
            rows = await self.pool.fetch(query(scan), self.grace, self.batch_size)
            for row in rows:
                if await self._skip_if_expired(row):
                    report.expired_skipped += 1
                elif await self._publish_row(row, report):
                    published += 1
            if len(rows) < self.batch_size:
                break
        return published

    async def _skip_if_expired(self, row: Record) -> bool:
        expires_after = self._expiry.get(row["queue"])
        if expires_after is None:
            return False
        if not validity.is_expired(expires_after, _born(row), datetime.now(UTC)):
            return False
        skipped: int = await self.pool.fetchval(
            query("reconcile_skip_expired"), row["queue"], row["message_id"], validity.EXPIRED
        )
        if skipped:
            log.info("%s/%s: expired, marked skipped", row["queue"], row["message_id"])
        return bool(skipped)

    async def _publish_row(self, row: Record, report: RunReport) -> bool:
        """Re-publish a row's snapshot to its work queue; False (and recorded) on a refusal."""
        snapshot = ledger.snapshot_of(row)
        await self._limiter.wait()
        try:
            await self._publisher_or_fail().publish(
                snapshot.body,
                routing_key=row["queue"],
                message_id=row["message_id"],
                headers=headers.republished(snapshot.headers, row["attempts"]),
                properties=amqp.restore_properties(snapshot.properties),
            )
        except ConnectionLost:
            raise  # every next publish would fail too: end the run, the rows stay marked
        except (PublishError, UnpublishableError) as error:
            # The row stays marked: it is tried again after the grace period (a snapshot that
            # cannot be encoded is reported on each pass, and the run goes on).
            report.errors.append(f"{row['queue']}/{row['message_id']}: {error}")
            log.error("re-driving %s/%s failed: %s", row["queue"], row["message_id"], error)
            return False
        log.info("%s/%s re-driven to its work queue", row["queue"], row["message_id"])
        return True

    def _publisher_or_fail(self) -> amqp.ConfirmingPublisher:
        if self._publisher is None:
            raise RuntimeError("the reconciler is not connected")
        return self._publisher

    # --- the outbox ------------------------------------------------------------------------

    async def _publish_stuck_outbox(self, report: RunReport) -> int:
        """Publish outbox rows no relay took, holding their locks like a relay does."""
        published = 0
        for _ in range(self.max_batches):
            async with self.pool.acquire() as conn, conn.transaction():
                rows = await conn.fetch(
                    query("reconcile_stuck_outbox"), self.grace, self.batch_size
                )
                sent, lost = await self._publish_outbox_rows(conn, rows, report)
                if sent:
                    await conn.execute(query("outbox_sent"), sent)
            if lost is not None:
                raise lost  # every next publish would fail too; the confirmed rows stay sent
            published += len(sent)
            if len(rows) < self.batch_size:
                break
        return published

    async def _publish_outbox_rows(
        self, conn: Connection, rows: list[Record], report: RunReport
    ) -> tuple[list[int], ConnectionLost | None]:
        """Publish ``rows`` in turn: the ids confirmed, and the lost connection that cut the
        batch short, if one did. A row that cannot be published never ends the run."""
        sent: list[int] = []
        for row in rows:
            await self._limiter.wait()
            try:
                await publish_row(self._publisher_or_fail(), row)
            except ConnectionLost as error:
                return sent, error
            except UnpublishableError as error:
                # No try can succeed: failed now, with the reason, as the relay does.
                await fail_unpublishable(conn, row, error)
                report.errors.append(f"outbox row {row['id']} cannot be published: {error}")
                continue
            except PublishError as error:
                # Left pending for the relay, whose backoff and give-up rules apply.
                report.errors.append(f"outbox row {row['id']}: {error}")
                continue
            except Exception as error:
                # A bug: left pending for the relay, and the run goes on to its other checks.
                log.exception("publishing outbox row %s failed", row["id"])
                report.errors.append(f"outbox row {row['id']}: {type(error).__name__}: {error}")
                continue
            sent.append(row["id"])
        return sent, None

    # --- expected vs actual ----------------------------------------------------------------

    async def _reconcile(self, item: Reconciliation, report: RunReport) -> WindowReport:
        start, end = item.window(datetime.now(UTC))
        window = WindowReport(item.name, item.queue, start, end)
        expected_keys: list[str] = []
        chunk: list[Expected] = []
        async for expected in item.expected(start, end):
            chunk.append(expected)
            if len(chunk) >= KEY_CHUNK:
                await self._check_chunk(item, chunk, window, report)
                expected_keys += [e.message_id for e in chunk]
                chunk = []
        if chunk:
            await self._check_chunk(item, chunk, window, report)
            expected_keys += [e.message_id for e in chunk]
        orphans = await self.pool.fetch(
            query("reconcile_orphans"), item.queue, start, end, expected_keys, ORPHAN_EXAMPLES
        )
        await self.pool.execute(query("reconcile_forget_republished"), item.name, item.lookback)
        window.orphaned = orphans[0]["total"] if orphans else 0
        window.orphan_examples = [row["message_id"] for row in orphans]
        if window.orphaned:
            log.warning(
                "%s: %d key(s) of %s succeeded without being expected, e.g. %s",
                item.name,
                window.orphaned,
                item.queue,
                ", ".join(window.orphan_examples[:5]),
            )
        return window

    async def _check_chunk(
        self,
        item: Reconciliation,
        chunk: list[Expected],
        window: WindowReport,
        report: RunReport,
    ) -> None:
        rows = await self.pool.fetch(
            query("reconcile_key_statuses"), item.queue, [e.message_id for e in chunk]
        )
        classified = classify([e.message_id for e in chunk], {r[0]: r[1] for r in rows})
        window.add(classified)
        if not classified.missing:
            return
        claimed = await self.pool.fetch(
            query("reconcile_claim_republish"),
            item.queue,
            classified.missing,
            item.name,
            self.grace,
        )
        by_key = {e.message_id: e for e in chunk}
        for row in claimed:
            if await self._republish(item.queue, by_key[row["message_id"]], report):
                window.republished += 1

    async def _republish(self, queue: str, expected: Expected, report: RunReport) -> bool:
        body, content_type = encode(expected.payload)
        await self._limiter.wait()
        try:
            await self._publisher_or_fail().publish(
                body,
                routing_key=queue,
                message_id=expected.message_id,
                headers=expected.headers,
                properties={"content_type": content_type},
            )
        except ConnectionLost:
            raise
        except PublishError as error:
            report.errors.append(f"{queue}/{expected.message_id}: {error}")
            return False
        log.info("%s/%s was never seen: re-published", queue, expected.message_id)
        return True


def _born(row: Record) -> datetime | None:
    """When the message was published (its AMQP timestamp), else when it was first seen."""
    properties: Mapping[str, Any] = json.loads(row["properties"])
    if "timestamp" in properties:
        return datetime.fromtimestamp(float(properties["timestamp"]), tz=UTC)
    first_seen: datetime | None = row["first_seen"]
    return first_seen
