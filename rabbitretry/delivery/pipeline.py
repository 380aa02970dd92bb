"""One delivery's I/O: identify, claim, run the attempt core, record, publish, then settle.

The ledger is written before the broker is told anything, so a crash at any point leaves a
row that says what must happen next. A copy is acked only once the ledger (and, for retries
and dead letters, the broker's confirm of the successor copy) makes it redundant.

Every delivery is settled, whatever fails, and each kind of failure has its own road:

- an *outage* (the ledger or the broker unreachable) closes that service's gate
  (:mod:`rabbitretry.delivery.outage`) and requeues the delivery once the gate opens again;
  nothing is charged;
- *content* the ledger refuses (a ``message_id`` PostgreSQL cannot store) is dead at once,
  reason ``unstorable``, kept under an escaped key; a header table the client could not decode
  (:mod:`rabbitretry.amqp.lenient_frames`) is dead at once, reason ``undecodable``, its raw
  bytes kept;
- a *bug* (any other exception) in the attempt is a failed attempt under the retry policy; in
  our own code after the claim, the delivery is requeued and the claimed attempt counts, so the
  crash-loop guard ends a loop.

This module takes a delivery from the gates to its claim and its attempt; the verdict is
written by :mod:`~rabbitretry.delivery.verdicts`, the copies published by
:mod:`~rabbitretry.delivery.copies`, the lease kept by :mod:`~rabbitretry.delivery.lease` and
the delivery acked or requeued by :mod:`~rabbitretry.delivery.settle`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from rabbitretry import db, tracing
from rabbitretry.amqp import ConfirmingPublisher, IncomingMessage
from rabbitretry.consumer import Consumer, Context
from rabbitretry.db import Pool
from rabbitretry.delivery.attempt import oversize, run_attempt
from rabbitretry.delivery.breakers import Breakers
from rabbitretry.delivery.copies import Copies, snapshot_of
from rabbitretry.delivery.lease import lease_kept
from rabbitretry.delivery.log_fields import LogFields
from rabbitretry.delivery.outage import OutageGate, broker_probe
from rabbitretry.delivery.outcome import Outcome

# Kept under the name ``_settle``: bench/stages.py times the ack by replacing it here.
from rabbitretry.delivery.settle import settle as _settle
from rabbitretry.delivery.transaction import AttemptTransaction
from rabbitretry.delivery.verdicts import Verdicts
from rabbitretry.downstream import DownstreamCalls, Unbroken
from rabbitretry.errors import ConnectionLost, PublishError
from rabbitretry.ledger import AttemptLedger, Claim, ClaimRequest, Key, Snapshot, missing_id_key
from rabbitretry.ledger.failures import rejection
from rabbitretry.message import headers
from rabbitretry.message.storable import storable_text

__all__ = ["Pipeline", "broker_probe"]

log = logging.getLogger("rabbitretry.worker")

REQUEUE_PAUSE = 1.0  # seconds before requeueing a delivery after an unexpected error
# A call waits for its turn under a rate limit at most this share of the attempt's timeout,
# so that the wait cannot make the attempt time out (which would charge it).
MAX_WAIT_SHARE = 0.5
# An attempt whose worker dies counts only if it was marked started, and the mark is written
# once its handler has run this many seconds: after the handler's first step, so no death can
# leave an attempt charged whose handler never ran, and never for a handler that ends sooner
# (its final write says how it ended), so most attempts cost no statement for it. A death
# within this window is forgiven, at most four times for one message (close_lapsed_attempt).
MARK_AFTER = 0.1


NO_ID = (
    "the message has no message_id property, so it cannot be deduplicated; "
    "publish with a message_id (a business key) or replay it to assign one"
)


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
        breakers: Breakers | None = None,
        hold_back: Callable[[], Awaitable[None]] | None = None,
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
        self._fields = LogFields(self.queue, worker_id)
        self.copies = Copies(publisher, self.queue, self.queue_type, self.dead_queue, self._fields)
        self.verdicts = Verdicts(
            self.ledger,
            self.queue,
            self.policy,
            self.copies,
            self._fields,
            keep_snapshot=type(consumer).keep_payload == "always",
        )
        self.breakers = breakers
        self.downstreams = type(consumer).downstreams
        self.downstream_names = [d.name for d in self.downstreams]
        self._unbroken = Unbroken(self.downstreams, type(consumer).__name__)
        self._hold_back = hold_back
        """Stops this consumer taking deliveries (its downstream's breaker is open)."""

    async def process(self, message: IncomingMessage, probe: str | None = None) -> Outcome:
        """Take one delivery to its outcome, and settle it: ack, or requeue. Never raises
        (but for a shutdown's cancellation, after requeueing). ``probe`` names the downstream
        whose half-open breaker this delivery tries."""
        received_at = datetime.now(UTC)
        try:
            if not (await self.ledger_gate.passable() and await self.broker_gate.passable()):
                return await self._requeue(message)
            if not self._admitted(probe):
                await self._held_back()
                return await self._requeue(message)
            with tracing.delivery_span(self.queue, message) as span:
                outcome = await self._process(message, probe)
                span.outcome(outcome)
        except asyncio.CancelledError:
            await _settle(message, requeue=True)
            raise
        except Exception as error:
            return await self._unsettled(message, error)
        if outcome.result == "deferred" and not self._admitted(None):
            await self._held_back()  # a breaker opened (not a rate limit's wait)
        if outcome.result in ("requeued", "deferred"):
            return self._fields.ended(log, await self._requeue(message, outcome), received_at)
        await _settle(message, requeue=False)
        return self._fields.ended(
            log,
            replace(outcome, published_at=message.timestamp, received_at=received_at),
            received_at,
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

    def _calls(self, probe: str | None) -> DownstreamCalls:
        if self.breakers is None or not self.downstreams:
            return self._unbroken  # nothing to count: the same blocks for every delivery
        max_wait = type(self.consumer).timeout * MAX_WAIT_SHARE
        return self.breakers.calls(self.downstreams, type(self.consumer).__name__, max_wait, probe)

    def _admitted(self, probe: str | None) -> bool:
        return (
            self.breakers is None
            or not self.downstream_names
            or self.breakers.admits(self.downstream_names, probe)
        )

    async def _held_back(self) -> None:
        """Stop taking deliveries before one is requeued for an open breaker: it would come
        straight back otherwise."""
        if self._hold_back is not None:
            await self._hold_back()

    async def _requeue(self, message: IncomingMessage, outcome: Outcome | None = None) -> Outcome:
        await _settle(message, requeue=True)
        return outcome or Outcome(None, "requeued")

    async def _without_id(self, message: IncomingMessage, snapshot: Snapshot) -> Outcome:
        """Dead at once: a message without a ``message_id`` cannot be deduplicated. Its key is
        its content's hash (:func:`missing_id_key`), so a redelivery (its dead copy met a
        broker blip) finds its record; a first delivery that finds the key taken is a second,
        identical message, recorded under a key of its own."""
        outcome = await self.verdicts.reject(
            Key(self.queue, missing_id_key(snapshot)), "missing-message-id", NO_ID, snapshot
        )
        if outcome.result == "dropped" and not message.redelivered:
            twin = Key(self.queue, missing_id_key(snapshot, twin=True))
            return await self.verdicts.reject(twin, "missing-message-id", NO_ID, snapshot)
        return outcome

    async def _process(self, message: IncomingMessage, probe: str | None = None) -> Outcome:
        snapshot = snapshot_of(message)
        if not message.message_id:
            return await self._without_id(message, snapshot)
        key = Key(self.queue, message.message_id)
        too_large = oversize(type(self.consumer), message.body)
        if too_large is not None:
            return await self.verdicts.reject(key, "too-large", too_large, snapshot)
        undecodable = headers.why_undecodable(message.headers)
        if undecodable is not None:
            return await self.verdicts.reject(key, "undecodable", undecodable, snapshot)

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
                return await self.verdicts.unstorable(key, snapshot, error)
            if db.is_outage(error):
                return await self._given_back(message, key, error)
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
            refused = await self.copies.publish_delayed(
                key, snapshot, claim.wait_seconds, copy_attempts
            )
            if refused is not None:
                return await self.verdicts.reject(key, "unpublishable", refused, snapshot)
            return Outcome(key, "parked", claim.attempt)
        if claim.verdict == "exhausted":
            return await self._exhausted(key, claim, snapshot)
        try:
            return await self._attempt(message, key, claim, snapshot, probe)
        except Exception as error:
            if not db.is_outage(error):
                # A bug of ours after the claim: the attempt counts (as if its handler had
                # started), so that a message that always meets it ends dead, not in a loop.
                with contextlib.suppress(Exception):
                    await self.ledger.mark_started(key, claim.attempt)
            raise
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

    async def _exhausted(self, key: Key, claim: Claim, snapshot: Snapshot) -> Outcome:
        """The claim found the budget spent (the last attempt's worker died in it, or the
        budget was lowered): the row is dead now; publish its dead letter."""
        row = await self.ledger.get(key)
        reason = row["reason"] if row and row["reason"] else "crashed"
        log.error(
            "%s: dead (%s) after %d attempts%s",
            key,
            reason,
            claim.attempt,
            ": the worker died in the last" if reason == "crashed" else "",
            extra=self._fields(key, attempt=claim.attempt, outcome="dead", reason=reason),
        )
        error_type = (row["error_type"] if row else None) or "WorkerLost"
        failure = rejection(self.queue, error_type, row["error_message"] if row else "")
        await self.copies.publish_dead(key, snapshot, reason, failure, claim.attempt)
        return Outcome(key, "dead", claim.attempt)

    async def _claim(self, request: ClaimRequest) -> Claim:
        """The claim; a shutdown that arrives meanwhile gives back a claim that landed."""
        claiming = self.ledger.claim_sent(request)
        try:
            return await claiming
        except asyncio.CancelledError:
            # The claim's future outlives the cancellation, which arrives once it is set.
            if not claiming.cancelled() and claiming.exception() is None:
                claim = claiming.result()
                if claim.verdict == "claimed":
                    with contextlib.suppress(Exception):
                        await self.ledger.interrupt(request.key, claim.attempt)
            raise

    async def _given_back(self, message: IncomingMessage, key: Key, error: Exception) -> Outcome:
        """The ledger went away with a claim on its way: the write may have committed with its
        reply lost. Once the ledger answers the claim is given back, so that the outage charges
        no attempt (an attempt without its start mark is not charged, even if this worker
        never gets to give it back)."""
        self.ledger_gate.report(error)
        if not await self.ledger_gate.passable():
            return Outcome(key, "requeued")
        await self.ledger.release_claim(key, self.worker_id)
        # The delivery is still ours: take it up again rather than requeue it, as every
        # requeue counts against a quorum queue's delivery limit.
        return await self._process(message)

    async def _attempt(
        self,
        message: IncomingMessage,
        key: Key,
        claim: Claim,
        snapshot: Snapshot,
        probe: str | None = None,
    ) -> Outcome:
        ctx = Context(
            queue=self.queue,
            message_id=key.message_id,
            attempt=claim.budget_attempt,
            max_attempts=self.policy.max_attempts,
            redelivered=bool(message.redelivered),
            headers=dict(message.headers or {}),
            x_death=headers.x_death(message.headers),
            downstream_calls=self._calls(probe),
        )
        born = await self._born(message, key)
        lease = type(self.consumer).lease
        mark = self.ledger.start_mark(key, claim.attempt, MARK_AFTER)
        async with lease_kept(self.ledger, key, claim.attempt, lease, self._fields):
            try:
                result = await run_attempt(
                    self.consumer,
                    message.body,
                    ctx,
                    born=born,
                    now=datetime.now(UTC),
                    new_transaction=lambda: AttemptTransaction(self.pool),
                    on_start=mark.arm,
                )
            finally:
                mark.cancel()
        tracing.record_attempt(ctx.attempt, ctx.max_attempts, result)
        outcome = await self.verdicts.record(key, claim, snapshot, result, self.breakers, probe)
        return replace(outcome, handler_seconds=result.handler_seconds)

    async def _born(self, message: IncomingMessage, key: Key) -> datetime | None:
        """When the message was published, else first seen; only looked up if it can expire."""
        if type(self.consumer).expires_after is None or message.timestamp is not None:
            return message.timestamp
        row = await self.ledger.get(key)
        return row["first_seen"] if row else None
