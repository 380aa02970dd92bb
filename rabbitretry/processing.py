"""One delivery through the pipeline: identify, claim, validate, handle, record, then ack.

The ledger is written before the broker is told anything, so a crash at any point leaves a
row that says what must happen next. A copy is acked only once the ledger (and, for retries
and dead letters, the broker's confirm of the successor copy) makes it redundant; when the
ledger or the broker is unreachable the delivery is requeued instead, after a pause.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import pydantic

from rabbitretry import batching, ledger, naming, validity
from rabbitretry.amqp import (
    CHANNEL_ERRORS,
    ConfirmingPublisher,
    IncomingMessage,
    message_properties,
    without_broker_headers,
)
from rabbitretry.consumer import Consumer, Context
from rabbitretry.db import UNAVAILABLE, Connection, Pool
from rabbitretry.effects import AttemptTransaction
from rabbitretry.errors import PublishError
from rabbitretry.failure import Failure, describe, rejection
from rabbitretry.handling import run_handler, validation_summary
from rabbitretry.ledger import Claim, Key, Snapshot

log = logging.getLogger("rabbitretry.worker")

ATTEMPTS_HEADER = "x-rabbitretry-attempts"
REQUEUE_PAUSE = 1.0  # seconds before requeueing a delivery we could not settle


@dataclass(frozen=True)
class Outcome:
    """What became of one delivery, for logs, metrics and tests."""

    key: Key | None
    result: str  # succeeded, retrying, dead, skipped, dropped, parked, interrupted, requeued
    attempt: int = 0
    handler_seconds: float | None = None  # None when the handler did not run
    published_at: datetime | None = None  # the message's timestamp property, when set
    received_at: datetime | None = None  # when this delivery reached the worker


class Processor:
    """Takes deliveries of one consumer's queue through the pipeline."""

    def __init__(
        self,
        consumer: Consumer[Any],
        pool: Pool,
        publisher: ConfirmingPublisher,
        worker_id: str,
    ) -> None:
        self.consumer = consumer
        self.pool = pool
        self.publisher = publisher
        self.worker_id = worker_id
        work_queue = type(consumer).work_queue()
        self.queue = work_queue.name
        self.dead_queue = work_queue.dead_queue_name
        self.ladder = work_queue.ladder
        self.policy = type(consumer).retry
        self.commits = batching.commits_for(pool)

    async def process(self, message: IncomingMessage) -> Outcome:
        received_at = datetime.now(UTC)
        try:
            outcome = await self._process(message)
        except asyncio.CancelledError:
            await _settle(message, requeue=True)
            raise
        except UNAVAILABLE as error:
            log.error("%s: the ledger is unreachable (%s); message requeued", self.queue, error)
            return await self._requeue(message)
        except PublishError as error:
            log.error("%s: %s; message requeued, the ledger keeps its state", self.queue, error)
            return await self._requeue(message)
        await _settle(message, requeue=False)
        return replace(outcome, published_at=message.timestamp, received_at=received_at)

    async def _requeue(self, message: IncomingMessage) -> Outcome:
        await asyncio.sleep(REQUEUE_PAUSE)
        await _settle(message, requeue=True)
        return Outcome(None, "requeued")

    async def _process(self, message: IncomingMessage) -> Outcome:
        snapshot = _snapshot(message)
        if not message.message_id:
            return await self._reject(
                Key(self.queue, f"missing-id:{hashlib.sha256(message.body).hexdigest()[:20]}"),
                "missing-message-id",
                "the message has no message_id property, so it cannot be deduplicated; "
                "publish with a message_id (a business key) or replay it to assign one",
                snapshot,
            )
        key = Key(self.queue, message.message_id)
        size_limit = type(self.consumer).max_body_bytes
        if len(message.body) > size_limit:
            return await self._reject(
                key,
                "too-large",
                f"body of {len(message.body)} bytes is over the limit of {size_limit} bytes",
                snapshot,
            )

        copy_attempts = _int_header(message, ATTEMPTS_HEADER)
        claim = await self.commits.claims.submit(
            batching.ClaimRequest(
                key,
                max_attempts=self.policy.max_attempts,
                lease_seconds=type(self.consumer).lease,
                worker=self.worker_id,
                copy_attempts=copy_attempts,
                snapshot=snapshot,
            )
        )
        if claim.verdict in ("finished", "stale"):
            log.debug("%s: %s copy dropped (%s)", key, claim.verdict, claim.status)
            return Outcome(key, "dropped", claim.attempt)
        if claim.verdict in ("busy", "not-due"):
            # Hold the copy in the delay ladder until the claim can succeed.
            await self._publish_delayed(key, snapshot, claim.wait_seconds, copy_attempts)
            return Outcome(key, "parked", claim.attempt)
        if claim.verdict == "exhausted":
            log.error("%s: dead after %d attempts: the worker died in the last", key, claim.attempt)
            row = await ledger.get(self.pool, key)
            failure = rejection(self.queue, "WorkerLost", row["error_message"] if row else "")
            await self._publish_dead(key, snapshot, "crashed", failure, claim.attempt)
            return Outcome(key, "dead", claim.attempt)
        return await self._attempt(message, key, claim, snapshot)

    async def _attempt(
        self, message: IncomingMessage, key: Key, claim: Claim, snapshot: Snapshot
    ) -> Outcome:
        try:
            payload = type(self.consumer).parse(message.body)
        except pydantic.ValidationError as error:
            failure = rejection(self.queue, "invalid-payload", validation_summary(error))
            await self._dead(key, claim.attempt, "invalid-payload", failure, snapshot)
            return Outcome(key, "dead", claim.attempt)

        ctx = Context(
            queue=self.queue,
            message_id=key.message_id,
            attempt=claim.budget_attempt,
            max_attempts=self.policy.max_attempts,
            redelivered=bool(message.redelivered),
            headers=dict(message.headers or {}),
            x_death=_x_death(message),
        )
        born = await self._born(message, key)
        try:
            skip = await validity.skip_reason(self.consumer, payload, ctx, born, datetime.now(UTC))
        except Exception as error:
            return await self._failed(key, claim, error, snapshot)
        if skip is not None:
            log.info("%s: skipped (%s), the handler is not called", key, skip)
            await ledger.finish(self.pool, key, claim.attempt, "skipped", reason=skip)
            return Outcome(key, "skipped", claim.attempt)
        started = time.monotonic()
        try:
            async with self._lease_kept(key, claim.attempt):
                effects = await self._run_handler(payload, ctx)
        except asyncio.CancelledError:
            await asyncio.shield(ledger.interrupt(self.pool, key, claim.attempt))
            log.warning("%s: attempt %d interrupted by shutdown, requeued", key, claim.attempt)
            raise
        except Exception as error:
            handler_seconds = time.monotonic() - started
            outcome = await self._failed(key, claim, error, snapshot)
            return replace(outcome, handler_seconds=handler_seconds)
        handler_seconds = time.monotonic() - started

        async def mark_succeeded(conn: Connection | Pool) -> bool:
            return await ledger.finish(conn, key, claim.attempt, "succeeded")

        committed = (
            await effects.commit_with(mark_succeeded)
            if effects.open
            else await self.commits.successes.submit(batching.SuccessRequest(key, claim.attempt))
        )
        if not committed:
            log.warning(
                "%s: attempt %d finished after losing its claim to another attempt%s",
                key,
                claim.attempt,
                "; its transaction was rolled back" if effects.open else "",
            )
            return Outcome(key, "dropped", claim.attempt)
        return Outcome(key, "succeeded", claim.attempt, handler_seconds)

    async def _born(self, message: IncomingMessage, key: Key) -> datetime | None:
        """When the message was published, else first seen; only looked up if it can expire."""
        if type(self.consumer).expires_after is None or message.timestamp is not None:
            return message.timestamp
        row = await ledger.get(self.pool, key)
        return row["first_seen"] if row else None

    async def _run_handler(self, payload: Any, ctx: Context) -> AttemptTransaction:
        """Run the handler (with in-process retries); the transaction of the try that worked."""
        return await run_handler(self.consumer, payload, ctx, lambda: AttemptTransaction(self.pool))

    async def _failed(
        self, key: Key, claim: Claim, error: Exception, snapshot: Snapshot
    ) -> Outcome:
        failure = describe(self.queue, error)
        decision = self.policy.decide(error, claim.budget_attempt)
        if decision.action == "dead":
            log.error(
                "%s: dead (%s) after attempt %d: %s: %s",
                key,
                decision.reason,
                claim.attempt,
                failure.type,
                failure.message,
            )
            await self._dead(key, claim.attempt, decision.reason, failure, snapshot)
            return Outcome(key, "dead", claim.attempt)

        wait = await ledger.schedule_retry(self.pool, key, claim.attempt, decision.delay, failure)
        if wait is None:
            log.warning("%s: attempt %d failed after losing its lease", key, claim.attempt)
            return Outcome(key, "dropped", claim.attempt)
        log.warning(
            "%s: attempt %d failed (%s: %s), retry in %.1f s",
            key,
            claim.attempt,
            failure.type,
            failure.message,
            wait,
        )
        await self._publish_delayed(key, snapshot, wait, claim.attempt)
        await ledger.confirm_retry_copy(self.pool, key, claim.attempt)
        return Outcome(key, "retrying", claim.attempt)

    async def _dead(
        self, key: Key, attempt: int, reason: str, failure: Failure, snapshot: Snapshot
    ) -> None:
        if await ledger.finish(self.pool, key, attempt, "dead", reason=reason, failure=failure):
            await self._publish_dead(key, snapshot, reason, failure, attempt)

    async def _reject(
        self,
        key: Key,
        reason: str,
        detail: str,
        snapshot: Snapshot,
    ) -> Outcome:
        failure = rejection(self.queue, reason, detail)
        log.error("%s: dead on arrival (%s): %s", key, reason, detail)
        stored = await ledger.record_rejected(
            self.pool,
            key,
            max_attempts=self.policy.max_attempts,
            reason=reason,
            failure=failure,
            snapshot=snapshot,
        )
        if stored:
            await self._publish_dead(key, snapshot, reason, failure, 0)
        return Outcome(key, "dead")

    async def _publish_delayed(
        self, key: Key, snapshot: Snapshot, wait: float, attempts: int
    ) -> None:
        rung = naming.choose_rung(self.ladder, wait)
        await self.publisher.publish(
            snapshot.body,
            routing_key=naming.delay_queue(self.queue, rung),
            message_id=key.message_id,
            headers={**without_broker_headers(snapshot.headers), ATTEMPTS_HEADER: attempts},
            properties=snapshot.properties,
        )

    async def _publish_dead(
        self, key: Key, snapshot: Snapshot, reason: str, failure: Failure, attempts: int
    ) -> None:
        headers = {
            **without_broker_headers(snapshot.headers),
            ATTEMPTS_HEADER: attempts,
            "x-rabbitretry-queue": self.queue,
            "x-rabbitretry-reason": reason,
            "x-rabbitretry-error-type": failure.type,
            "x-rabbitretry-error": failure.message[:500],
        }
        await self.publisher.publish(
            snapshot.body,
            routing_key=self.dead_queue,
            message_id=key.message_id,
            headers=headers,
            properties=snapshot.properties,
        )

    @contextlib.asynccontextmanager
    async def _lease_kept(self, key: Key, attempt: int) -> AsyncIterator[None]:
        """Renew the claim's lease every third of its length while the handler runs."""
        lease = type(self.consumer).lease

        async def renew() -> None:
            while True:
                await asyncio.sleep(lease / 3)
                try:
                    if not await ledger.renew_lease(self.pool, key, attempt, lease):
                        log.warning("%s: attempt %d lost its lease", key, attempt)
                        return
                except UNAVAILABLE as error:
                    log.warning("%s: lease renewal failed (%s), will try again", key, error)

        renewer = asyncio.create_task(renew())
        try:
            yield
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer


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
        )


def _snapshot(message: IncomingMessage) -> Snapshot:
    return Snapshot(
        body=message.body,
        headers=without_broker_headers(message.headers),
        properties=message_properties(message),
        exchange=message.exchange or "",
        routing_key=message.routing_key or "",
    )


def _int_header(message: IncomingMessage, name: str) -> int:
    value = (message.headers or {}).get(name)
    if isinstance(value, int):
        return value
    try:
        return int(str(value)) if value is not None else 0
    except ValueError:
        return 0


def _x_death(message: IncomingMessage) -> list[dict[str, Any]]:
    value = (message.headers or {}).get("x-death")
    return (
        [dict(entry) for entry in value if isinstance(entry, dict)]
        if isinstance(value, list)
        else []
    )
