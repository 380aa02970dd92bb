"""Recording what a delivery came to: the ledger first, then the copy that follows from it.

An attempt's verdict (succeeded, skipped, dead, retrying) is written against the claimed
attempt; a write that matches no row means the claim was lost, and the ledger says whether
another attempt owns the work. A *rejection* is dead at once, without an attempt (no
``message_id``, too large, unpublishable, content the ledger refuses); a copy of a message
already rejected is dropped. ``unpublishable`` also ends a message whose retry copy the broker
refused (its exchange missing or forbidden, no queue bound): requeued, it would meet the same
refusal on every attempt.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from rabbitretry import db
from rabbitretry.delivery.attempt import AttemptResult, failed_attempt
from rabbitretry.delivery.breakers import Breakers
from rabbitretry.delivery.copies import Copies
from rabbitretry.delivery.log_fields import LogFields
from rabbitretry.delivery.outcome import Outcome
from rabbitretry.delivery.transaction import AttemptTransaction, CommitFailed
from rabbitretry.errors import DownstreamUnavailable
from rabbitretry.ledger import AttemptLedger, Claim, Key, Snapshot
from rabbitretry.ledger.failures import Failure, message_of, rejection
from rabbitretry.message.storable import storable_text
from rabbitretry.retry import RetryPolicy

log = logging.getLogger("rabbitretry.worker")

UNSTORABLE_PREFIX = "unstorable-id:"  # the key of a message whose own id the ledger refuses


class Verdicts:
    """Writes the verdicts of one queue's deliveries to the ledger, and publishes what follows."""

    def __init__(
        self,
        ledger: AttemptLedger,
        queue: str,
        policy: RetryPolicy,
        copies: Copies,
        fields: LogFields,
        *,
        keep_snapshot: bool = False,
    ) -> None:
        self.ledger = ledger
        self.queue = queue
        self.policy = policy
        self.copies = copies
        self._fields = fields
        self.keep_snapshot = keep_snapshot
        """Whether a succeeded message keeps its snapshot (keep_payload = "always")."""

    async def record(
        self,
        key: Key,
        claim: Claim,
        snapshot: Snapshot,
        result: AttemptResult,
        breakers: Breakers | None = None,
        probe: str | None = None,
    ) -> Outcome:
        """Write the attempt's decision to the ledger, then publish what follows from it; a
        failure of one of the consumer's downstreams goes by its breaker (``probe``: the
        downstream this delivery probed)."""
        error = result.error
        if (
            breakers is not None
            and isinstance(error, DownstreamUnavailable)
            and error.downstream in breakers.downstreams
        ):
            met = Met(error, breakers, probe)
            return await self._downstream_failed(key, claim, snapshot, result, met)
        return await self._record(key, claim, snapshot, result)

    async def _downstream_failed(
        self,
        key: Key,
        claim: Claim,
        snapshot: Snapshot,
        result: AttemptResult,
        met: Met,
    ) -> Outcome:
        """While the breaker is closed, the failure is a failed attempt, recorded before it is
        counted: the trip it may cause forgives it with the others. A failure that finds the
        breaker open (or opens it at the last attempt, or is the probe's) is deferred, and so
        is a call that got no turn under a rate limit."""
        error, breakers = met.error, met.breakers
        name = error.downstream
        if not error.call_made:  # refused (open, or no turn): nothing to count
            return await self.defer(key, claim, result, name, snapshot if met.to_tail() else None)
        assert result.failure is not None
        charged = replace(result, failure=replace(result.failure, downstream=name))
        if breakers.state(name) == "closed" and result.outcome == "retrying":
            outcome = await self._record(key, claim, snapshot, charged)
            await breakers.count_failure(error, key, claim.attempt)
            return outcome
        if await breakers.count_failure(error, key, claim.attempt) == "closed":
            return await self._record(key, claim, snapshot, charged)
        return await self.defer(key, claim, result, name, snapshot if met.to_tail() else None)

    async def _record(
        self, key: Key, claim: Claim, snapshot: Snapshot, result: AttemptResult
    ) -> Outcome:
        if result.outcome == "succeeded":
            return await self._succeeded(key, claim, snapshot, result)
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
                return await self.missed(key, claim.attempt, "skip mark")
            return Outcome(key, "skipped", claim.attempt)
        assert result.failure is not None
        if result.outcome == "dead":
            reason = result.reason or ""
            if not await self.ledger.finish(
                key, claim.attempt, "dead", reason=reason, failure=result.failure
            ):
                return await self.missed(key, claim.attempt, "dead mark")
            log.error(
                "%s: dead (%s) after attempt %d: %s: %s",
                key,
                result.reason,
                claim.attempt,
                result.failure.type,
                result.failure.message,
                extra=self._fields(key, attempt=claim.attempt, outcome="dead", reason=reason),
            )
            await self.copies.publish_dead(key, snapshot, reason, result.failure, claim.attempt)
            return Outcome(key, "dead", claim.attempt)
        return await self._retrying(key, claim, snapshot, result.delay or 0.0, result.failure)

    async def _succeeded(
        self, key: Key, claim: Claim, snapshot: Snapshot, result: AttemptResult
    ) -> Outcome:
        transaction = result.transaction
        if not (isinstance(transaction, AttemptTransaction) and transaction.open):
            transaction = None  # the handler used no transaction: a grouped success mark
        in_transaction = transaction is not None
        try:
            committed = await self.ledger.succeed(
                key, claim.attempt, transaction, keep_snapshot=self.keep_snapshot
            )
        except CommitFailed as failed:
            return await self._commit_failed(key, claim, snapshot, failed)
        if not committed:
            what = (
                "success mark (its transaction rolled back)" if in_transaction else "success mark"
            )
            return await self.missed(key, claim.attempt, what)
        return Outcome(key, "succeeded", claim.attempt)

    async def _commit_failed(
        self, key: Key, claim: Claim, snapshot: Snapshot, failed: CommitFailed
    ) -> Outcome:
        """The handler's transaction could not commit: the attempt failed with the database's
        error (the claim is still ours: nothing of the transaction, the mark included, took)."""
        log.warning(
            "%s: attempt %d: the handler's transaction could not commit (%s: %s)%s",
            key,
            claim.attempt,
            type(failed.error).__name__,
            message_of(failed.error),
            "; an error caught inside ctx.transaction() had aborted it" if failed.swallowed else "",
            extra=self._fields(key, attempt=claim.attempt),
        )
        result = failed_attempt(
            self.policy, self.queue, key.message_id, claim.budget_attempt, failed.error
        )
        return await self._record(key, claim, snapshot, result)

    async def _retrying(
        self, key: Key, claim: Claim, snapshot: Snapshot, delay: float, failure: Failure
    ) -> Outcome:
        wait = await self.ledger.schedule_retry(key, claim.attempt, delay, failure)
        if wait is None:
            return await self.missed(key, claim.attempt, "retry mark")
        log.warning(
            "%s: attempt %d failed (%s: %s), retry in %.1f s",
            key,
            claim.attempt,
            failure.type,
            failure.message,
            wait,
            extra=self._fields(key, attempt=claim.attempt, outcome="retrying"),
        )
        refused = await self.copies.publish_delayed(key, snapshot, wait, claim.attempt)
        if refused is not None:
            return await self.reject(key, "unpublishable", refused, snapshot)
        await self.ledger.confirm_retry_copy(key, claim.attempt)
        return Outcome(key, "retrying", claim.attempt)

    async def missed(self, key: Key, attempt: int, what: str) -> Outcome:
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

    async def defer(
        self,
        key: Key,
        claim: Claim,
        result: AttemptResult,
        downstream: str,
        to_tail: Snapshot | None = None,
    ) -> Outcome:
        """The attempt met ``downstream`` unavailable with its breaker open (or got no turn
        under its rate limit): recorded, not counted; the delivery goes back to the queue
        where it was, or, given its snapshot (``to_tail``), a copy goes to the queue's tail."""
        assert result.failure is not None
        failure = replace(result.failure, downstream=downstream)
        if not await self.ledger.defer(key, claim.attempt, failure):
            return await self.missed(key, claim.attempt, "deferral")
        if to_tail is not None:
            refused = await self.copies.publish_delayed(key, to_tail, 0.0, claim.attempt)
            if refused is not None:
                return await self.reject(key, "unpublishable", refused, to_tail)
            await self.ledger.confirm_retry_copy(key, claim.attempt)
        log.info(
            "%s: attempt %d deferred, not counted (%s)",
            key,
            claim.attempt,
            result.error,
            extra=self._fields(key, attempt=claim.attempt, outcome="deferred"),
        )
        return Outcome(key, "deferred" if to_tail is None else "parked", claim.attempt)

    async def reject(self, key: Key, reason: str, detail: str, snapshot: Snapshot) -> Outcome:
        """Dead at once, without an attempt: recorded, and its copy put on ``Q.dead``."""
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
            return await self.unstorable(key, snapshot, error)
        if not stored:
            # A row still in flight (a retry, a claim whose lease ran out) would wait for a
            # copy the worker refuses every time: it ends dead for this reason now.
            stored = await self.ledger.refuse_in_flight(key, reason, failure)
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
        await self.copies.publish_dead(key, snapshot, reason, failure, 0)
        return Outcome(key, "dead")

    async def unstorable(self, key: Key, snapshot: Snapshot, error: Exception) -> Outcome:
        """The ledger refused this message's data: dead at once, under a key it accepts."""
        stored_key = Key(self.queue, UNSTORABLE_PREFIX + storable_text(key.message_id))
        detail = (
            f"the ledger cannot store this message ({type(error).__name__}: "
            f"{message_of(error)}); it is kept under the escaped key {stored_key.message_id!r}"
        )
        return await self.reject(stored_key, "unstorable", detail, snapshot)


@dataclass(frozen=True)
class Met:
    """A downstream's unavailability, as one delivery met it."""

    error: DownstreamUnavailable
    breakers: Breakers
    probe: str | None

    def to_tail(self) -> bool:
        """Whether its message goes to the queue's tail rather than back where it was: the
        probe's (the next probe takes the next message), and a call that got no turn while the
        breaker is closed. Each requeue counts against a quorum queue's delivery limit; a
        message requeued at every probe of a long outage would reach it."""
        name = self.error.downstream
        return self.probe == name or self.breakers.state(name) == "closed"
