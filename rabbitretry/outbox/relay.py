"""The relay: publishes pending outbox rows with confirms, and marks them sent."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime

from rabbitretry import amqp, db
from rabbitretry.db import UNAVAILABLE, Connection, Pool, Record, query
from rabbitretry.errors import ConnectionLost, PublishError, UnpublishableError
from rabbitretry.outbox.rows import (
    INITIAL_BACKOFF,
    MAX_BACKOFF,
    MAX_TRIES,
    fail_unpublishable,
    failed_try,
    publish_run,
    take_runs,
)
from rabbitretry.outbox.scan import ScanFloor

log = logging.getLogger("rabbitretry.outbox")

NOTIFY_CHANNEL = "rabbitretry_outbox"
WINDOW = 4  # due rows a poll looks at first, per row of its batch (outbox_window_heads)


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
                heads = await self._take(conn, start)
            self.scan.found([row["next_try_at"] for row in heads])
            async with db.answered(conn):
                runs = await take_runs(conn, heads, self.batch_size)
            outcomes = await asyncio.gather(
                *(publish_run(publisher, run, self.publish_timeout) for run in runs),
                return_exceptions=True,
            )
            tried: list[Record] = []
            results: list[Exception | None] = []
            for run, outcome in zip(runs, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    raise outcome  # cancelled: the rows stay pending for the next relay
                tried += run[: len(outcome)]
                results += outcome
            async with db.answered(conn):
                return await self._settle(conn, tried, results)

    async def _take(self, conn: Connection, start: datetime | None) -> list[Record]:
        """The heads to publish: from a window of the first due rows, or if it holds none
        (every row in it held back), from every due row."""
        window = WINDOW * self.batch_size
        ids = await conn.fetch(query("outbox_window_heads"), self.batch_size, start, window)
        heads: list[Record] = []
        if ids:
            locked = await conn.fetch(query("outbox_take_ids"), [row["id"] for row in ids])
            heads = [row for row in locked if row["status"] == "pending"]
        if not heads:
            heads = await conn.fetch(query("outbox_take"), self.batch_size, start)
        return heads

    async def _settle(
        self, conn: Connection, rows: list[Record], results: list[Exception | None]
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
            else:
                # A refusal, or a bug: a failed try of this row alone. Raising would roll
                # back the batch's `sent` marks and publish its confirmed rows again.
                await self._record_failure(conn, row, result)
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
