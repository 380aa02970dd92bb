"""The one road for an attempt's ledger writes: claim, start, renew, finish, retry, interrupt,
reject.

The delivery pipeline writes the ledger only through :class:`AttemptLedger`. Claims, start
marks and plain success marks of concurrent attempts go through the commit groups; a success
mark whose handler used ``ctx.transaction()`` commits inside that transaction; everything else
is one statement.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Literal, Protocol

from rabbitretry.db import Connection, Pool, Record, answering, write_refusal
from rabbitretry.errors import ServiceUnavailable
from rabbitretry.ledger import repairs, statements
from rabbitretry.ledger.commits import (
    AttemptRef,
    ClaimRequest,
    CommitGroup,
    Success,
    commits_for,
)
from rabbitretry.ledger.failures import Failure
from rabbitretry.ledger.statements import FINISHED, Claim, Key, Snapshot

PING_TIMEOUT = 5.0


class OpenTransaction(Protocol):
    """The handler's open transaction, in which the success mark must commit."""

    async def commit_with(self, mark: Callable[[Connection], Awaitable[bool]]) -> bool: ...


class AttemptLedger:
    """Ledger writes of the attempts of one worker (one pool).

    Every write is answered within :data:`rabbitretry.db.SILENT_AFTER` seconds or raises
    :class:`~rabbitretry.db.DatabaseSilent` (an outage): a database that keeps the connection
    but stops answering closes the worker's outage gate instead of holding its deliveries.
    """

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self._commits = commits_for(pool)

    async def claim(self, request: ClaimRequest) -> Claim:
        return await self.claim_sent(request)

    def claim_sent(self, request: ClaimRequest) -> asyncio.Future[Claim]:
        """The claim, sent with the next group: its future, which a caller's cancellation
        does not cancel (the claim may still commit, and must then be given back)."""
        return self._commits.claims.enqueue(request)

    async def mark_started(self, key: Key, attempt: int) -> bool:
        """From now on ``attempt`` counts, even if its worker dies; False if it was no longer
        ours. (The pipeline marks a running handler with :meth:`start_mark`.)"""
        return await self._commits.starts.submit(AttemptRef(key, attempt))

    def start_mark(self, key: Key, attempt: int, after: float) -> StartMark:
        """The start mark of ``attempt``, to arm right before its handler: written once the
        handler has run ``after`` seconds, never if it is cancelled first."""
        return StartMark(self._commits.starts, AttemptRef(key, attempt), after)

    async def renew_lease(self, key: Key, attempt: int, lease_seconds: float) -> bool:
        async with answering(self.pool) as conn:
            return await statements.renew_lease(conn, key, attempt, lease_seconds)

    async def succeed(
        self,
        key: Key,
        attempt: int,
        transaction: OpenTransaction | None = None,
        *,
        keep_snapshot: bool = False,
    ) -> bool:
        """Mark ``attempt`` succeeded (in ``transaction``, if the handler opened one); the
        message's snapshot is dropped unless ``keep_snapshot``."""
        if transaction is None:
            return await self._commits.successes.submit(Success(key, attempt, keep_snapshot))

        async def mark(conn: Connection) -> bool:
            return await statements.finish(
                conn, key, attempt, "succeeded", keep_snapshot=keep_snapshot
            )

        return await transaction.commit_with(mark)

    async def finish(
        self,
        key: Key,
        attempt: int,
        status: Literal["dead", "skipped"],
        *,
        reason: str,
        failure: Failure | None = None,
    ) -> bool:
        async with answering(self.pool) as conn:
            return await statements.finish(
                conn, key, attempt, status, reason=reason, failure=failure
            )

    async def schedule_retry(
        self, key: Key, attempt: int, delay: float, failure: Failure
    ) -> float | None:
        async with answering(self.pool) as conn:
            return await statements.schedule_retry(conn, key, attempt, delay, failure)

    async def confirm_retry_copy(self, key: Key, attempt: int) -> None:
        async with answering(self.pool) as conn:
            await statements.confirm_retry_copy(conn, key, attempt)

    async def interrupt(self, key: Key, attempt: int) -> bool:
        async with answering(self.pool) as conn:
            return await statements.interrupt(conn, key, attempt)

    async def defer(self, key: Key, attempt: int, failure: Failure) -> bool:
        """``attempt`` met its downstream's breaker open: not counted, due again at once."""
        async with answering(self.pool) as conn:
            return await statements.defer(conn, key, attempt, failure)

    async def record_rejected(
        self,
        key: Key,
        *,
        max_attempts: int,
        reason: str,
        failure: Failure,
        snapshot: Snapshot,
    ) -> bool:
        async with answering(self.pool) as conn:
            return await statements.record_rejected(
                conn,
                key,
                max_attempts=max_attempts,
                reason=reason,
                failure=failure,
                snapshot=snapshot,
            )

    async def refuse_in_flight(self, key: Key, reason: str, failure: Failure) -> bool:
        """A row still in flight whose copy is refused before the claim: dead for ``reason``
        (:func:`rabbitretry.ledger.repairs.refuse_in_flight`); False if it was not in flight."""
        async with answering(self.pool) as conn:
            return await repairs.refuse_in_flight(conn, key, reason, failure)

    async def get(self, key: Key) -> Record | None:
        async with answering(self.pool) as conn:
            return await statements.get(conn, key)

    async def owned_elsewhere(self, key: Key, attempt: int) -> bool:
        """After a final write of ``attempt`` matched no row: is the work safe without us?

        True when the row says the work is finished or a later attempt owns it. False when
        the row is gone or still at ``attempt`` (a claim lost in a database crash): the
        delivery must then be requeued, never acked.
        """
        row = await self.get(key)
        if row is None:
            return False
        return row["status"] in FINISHED or row["attempts"] > attempt

    async def release_claim(self, key: Key, worker: str) -> None:
        """Give back a claim of ``worker`` whose reply was lost: it is not counted."""
        async with answering(self.pool) as conn:
            await statements.release_claim(conn, key, worker)

    async def reconnect(self) -> None:
        """Raises unless the ledger answers and would take a write; a probe during an outage.

        The pool's connections from before the outage are replaced first: each would
        otherwise fail once more on its next use (and a session keeps the read-only default
        it started with). A read-only database (a standby after a failover) answers
        ``SELECT 1``, so the probe asks whether it would write.
        """
        await self.pool.expire_connections()
        async with answering(self.pool, PING_TIMEOUT) as conn:
            refusal = await write_refusal(conn)
        if refusal is not None:
            raise ServiceUnavailable(f"the ledger refuses writes: {refusal}")


class StartMark:
    """One attempt's start mark, written by a timer once its handler has run a while.

    The timer is armed in the step that calls the handler, so the handler's first step always
    runs before the mark can be written, and a mark never names an attempt whose handler did
    not start. The write joins the start marks' commit group; nobody waits for it (a failed
    mark leaves the attempt unmarked, so a death in it is forgiven: an outage charges
    nothing)."""

    def __init__(
        self, marks: CommitGroup[AttemptRef, bool], attempt: AttemptRef, after: float
    ) -> None:
        self._marks = marks
        self._attempt = attempt
        self._after = after
        self._timer: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(self._after, self._write)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _write(self) -> None:
        self._marks.enqueue(self._attempt).add_done_callback(_read)


def _read(marked: asyncio.Future[bool]) -> None:
    """A mark's result, read so that a failed one is not reported as never retrieved."""
    if not marked.cancelled():
        marked.exception()
