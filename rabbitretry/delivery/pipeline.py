"""One delivery's I/O: identify, claim, run the attempt core, record, publish, then settle.

The ledger is written before the broker is told anything, so a crash at any point leaves a
row that says what must happen next. A copy is acked only once the ledger (and, for retries
and dead letters, the broker's confirm of the successor copy) makes it redundant.

Every delivery is settled, whatever fails, and each kind of failure has its own road:

- an *outage* (the ledger or the broker unreachable) closes that service's gate
  (:mod:`rabbitretry.delivery.outage`) and requeues the delivery once the gate opens again;
  nothing is charged;
- *content* the ledger refuses (a ``message_id`` PostgreSQL cannot store) is dead at once,
  reason ``unstorable``, kept under an escaped key;
- a *bug* (any other exception) in the attempt is a failed attempt under the retry policy; in
  our own code after the claim, the delivery is requeued and the claimed attempt counts, so the
  crash-loop guard ends a loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from rabbitretry import db, tracing
from rabbitretry.amqp import (
    CHANNEL_ERRORS,
    ConfirmingPublisher,
    IncomingMessage,
    message_properties,
)
from rabbitretry.consumer import Consumer, Context
from rabbitretry.db import Pool
from rabbitretry.delivery.attempt import AttemptResult, oversize, run_attempt
from rabbitretry.delivery.outage import OutageGate
from rabbitretry.delivery.outcome import Outcome
from rabbitretry.delivery.transaction import AttemptTransaction
from rabbitretry.errors import ConnectionLost, PublishError, UnpublishableError
from rabbitretry.ledger import AttemptLedger, Claim, ClaimRequest, Key, Snapshot, missing_id_key
from rabbitretry.ledger.failures import Failure, message_of, rejection
from rabbitretry.message import headers
from rabbitretry.message.storable import storable_text
from rabbitretry.topology import delays

log = logging.getLogger("rabbitretry.worker")

REQUEUE_PAUSE = 1.0  # seconds before requeueing a delivery after an unexpected error
UNSTORABLE_PREFIX = "unstorable-id:"  # the key of a message whose own id the ledger refuses
SHUTDOWN_CLAIM_WAIT = 5.0  # seconds a shutdown waits for a claim in flight, to give it back


class Pipeline:
    """Takes deliveries of one consumer's queue through the pipeline."""

    def __init__(
        self,
        consumer: Consumer[Any],
        pool: Pool,
        publisher: ConfirmingPublisher,
        worker_id: str,
        *,
        ledger_gate: OutageGate | None = None,
        broker_gate: OutageGate | None = None,
    ) -> None:
        self.consumer = consumer
        self.pool = pool
        self.publisher = publisher
        self.worker_id = worker_id
        work_queue = type(consumer).work_queue()
        self.queue = work_queue.name
        self.dead_queue = work_queue.dead_queue_name
        self.queue_type = work_queue.type
        self.policy = type(consumer).retry
        self.ledger = AttemptLedger(pool)
        self.ledger_gate = ledger_gate or OutageGate("ledger", self.ledger.reconnect)
        self.broker_gate = broker_gate or OutageGate(
            "broker", broker_probe(lambda: publisher.available)
        )

    async def process(self, message: IncomingMessage) -> Outcome:
        """Take one delivery to its outcome, and settle it: ack, or requeue. Never raises
        (but for a shutdown's cancellation, after requeueing)."""
        received_at = datetime.now(UTC)
        try:
            if not (await self.ledger_gate.passable() and await self.broker_gate.passable()):
                return await self._requeue(message)
            with tracing.delivery_span(self.queue, message) as span:
                outcome = await self._process(message)
                span.outcome(outcome)
        except asyncio.CancelledError:
            await _settle(message, requeue=True)
            raise
        except Exception as error:
            return await self._unsettled(message, error)
        if outcome.result == "requeued":
            return self._logged(await self._requeue(message, outcome), received_at)
        await _settle(message, requeue=False)
        return self._logged(
            replace(outcome, published_at=message.timestamp, received_at=received_at), received_at
        )

    async def _unsettled(self, message: IncomingMessage, error: Exception) -> Outcome:
        """A delivery whose outcome could not be recorded: requeue it, after a pause."""
        if db.is_outage(error):
            self.ledger_gate.report(error)
        elif isinstance(error, ConnectionLost):
            self.broker_gate.report(error)
        elif isinstance(error, PublishError):
            log.error(
                "%s: %s; message requeued, the ledger keeps its state",
                self.queue,
                error,
                extra=self._fields(message_id=message.message_id, outcome="requeued"),
            )
            await asyncio.sleep(REQUEUE_PAUSE)
        else:
            log.error(
                "%s: unexpected error with message %r; requeued (a claimed attempt counts, so "
                "a message that always meets it ends dead)",
                self.queue,
                storable_text(message.message_id or ""),
                exc_info=error,
                extra=self._fields(message_id=message.message_id, outcome="requeued"),
            )
            await asyncio.sleep(REQUEUE_PAUSE)
        # Wait for the service to answer, so that the redelivery does not meet the outage.
        await self.ledger_gate.passable()
        await self.broker_gate.passable()
        return await self._requeue(message)

    async def _requeue(self, message: IncomingMessage, outcome: Outcome | None = None) -> Outcome:
        await _settle(message, requeue=True)
        return outcome or Outcome(None, "requeued")

    async def _process(self, message: IncomingMessage) -> Outcome:
        snapshot = _snapshot(message)
        if not message.message_id:
            return await self._reject(
                Key(self.queue, missing_id_key()),
                "missing-message-id",
                "the message has no message_id property, so it cannot be deduplicated; "
                "publish with a message_id (a business key) or replay it to assign one",
                snapshot,
            )
        key = Key(self.queue, message.message_id)
        too_large = oversize(type(self.consumer), message.body)
        if too_large is not None:
            return await self._reject(key, "too-large", too_large, snapshot)

        copy_attempts = headers.attempts_of(message.headers)
        request = ClaimRequest(
            key,
            max_attempts=self.policy.max_attempts,
            lease_seconds=type(self.consumer).lease,
            worker=self.worker_id,
            copy_attempts=copy_attempts,
            snapshot=snapshot,
        )
        try:
            claim = await self._claim(request)
        except Exception as error:
            if db.is_content_error(error):
                return await self._unstorable(key, snapshot, error)
            if db.is_outage(error):
                # The claim may have committed before its reply was lost: give it back once
                # the ledger answers, so that the outage charges no attempt.
                self.ledger_gate.report(error)
                if await self.ledger_gate.passable():
                    await self.ledger.release_claim(key, self.worker_id)
                return Outcome(key, "requeued")
            raise
        if claim.verdict in ("finished", "stale"):
            log.debug(
                "%s: %s copy dropped (%s)",
                key,
                claim.verdict,
                claim.status,
                extra=self._fields(key, attempt=claim.attempt, outcome="dropped"),
            )
            return Outcome(key, "dropped", claim.attempt)
        if claim.verdict in ("busy", "not-due"):
            # Hold the copy in the delay chain until the claim can succeed.
            refused = await self._publish_delayed(key, snapshot, claim.wait_seconds, copy_attempts)
            if refused is not None:
                return await self._reject(key, "unpublishable", refused, snapshot)
            return Outcome(key, "parked", claim.attempt)
        if claim.verdict == "exhausted":
            log.error(
                "%s: dead (crashed) after %d attempts: the worker died in the last",
                key,
                claim.attempt,
                extra=self._fields(key, attempt=claim.attempt, outcome="dead", reason="crashed"),
            )
            row = await self.ledger.get(key)
            failure = rejection(self.queue, "WorkerLost", row["error_message"] if row else "")
            await self._publish_dead(key, snapshot, "crashed", failure, claim.attempt)
            return Outcome(key, "dead", claim.attempt)
        try:
            return await self._attempt(message, key, claim, snapshot)
        except asyncio.CancelledError:
            # A shutdown, at any step of the attempt: it does not count.
            with contextlib.suppress(Exception):
                await asyncio.shield(self.ledger.interrupt(key, claim.attempt))
            log.warning(
                "%s: attempt %d interrupted by shutdown, requeued",
                key,
                claim.attempt,
                extra=self._fields(key, attempt=claim.attempt, outcome="interrupted"),
            )
            raise

    async def _claim(self, request: ClaimRequest) -> Claim:
        """The claim; a shutdown that arrives meanwhile gives back a claim that landed."""
        claiming = self.ledger.claim_sent(request)
        try:
            return await asyncio.shield(claiming)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                claim = await asyncio.wait_for(claiming, SHUTDOWN_CLAIM_WAIT)
                if claim.verdict == "claimed":
                    await self.ledger.interrupt(request.key, claim.attempt)
            raise

    async def _unstorable(self, key: Key, snapshot: Snapshot, error: Exception) -> Outcome:
        """The ledger refused this message's data: dead at once, under a key it accepts."""
        stored_key = Key(self.queue, UNSTORABLE_PREFIX + storable_text(key.message_id))
        detail = (
            f"the ledger cannot store this message ({type(error).__name__}: "
            f"{message_of(error)}); it is kept under the escaped key {stored_key.message_id!r}"
        )
        return await self._reject(stored_key, "unstorable", detail, snapshot)

    async def _attempt(
        self, message: IncomingMessage, key: Key, claim: Claim, snapshot: Snapshot
    ) -> Outcome:
        ctx = Context(
            queue=self.queue,
            message_id=key.message_id,
            attempt=claim.budget_attempt,
            max_attempts=self.policy.max_attempts,
            redelivered=bool(message.redelivered),
            headers=dict(message.headers or {}),
            x_death=headers.x_death(message.headers),
        )
        born = await self._born(message, key)
        async with self._lease_kept(key, claim.attempt):
            result = await run_attempt(
                self.consumer,
                message.body,
                ctx,
                born=born,
                now=datetime.now(UTC),
                new_transaction=lambda: AttemptTransaction(self.pool),
            )
        tracing.record_attempt(ctx.attempt, ctx.max_attempts, result)
        outcome = await self._record(key, claim, snapshot, result)
        return replace(outcome, handler_seconds=result.handler_seconds)

    async def _record(
        self, key: Key, claim: Claim, snapshot: Snapshot, result: AttemptResult
    ) -> Outcome:
        """Write the attempt's decision to the ledger, then publish what follows from it."""
        if result.outcome == "succeeded":
            return await self._succeeded(key, claim, result)
        if result.outcome == "skipped":
            log.info(
                "%s: skipped (%s), the handler is not called",
                key,
                result.reason,
                extra=self._fields(
                    key, attempt=claim.attempt, outcome="skipped", reason=result.reason
                ),
            )
            if not await self.ledger.finish(
                key, claim.attempt, "skipped", reason=result.reason or ""
            ):
                return await self._missed(key, claim.attempt, "skip mark")
            return Outcome(key, "skipped", claim.attempt)
        assert result.failure is not None
        if result.outcome == "dead":
            reason = result.reason or ""
            if not await self.ledger.finish(
                key, claim.attempt, "dead", reason=reason, failure=result.failure
            ):
                return await self._missed(key, claim.attempt, "dead mark")
            log.error(
                "%s: dead (%s) after attempt %d: %s: %s",
                key,
                result.reason,
                claim.attempt,
                result.failure.type,
                result.failure.message,
                extra=self._fields(key, attempt=claim.attempt, outcome="dead", reason=reason),
            )
            await self._publish_dead(key, snapshot, reason, result.failure, claim.attempt)
            return Outcome(key, "dead", claim.attempt)
        return await self._retrying(key, claim, snapshot, result.delay or 0.0, result.failure)

    async def _succeeded(self, key: Key, claim: Claim, result: AttemptResult) -> Outcome:
        transaction = result.transaction
        if not (isinstance(transaction, AttemptTransaction) and transaction.open):
            transaction = None  # the handler used no transaction: a grouped success mark
        in_transaction = transaction is not None
        committed = await self.ledger.succeed(key, claim.attempt, transaction)
        if not committed:
            what = (
                "success mark (its transaction rolled back)" if in_transaction else "success mark"
            )
            return await self._missed(key, claim.attempt, what)
        return Outcome(key, "succeeded", claim.attempt)

    async def _retrying(
        self, key: Key, claim: Claim, snapshot: Snapshot, delay: float, failure: Failure
    ) -> Outcome:
        wait = await self.ledger.schedule_retry(key, claim.attempt, delay, failure)
        if wait is None:
            return await self._missed(key, claim.attempt, "retry mark")
        log.warning(
            "%s: attempt %d failed (%s: %s), retry in %.1f s",
            key,
            claim.attempt,
            failure.type,
            failure.message,
            wait,
            extra=self._fields(key, attempt=claim.attempt, outcome="retrying"),
        )
        refused = await self._publish_delayed(key, snapshot, wait, claim.attempt)
        if refused is not None:
            return await self._reject(key, "unpublishable", refused, snapshot)
        await self.ledger.confirm_retry_copy(key, claim.attempt)
        return Outcome(key, "retrying", claim.attempt)

    async def _born(self, message: IncomingMessage, key: Key) -> datetime | None:
        """When the message was published, else first seen; only looked up if it can expire."""
        if type(self.consumer).expires_after is None or message.timestamp is not None:
            return message.timestamp
        row = await self.ledger.get(key)
        return row["first_seen"] if row else None

    async def _missed(self, key: Key, attempt: int, what: str) -> Outcome:
        """A final write matched no row: ack only if the ledger says another owns the work.

        The row may have moved on (finished, or a later attempt took over after our lease ran
        out), or our claim may have been lost with a database crash: then only a requeue
        keeps the message.
        """
        if await self.ledger.owned_elsewhere(key, attempt):
            log.warning(
                "%s: the %s of attempt %d matched no row: another attempt owns the work now",
                key,
                what,
                attempt,
                extra=self._fields(key, attempt=attempt, outcome="dropped"),
            )
            return Outcome(key, "dropped", attempt)
        log.warning(
            "%s: the %s of attempt %d matched no row and nothing else owns the work "
            "(a claim lost with the database?); requeued",
            key,
            what,
            attempt,
            extra=self._fields(key, attempt=attempt, outcome="requeued"),
        )
        return Outcome(key, "requeued", attempt)

    async def _reject(self, key: Key, reason: str, detail: str, snapshot: Snapshot) -> Outcome:
        failure = rejection(self.queue, reason, detail)
        try:
            stored = await self.ledger.record_rejected(
                key,
                max_attempts=self.policy.max_attempts,
                reason=reason,
                failure=failure,
                snapshot=snapshot,
            )
        except Exception as error:
            if not db.is_content_error(error) or key.message_id.startswith(UNSTORABLE_PREFIX):
                raise
            return await self._unstorable(key, snapshot, error)
        if not stored:
            # A copy of a message the ledger already holds (its first copy was refused too).
            log.debug(
                "%s: copy refused (%s) again; the ledger already has the message",
                storable_text(str(key)),
                reason,
                extra=self._fields(key, reason=reason),
            )
            return Outcome(key, "dropped")  # counted once, when it died
        log.error(
            "%s: dead (%s): %s",
            storable_text(str(key)),
            reason,
            detail,
            extra=self._fields(key, outcome="dead", reason=reason),
        )
        await self._publish_dead(key, snapshot, reason, failure, 0)
        return Outcome(key, "dead")

    async def _publish_delayed(
        self, key: Key, snapshot: Snapshot, wait: float, attempts: int
    ) -> str | None:
        """Publish a copy to the delay path; why not, if it cannot be encoded."""
        route = delays.route(self.queue, self.queue_type, wait)
        try:
            await self.publisher.publish(
                snapshot.body,
                exchange=route.exchange,
                routing_key=route.routing_key,
                message_id=key.message_id,
                headers=headers.republished(snapshot.headers, attempts),
                properties=headers.publishable_properties(snapshot.properties),
            )
        except UnpublishableError as error:
            # Content the broker cannot take back: without a copy the message would loop
            # between the ledger and the queue, so it ends dead (the caller records it).
            return f"the copy for the delay path cannot be published: {error}"
        return None

    async def _publish_dead(
        self, key: Key, snapshot: Snapshot, reason: str, failure: Failure, attempts: int
    ) -> None:
        """The dead letter's copy on ``Q.dead``, for people reading the queue.

        The ledger row is the dead letter; a copy that cannot be encoded is only logged.
        """
        try:
            await self._publish_dead_copy(key, snapshot, reason, failure, attempts)
        except UnpublishableError as error:
            # Not a second death line: the dead letter is in the ledger, logged already.
            log.warning(
                "%s: dead in the ledger; no copy on %s: %s",
                key,
                self.dead_queue,
                error,
                extra=self._fields(key, attempt=attempts or None),
            )

    async def _publish_dead_copy(
        self, key: Key, snapshot: Snapshot, reason: str, failure: Failure, attempts: int
    ) -> None:
        await self.publisher.publish(
            snapshot.body,
            routing_key=self.dead_queue,
            message_id=key.message_id,
            headers=headers.dead_letter(
                snapshot.headers,
                attempts,
                queue=self.queue,
                reason=reason,
                error_type=failure.type,
                error=failure.message,
            ),
            properties=headers.publishable_properties(snapshot.properties),
        )

    @contextlib.asynccontextmanager
    async def _lease_kept(self, key: Key, attempt: int) -> AsyncIterator[None]:
        """Renew the claim's lease every third of its length while the attempt runs.

        The renewing task starts only once a third of the lease has passed: most attempts
        end before that, and a task per attempt would cost every delivery.
        """
        lease = type(self.consumer).lease
        renewers: list[asyncio.Task[None]] = []

        async def renew() -> None:
            while True:
                try:
                    if not await self.ledger.renew_lease(key, attempt, lease):
                        log.warning(
                            "%s: attempt %d lost its lease",
                            key,
                            attempt,
                            extra=self._fields(key, attempt=attempt),
                        )
                        return
                except Exception as error:
                    log.warning(
                        "%s: lease renewal failed (%s), will try again",
                        key,
                        error,
                        extra=self._fields(key, attempt=attempt),
                    )
                await asyncio.sleep(lease / 3)

        timer = asyncio.get_running_loop().call_later(
            lease / 3, lambda: renewers.append(asyncio.create_task(renew()))
        )
        try:
            yield
        finally:
            timer.cancel()
            for renewer in renewers:
                renewer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await renewer

    def _fields(
        self, key: Key | None = None, *, message_id: str | None = None, **known: object
    ) -> dict[str, object]:
        """The structured fields of a delivery's log line (``extra``, see rabbitretry/logs.py):
        queue, message_id, worker, and those of ``known`` that are not None."""
        fields = {
            "queue": self.queue,
            "message_id": key.message_id if key is not None else message_id,
            "worker": self.worker_id,
            **known,
        }
        return {name: value for name, value in fields.items() if value is not None}

    def _logged(self, outcome: Outcome, received_at: datetime) -> Outcome:
        """The line that ends each delivery (DEBUG, ``run -v``): its outcome and duration."""
        if not log.isEnabledFor(logging.DEBUG):
            return outcome  # the hot path: no fields to build for a line nobody reads
        duration = (datetime.now(UTC) - received_at).total_seconds()
        log.debug(
            "%s: %s (attempt %d, %.3f s)",
            storable_text(str(outcome.key or self.queue)),
            outcome.result,
            outcome.attempt,
            duration,
            extra=self._fields(
                outcome.key,
                attempt=outcome.attempt or None,
                outcome=outcome.result,
                duration=round(duration, 6),
                handler_duration=outcome.handler_seconds,
            ),
        )
        return outcome


def broker_probe(is_up: Callable[[], bool]) -> Callable[[], Awaitable[None]]:
    """A probe that fails while the publishing connection is down (``is_up`` says)."""

    async def probe() -> None:
        if not is_up():
            raise ConnectionLost("the publishing connection to RabbitMQ is not back yet")

    return probe


async def _settle(message: IncomingMessage, *, requeue: bool) -> None:
    """Ack (or requeue) a delivery; on a channel that has since closed, there is nothing to do.

    The broker requeued the delivery when its channel closed; the redelivered copy meets the
    ledger, which drops it if its work is done.
    """
    if message.processed:
        return
    try:
        if requeue:
            await message.nack(requeue=True)
        else:
            await message.ack()
    except CHANNEL_ERRORS as error:
        log.info(
            "delivery %s could not be settled (%s); the broker redelivers it",
            message.message_id,
            error,
            extra={"message_id": message.message_id},
        )


def _snapshot(message: IncomingMessage) -> Snapshot:
    return Snapshot(
        body=message.body,
        headers=headers.without_broker_headers(message.headers),
        properties=message_properties(message),
        exchange=storable_text(message.exchange or ""),
        routing_key=storable_text(message.routing_key or ""),
    )
