"""The attempt core: parse, skip, run the handler, decide. No ledger and no broker here.

The worker's pipeline and ``rabbitretry.testing`` both run one attempt through
:func:`run_attempt`, so a unit test cannot see a decision a worker would not make. The caller
supplies the attempt's transaction (``new_transaction``), commits it with the success mark, and
records the decision.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, TypeVar

import pydantic

from rabbitretry import db
from rabbitretry.consumer import Consumer, Context, HandlerTransaction
from rabbitretry.delivery import validity
from rabbitretry.delivery.outcome import Decided
from rabbitretry.errors import Retry, TransactionRolledBack
from rabbitretry.ledger.failures import Failure, describe, rejection
from rabbitretry.retry import RetryPolicy

log = logging.getLogger("rabbitretry.worker")

T = TypeVar("T", bound=HandlerTransaction)


@dataclass(frozen=True)
class AttemptResult:
    """What one attempt decided, before anything is recorded."""

    outcome: Decided
    reason: str | None = None
    """Why dead (``invalid-payload``, ``permanent-error``, ``attempts-exhausted``…) or skipped."""
    delay: float | None = None
    """For a retry: the policy's delay in seconds."""
    error: BaseException | None = None
    failure: Failure | None = None
    transaction: HandlerTransaction | None = None
    """The succeeding try's transaction, to commit with the success mark."""
    handler_seconds: float | None = None


def oversize(consumer_type: type[Consumer[Any]], body: bytes) -> str | None:
    """Why ``body`` is refused unread for its size; None when it is within the limit."""
    limit = consumer_type.max_body_bytes
    if len(body) <= limit:
        return None
    return f"body of {len(body)} bytes is over the limit of {limit} bytes"


async def run_attempt(
    consumer: Consumer[Any],
    body: bytes,
    ctx: Context,
    *,
    born: datetime | None,
    now: datetime,
    new_transaction: Callable[[], HandlerTransaction],
    rng: random.Random | None = None,
    on_start: Callable[[], object] | None = None,
) -> AttemptResult:
    """Take one claimed attempt from the body to a decision (``ctx.attempt`` is its number).

    ``on_start`` is called right before the handler (it arms the worker's start mark).
    """
    consumer_type = type(consumer)
    started: float | None = None
    try:
        try:
            payload = consumer_type.parse(body)
        except pydantic.ValidationError as error:
            failure = rejection(ctx.queue, "invalid-payload", validation_summary(error))
            return AttemptResult("dead", "invalid-payload", error=error, failure=failure)
        skip = await validity.skip_reason(consumer, payload, ctx, born, now)
        if skip is not None:
            return AttemptResult("skipped", skip)
        if on_start is not None:
            on_start()
        started = time.monotonic()
        transaction = await run_handler(consumer, payload, ctx, new_transaction)
    except asyncio.CancelledError:
        raise  # a shutdown: the caller gives the attempt back
    except BaseException as error:
        # Anything else is a bug: in a validator (pydantic passes a KeyError through), in
        # should_skip, in the handler (even a BaseException), in the payload type itself.
        handler_seconds = None if started is None else time.monotonic() - started
        return replace(_failed(consumer_type, ctx, error, rng), handler_seconds=handler_seconds)
    return AttemptResult(
        "succeeded", transaction=transaction, handler_seconds=time.monotonic() - started
    )


def _failed(
    consumer_type: type[Consumer[Any]],
    ctx: Context,
    error: BaseException,
    rng: random.Random | None,
) -> AttemptResult:
    return failed_attempt(consumer_type.retry, ctx.queue, ctx.message_id, ctx.attempt, error, rng)


def failed_attempt(
    policy: RetryPolicy,
    queue: str,
    message_id: str,
    attempt: int,
    error: BaseException,
    rng: random.Random | None = None,
) -> AttemptResult:
    """The decision after ``attempt`` (within its budget) failed with ``error``.

    A transaction that lost a race (serialization failure, deadlock) is retried whatever the
    policy's ``retry_on`` and ``permanent_on`` say: the same work wins on another try. The
    attempts are still counted.
    """
    failure = describe(queue, error)
    judged = error
    if db.is_lost_race(error):
        judged = Retry(f"the transaction lost a race ({type(error).__name__}); tried again")
    decision = policy.decide(judged, attempt, rng)
    if decision.capped_from is not None:
        log.warning(
            "%s/%s: a retry was asked for in %r s; it waits %.1f s, the policy's bound",
            queue,
            message_id,
            decision.capped_from,
            decision.delay,
        )
    if decision.action == "dead":
        return AttemptResult("dead", decision.reason, error=error, failure=failure)
    return AttemptResult("retrying", delay=decision.delay, error=error, failure=failure)


async def run_handler(
    consumer: Consumer[Any], payload: Any, ctx: Context, new_transaction: Callable[[], T]
) -> T:
    """Run the handler (with in-process retries); the transaction of the try that worked.

    Each try gets a fresh transaction from ``new_transaction`` and runs under the consumer's
    ``timeout``. A failed try's transaction is closed (rolled back) before the next one. The
    last try's error, or any error the policy does not retry, is raised.
    """
    consumer_type = type(consumer)
    policy = consumer_type.retry
    tries = policy.immediate_retries + 1
    for attempt_try in range(1, tries + 1):
        transaction = new_transaction()
        try:
            async with asyncio.timeout(consumer_type.timeout):
                await consumer.handle(payload, replace(ctx, handler_transaction=transaction))
            if transaction.rolled_back_by is not None:
                raise TransactionRolledBack(
                    "the handler returned normally although its transaction rolled back "
                    f"on {transaction.rolled_back_by!r}; a swallowed error is not a success"
                ) from transaction.rolled_back_by
            return transaction
        except BaseException as error:
            await transaction.close()
            if (
                attempt_try == tries
                or not isinstance(error, Exception)
                or not policy.is_retryable(error)
            ):
                raise
            log.info("%s/%s: %r, retrying in-process", ctx.queue, ctx.message_id, error)
            await asyncio.sleep(policy.immediate_delay)
    raise AssertionError("unreachable: the last try returns or raises")


def validation_summary(error: pydantic.ValidationError) -> str:
    """The validation errors on one line: what an ``invalid-payload`` dead letter says."""
    problems = [
        f"{'.'.join(str(part) for part in e['loc']) or '(body)'}: {e['msg']}"
        for e in error.errors(include_url=False)
    ]
    return f"{error.error_count()} validation error(s): " + "; ".join(problems)
