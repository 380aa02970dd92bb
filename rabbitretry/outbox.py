"""The transactional outbox: enqueue a message in your own transaction, a relay publishes it.

::

    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("UPDATE orders SET paid = true WHERE id = $1", order_id)
        await outbox.enqueue(conn, "orders", OrderPaid(...), routing_key="order.paid",
                             message_id=f"order-{order_id}-paid")

The row commits with the business write or not at all: a paid order without its message, or
a message for an order that was rolled back, cannot happen. The relay publishes pending rows
with confirms and marks them ``sent`` only after the broker confirmed; a relay that dies in
between publishes the row again, and the consumer's ledger drops the duplicate by its
``message_id``. Several relays can run: each takes rows with ``FOR UPDATE SKIP LOCKED``.

Ordering: rows that share an ``ordering_key`` are published one at a time in the order they
were enqueued (a row waits while an older row of its key is pending; a row that ends
``failed`` stops holding the others back). Rows without a key have no order among themselves.

A row whose message AMQP cannot carry (a ``message_id`` over 255 bytes, a header integer
beyond 64 bits, an infinite number...) is never sent: it ends ``failed`` at once with the
reason in ``last_error``, and the rest of its batch goes on as if it were not there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel

from rabbitretry import amqp, db, tracing
from rabbitretry.db import UNAVAILABLE, Connection, Pool, Record, query
from rabbitretry.errors import ConnectionLost, PublishError, UnpublishableError
from rabbitretry.publisher import encode, new_message_id

__all__ = ["Outbox", "OutboxRelay", "RelayStats", "ScanFloor"]

log = logging.getLogger("rabbitretry.outbox")

NOTIFY_CHANNEL = "rabbitretry_outbox"
MAX_TRIES = 10  # tries of a row the broker refuses before it is failed for good
INITIAL_BACKOFF = 1.0  # seconds before the second try, doubling up to MAX_BACKOFF
MAX_BACKOFF = 300.0
FULL_SCAN_EVERY = 60.0  # seconds between a relay's scans of every pending row (ScanFloor)
LATE_COMMIT = timedelta(seconds=60)  # a producer's transaction this long is still seen at once


class Outbox:
    """Writes messages into ``rabbitretry.outbox`` on the caller's connection."""

    async def enqueue(
        self,
        conn: Connection,
        exchange: str,
        payload: BaseModel | Mapping[str, Any] | list[Any] | bytes,
        *,
        routing_key: str = "",
        message_id: str | None = None,
        headers: Mapping[str, Any] | None = None,
        ordering_key: str | None = None,
    ) -> str:
        """Add a message to the outbox inside the caller's transaction; its message_id.

        Call it inside ``conn.transaction()``: outside one, the row commits on its own.
        """
        body, content_type = encode(payload)
        message_id = message_id or new_message_id()
        # The row stores the caller's trace context: the relay's publish carries it.
        with tracing.enqueue_span(
            exchange, routing_key, message_id, headers, body_size=len(body)
        ) as headers:
            await conn.execute(
                query("outbox_enqueue"),
                exchange,
                routing_key,
                message_id,
                ordering_key,
                body,
                json.dumps(dict(headers or {}), default=str),
                content_type,
            )
            await conn.execute(query("outbox_notify"))  # delivered at commit, not before
        return message_id


@dataclass
class RelayStats:
    sent: int = 0
    failed_tries: int = 0
    given_up: int = 0
    unpublishable: int = 0
    unconfirmed: int = 0
    """Publishes an outage cut short (no confirm came): their rows stayed pending, no try
    counted, and each may reach the queue once more than it is marked sent."""


@dataclass
class ScanFloor:
    """Where a relay's scan of the pending rows starts.

    Each row sent leaves its entry in the index of pending rows (``outbox_pending_idx``) until
    a vacuum, and a scan that starts at the oldest due time walks all of them first. An
    outbox keeps its sent rows for the retention window, so autovacuum comes after days of
    them: with 500,000 sent since the last vacuum a poll read 1,900 pages (2.8 ms), and the
    first poll after them 116 ms. So a poll starts ``late_commit`` before the oldest due time
    the last poll found, and walks only what was sent since. A row's due time is when its
    transaction began: a row committed more than ``late_commit`` after that, behind a poll
    that found newer rows, is below the floor, and so is a row that waited behind an older
    row of its ordering key that backed off; every ``full_scan_every`` seconds a poll scans
    them all, and finds those.
    """

    full_scan_every: float = FULL_SCAN_EVERY
    late_commit: timedelta = LATE_COMMIT
    floor: datetime | None = None
    """The due time this relay's polls start at; None until a poll found a row."""
    _next_full_scan: float = field(default=float("-inf"), init=False)

    def start(self, now: float) -> datetime | None:
        """Where this poll starts (None: at the oldest row); ``now``, a monotonic clock."""
        if now >= self._next_full_scan:
            self._next_full_scan = now + self.full_scan_every
            return None
        return self.floor

    def found(self, due_times: Sequence[datetime]) -> None:
        """The due times of the rows a poll took: the next poll starts from the oldest."""
        if due_times:
            try:
                self.floor = min(due_times) - self.late_commit
            except (TypeError, OverflowError):
                # A row written by hand as due at -infinity (read as a naive datetime.min) or
                # in year 1: no floor, every row is scanned, as before the floor existed.
                self.floor = None


@dataclass
class OutboxRelay:
    """Publishes pending outbox rows. ``await relay.run()`` until ``relay.stop()``.

    Wakes on LISTEN/NOTIFY when a row is enqueued, and polls every ``poll_interval`` seconds
    in case a notification was missed (for example while the relay was reconnecting).
    """

    pool: Pool
    amqp_url: str
    batch_size: int = 100
    poll_interval: float = 1.0
    max_tries: int = MAX_TRIES
    initial_backoff: float = INITIAL_BACKOFF
    max_backoff: float = MAX_BACKOFF
    publish_timeout: float = 30.0
    """Seconds a publish may wait for the broker's confirm before its row is left pending
    (with heartbeats on, a silent broker is usually noticed sooner: see the operations guide)."""
    stats: RelayStats = field(default_factory=RelayStats)
    scan: ScanFloor = field(default_factory=ScanFloor)
    ready: bool = field(default=False, init=False)
    """True once connected and listening."""
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _stopping: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _broker_away: bool = field(default=False, init=False)
    _database_away: bool = field(default=False, init=False)

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    async def run(self) -> None:
        connection = await amqp.connect(self.amqp_url, name="rabbitretry-outbox-relay")
        try:
            publisher = await amqp.ConfirmingPublisher.open(connection)
            async with self._listening():
                self.ready = True
                while not self._stopping.is_set():
                    try:
                        moved = await self.relay_once(publisher)
                    except UNAVAILABLE as error:
                        self._note_database_away(error)
                        moved = 0
                    except Exception:
                        # A relay that stops is an outbox that fills up: log and go on.
                        log.exception("outbox relay: unexpected error; trying again")
                        moved = 0
                    else:
                        self._note_database_back()
                    if moved == 0:  # nothing due: wait for a notification or the poll
                        await self._sleep()
        finally:
            await connection.close()

    async def relay_once(self, publisher: amqp.ConfirmingPublisher) -> int:
        """Publish one batch of due rows; how many rows it sent, failed, or counted a try for.

        A row whose publish failed because the connection was lost is left as it was, try
        not counted: the broker being away is not the message's fault. A row AMQP cannot
        carry is failed at once; each row's outcome is its own, so the confirmed rows of a
        batch are marked sent whatever happened to the others.
        """
        if not publisher.available:
            return 0  # reconnecting: leave the rows alone rather than hold their locks
        # Every statement is answered within db.SILENT_AFTER, or the pass is given up (a
        # silent database) and the next one, after the poll interval, tries again.
        async with (
            self.pool.acquire(timeout=db.SILENT_AFTER) as conn,
            db.answered_transaction(conn),
        ):
            start = self.scan.start(asyncio.get_running_loop().time())
            async with db.answered(conn):
                rows = await conn.fetch(query("outbox_take"), self.batch_size, start)
            self.scan.found([row["next_try_at"] for row in rows])
            results = await asyncio.gather(
                *(publish_row(publisher, row, self.publish_timeout) for row in rows),
                return_exceptions=True,
            )
            async with db.answered(conn):
                return await self._settle(conn, rows, results)

    async def _settle(
        self, conn: Connection, rows: list[Record], results: list[BaseException | None]
    ) -> int:
        """Mark the batch's confirmed rows sent and record the others' failures; how many."""
        sent = [row["id"] for row, result in zip(rows, results, strict=True) if result is None]
        if sent:
            await conn.execute(query("outbox_sent"), sent)
            self.stats.sent += len(sent)
        settled = len(sent)
        lost = [
            (row, r) for row, r in zip(rows, results, strict=True) if isinstance(r, ConnectionLost)
        ]
        self._note_outage(lost, sent=bool(sent))
        for row, result in zip(rows, results, strict=True):
            if result is None or isinstance(result, ConnectionLost):
                continue
            if isinstance(result, UnpublishableError):
                await fail_unpublishable(conn, row, result)
                self.stats.unpublishable += 1
            elif isinstance(result, Exception):
                # A refusal, or a bug: a failed try of this row alone. Raising would roll
                # back the batch's `sent` marks and publish its confirmed rows again.
                await self._record_failure(conn, row, result)
            else:
                raise result  # cancelled: the rows stay pending for the next relay
            settled += 1
        return settled

    def _note_database_away(self, error: Exception) -> None:
        """Say once per outage that the database is away (each poll tries it again)."""
        log.log(
            logging.DEBUG if self._database_away else logging.ERROR,
            "outbox relay: the database is unreachable (%s); trying again every %g s",
            error,
            self.poll_interval,
        )
        self._database_away = True

    def _note_database_back(self) -> None:
        if self._database_away:
            log.info("outbox relay: the database answers again")
            self._database_away = False

    def _note_outage(self, lost: list[tuple[Record, ConnectionLost]], *, sent: bool) -> None:
        """Say once per outage that the broker is away and the rows stay pending."""
        if not lost:
            if sent and self._broker_away:
                log.info("outbox relay: the broker confirms publishes again")
                self._broker_away = False
            return
        self.stats.unconfirmed += len(lost)
        (first, error), rest = lost[0], len(lost) - 1
        more = f" and {rest} more" if rest else ""
        log.log(
            logging.DEBUG if self._broker_away else logging.WARNING,
            "outbox relay: the broker did not confirm; row %s%s stay pending, no try counted, "
            "and are published again once it answers (%s)",
            first["id"],
            more,
            error,
        )
        self._broker_away = True

    async def _record_failure(self, conn: Connection, row: Record, error: Exception) -> None:
        if isinstance(error, PublishError):
            reason = str(error)
        else:  # a bug: counted as a try like a refusal, with its traceback in the log
            reason = f"{type(error).__name__}: {error}"
            log.error("outbox row %s: unexpected error publishing it", row["id"], exc_info=error)
        tries, backoff = await failed_try(
            conn,
            row,
            reason,
            max_tries=self.max_tries,
            initial_backoff=self.initial_backoff,
            max_backoff=self.max_backoff,
        )
        self.stats.failed_tries += 1
        if tries >= self.max_tries:
            self.stats.given_up += 1
            log.error(
                "outbox row %s (%s) failed after %d tries: %s",
                row["id"],
                row["message_id"],
                tries,
                reason,
            )
        else:
            log.warning(
                "outbox row %s (%s): try %d failed (%s), next in %.1f s",
                row["id"],
                row["message_id"],
                tries,
                reason,
                backoff,
            )

    async def _sleep(self) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), self.poll_interval)

    @contextlib.asynccontextmanager
    async def _listening(self) -> AsyncIterator[None]:
        def wake(*_: object) -> None:
            self._wake.set()

        async with self.pool.acquire() as conn:
            await conn.add_listener(NOTIFY_CHANNEL, wake)
            try:
                yield
            finally:
                with contextlib.suppress(*UNAVAILABLE):
                    await conn.remove_listener(NOTIFY_CHANNEL, wake)


async def publish_row(
    publisher: amqp.ConfirmingPublisher, row: Record, timeout: float = 30.0
) -> None:
    """Publish one outbox row as it was enqueued (confirmed, mandatory).

    Raises :class:`UnpublishableError`, before sending anything, for a row AMQP cannot carry
    (:func:`fail_unpublishable` records it), and :class:`PublishError` for a refusal or a loss.
    """
    await publisher.publish(
        bytes(row["payload"]),
        exchange=row["exchange"],
        routing_key=row["routing_key"],
        message_id=row["message_id"],
        headers=json.loads(row["headers"]),
        properties={"content_type": row["content_type"]},
        timeout=timeout,
    )


async def failed_try(
    conn: Connection,
    row: Record,
    reason: str,
    *,
    max_tries: int = MAX_TRIES,
    initial_backoff: float = INITIAL_BACKOFF,
    max_backoff: float = MAX_BACKOFF,
) -> tuple[int, float]:
    """Count a failed try of ``row``: due again after a jittered, doubling backoff, or
    ``failed`` once it had ``max_tries``. Its number of tries, and the backoff."""
    tries = row["tries"] + 1
    backoff = min(max_backoff, initial_backoff * 2 ** min(tries - 1, 30))
    backoff *= random.uniform(0.8, 1.2)
    await conn.execute(query("outbox_failed_try"), row["id"], reason, max_tries, backoff)
    return tries, backoff


async def fail_unpublishable(conn: Connection, row: Record, error: UnpublishableError) -> None:
    """Mark a row ``failed`` at once, with the reason: an encoding error is the content's
    fault, so backing off and trying again could never succeed."""
    await conn.execute(query("outbox_unpublishable"), row["id"], str(error))
    log.error(
        "outbox row %s (%.60s) cannot be published, marked failed: %s",
        row["id"],
        row["message_id"],
        error,
    )
