"""Running a consumer's recover hook (``on_dead``) as a message of its own.

A run waits in ``<queue>.recover`` (the ledger's trigger queued it, through the outbox, in
the transaction that made the message dead). The worker consumes that queue with a consumer
made here for each consumer that has a hook: the run is claimed, counted, retried with
backoff and committed like any delivery, and calls the hook of the worker's own instance of
the consumer, with the dead message and what killed it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pydantic

from rabbitretry import db
from rabbitretry.consumer import Consumer, Context, Death
from rabbitretry.ledger import recover_hooks

log = logging.getLogger("rabbitretry.worker")

RECOVER_OF = "x-rabbitretry-recover-of"


def recovery_consumer(owner: Consumer[Any]) -> type[Consumer[Any]]:
    """The consumer of ``owner``'s recover queue, calling ``owner.on_dead``."""
    owner_type = type(owner)
    work_queue = owner_type.recover_queue()

    class Recover(Consumer[bytes]):
        queue = work_queue.name
        queue_type = owner_type.queue_type
        delivery_limit = owner_type.delivery_limit
        retry = owner_type.recover_retry or owner_type.retry
        timeout = owner_type.timeout
        lease = owner_type.lease
        database_url = owner_type.database_url
        downstreams = owner_type.downstreams  # its compensations may call them too
        max_body_bytes = max(owner_type.max_body_bytes, 1)
        # A run's headers name the dead message it answers (dead show and the console find
        # the run through them), so a succeeded run keeps its snapshot: one row per death.
        keep_payload = "always"

        @classmethod
        def parse(cls, body: bytes) -> bytes:
            return body  # the dead message's body, validated (or not) below

        async def handle(self, msg: bytes, ctx: Context) -> None:
            death = death_of(owner_type.queue, ctx.headers)
            await owner.on_dead(_payload(owner_type, msg), ctx, death)

    Recover.__name__ = Recover.__qualname__ = f"{owner_type.__name__}.on_dead"
    return Recover


def _payload(owner_type: type[Consumer[Any]], body: bytes) -> Any:
    try:
        return owner_type.parse(body)
    except pydantic.ValidationError:
        return None  # it died of its body (invalid-payload): the hook gets the death alone


def death_of(queue: str, headers: Mapping[str, Any]) -> Death:
    """What killed the message, from the headers its hook's run was queued with."""

    def text(name: str) -> str:
        value = headers.get(name)
        return value if isinstance(value, str) else ""

    attempts = headers.get("x-rabbitretry-dead-attempts")
    return Death(
        queue=queue,
        message_id=text(RECOVER_OF),
        reason=text("x-rabbitretry-dead-reason"),
        error_type=text("x-rabbitretry-dead-error-type"),
        error_message=text("x-rabbitretry-dead-error"),
        attempts=attempts if isinstance(attempts, int) and not isinstance(attempts, bool) else 0,
    )


async def recovery_consumers(
    instances: Sequence[Consumer[Any]], pools: dict[str | None, db.Pool]
) -> list[Consumer[Any]]:
    """Record which queues have a recover hook (their dead messages get a run of it), and the
    consumers of the runs, one per hook."""
    hooks = []
    for instance in instances:
        consumer_type = type(instance)
        wanted = consumer_type.recover_queue().name if consumer_type.has_recover_hook() else None
        await _registered(pools[consumer_type.database_url], consumer_type.queue, wanted)
        if wanted is not None:
            hooks.append(recovery_consumer(instance)())
    return hooks


async def _registered(pool: db.Pool, queue: str, wanted: str | None) -> None:
    """Make the registry say ``wanted`` for ``queue``, writing only if it says otherwise. A
    ledger that refuses the write (a read-only standby) is logged, not fatal: the worker
    still consumes, and the next start records it."""
    async with pool.acquire() as conn:
        if await recover_hooks.registered(conn, queue) == wanted:
            return
        try:
            if wanted is None:
                await recover_hooks.unregister(conn, queue)
            else:
                await recover_hooks.register(conn, queue, wanted)
        except Exception as error:
            if not db.is_outage(error):
                raise
            log.warning(
                "%s: its recover hook could not be %s (%s): dead messages %s",
                queue,
                "recorded" if wanted else "removed",
                error,
                "get no run until a worker records it" if wanted else "still get a run",
            )
