"""One attempt's run of a handler: the timeout, in-process retries and the transaction check.

Shared by the worker (``rabbitretry.processing``) and ``rabbitretry.testing``, so that a unit
test sees the same behaviour as a worker. No ledger and no broker here: the caller supplies
the attempt's transaction (``new_effects``) and records the outcome.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import pydantic

from rabbitretry.consumer import Consumer, Context
from rabbitretry.effects import Effects, TransactionRolledBack

log = logging.getLogger("rabbitretry.worker")

E = TypeVar("E", bound=Effects)


async def run_handler(
    consumer: Consumer[Any], payload: Any, ctx: Context, new_effects: Callable[[], E]
) -> E:
    """Run the handler (with in-process retries); the transaction of the try that worked.

    Each try gets a fresh transaction from ``new_effects`` and runs under the consumer's
    ``timeout``. A failed try's transaction is closed (rolled back) before the next one. The
    last try's error, or any error the policy does not retry, is raised.
    """
    consumer_type = type(consumer)
    policy = consumer_type.retry
    tries = policy.immediate_retries + 1
    for attempt_try in range(1, tries + 1):
        effects = new_effects()
        try:
            async with asyncio.timeout(consumer_type.timeout):
                await consumer.handle(payload, replace(ctx, effects=effects))
            if effects.rolled_back_by is not None:
                raise TransactionRolledBack(
                    "the handler returned normally although its transaction rolled back "
                    f"on {effects.rolled_back_by!r}; a swallowed error is not a success"
                ) from effects.rolled_back_by
            return effects
        except BaseException as error:
            await effects.close()
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
