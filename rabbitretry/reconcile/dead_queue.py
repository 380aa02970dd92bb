"""The broker's own dead letters: whatever reaches ``Q.dead`` without a ledger row is recorded.

rabbitretry writes a ``dead`` ledger row before it publishes a dead letter's copy to ``Q.dead``.
The broker can put messages there behind its back: a quorum queue's delivery limit, a policy
(``x-message-ttl``, ``max-length``), a rejection, an operator's shovel or a hand-made publish.
Such a message has no ledger row, so ``dead list``, the alerts and replay would never see it.
Once per reconciler run, :func:`scan` walks each dead-letter queue and records each one as dead
with reason ``dead-lettered-by-broker``: its body, its headers (``x-death`` included, as the
evidence; stored as :mod:`rabbitretry.message.storable` does for every message) and its properties.

How the queue is walked (``docs/reconciler.md`` gives the reasons):

1. Take a message with ``basic.get`` and manual ack; keep it unacked while it is handled.
2. Its key is ``(work queue, message_id)``; a message without ``message_id`` gets its
   content's hash, ``missing-id:<hash>``, so that a message a lost connection put back after it
   was recorded finds its row (an identical message seen for the first time gets a key of its
   own, ``missing-id:<hash>-<random>``). Insert a ``dead`` row unless the ledger has the key
   already (any row: a terminal one means the copy is already recorded; a ``retrying`` or
   ``processing`` one means the message is still in flight and the ledger, not the broker,
   decides its fate), or unless the message carries ``x-rabbitretry-reason``: rabbitretry put
   that copy there after recording its death, so a missing row means it was replayed,
   finished and pruned since.
3. Publish the message back to the tail of the same queue, with confirms, then ack the original.
   A copy just recorded carries rabbitretry's dead-letter headers (reason, queue, error) and,
   for an id-less message, its generated ``message_id``; any other copy goes back unchanged.

So the queue is rotated, never drained: at every moment each message is on the queue (or on it
twice, between the confirm and the ack), and nothing is ever returned to it with a requeue,
which on RabbitMQ 4.x would count against the quorum dead-letter queue's own delivery limit and
drop the message past it. Each run takes at most ``limit`` messages per queue and never more
than the queue held when it started, so one run never visits a message twice; a deep queue is
covered over several runs. Several reconcilers may run at once: the broker hands each message
to one of them, and the insert ignores keys that already have a row.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rabbitretry import amqp
from rabbitretry.consumer import Consumer
from rabbitretry.db import Executor, query
from rabbitretry.errors import ConnectionLost, PublishError, UnpublishableError
from rabbitretry.ledger import Snapshot, missing_id_key, repairs
from rabbitretry.ledger.failures import Failure, rejection
from rabbitretry.message import headers
from rabbitretry.message.storable import storable_text
from rabbitretry.retry import RetryPolicy
from rabbitretry.topology import names

log = logging.getLogger("rabbitretry.reconcile.reconciler")  # one logger for every step

REASON = "dead-lettered-by-broker"


@dataclass(frozen=True)
class DeadQueue:
    """A work queue and the dead-letter queue its broker-side dead letters land in."""

    queue: str
    dead_queue: str
    max_attempts: int


@dataclass(frozen=True)
class Found:
    """A message taken off a dead-letter queue, held unacked until its copy is back."""

    message: amqp.IncomingMessage
    message_id: str
    """The ledger key: the message's id (NULs spelled out), or its content's ``missing-id:``
    hash (:func:`rabbitretry.ledger.missing_id_key`)."""
    recorded_before: bool
    """The copy carries rabbitretry's dead-letter headers: its death was recorded when it was
    published (a row missing now was replayed, finished and pruned since): never recorded."""
    stored_headers: dict[str, Any]
    stored_properties: dict[str, Any]
    exchange: str
    routing_key: str
    failure: Failure

    @property
    def first_without_id(self) -> bool:
        """A message without an id that nobody took before: a first delivery, so a record
        already under its key is an identical message's, never its own."""
        return not self.message.message_id and not self.message.redelivered

    def as_twin(self) -> Found:
        """The same message under a key of its own (a twin's key was taken)."""
        return replace(self, message_id=missing_id_key(self.snapshot(), twin=True))

    def snapshot(self) -> Snapshot:
        return Snapshot(
            self.message.body,
            self.stored_headers,
            self.stored_properties,
            self.exchange,
            self.routing_key,
        )


async def scan(
    ledger: Executor,
    connection: amqp.Connection | None,
    publisher: amqp.ConfirmingPublisher,
    consumers: Sequence[type[Consumer[Any]]],
    *,
    limit: int,
    batch_size: int,
    errors: list[str],
) -> int:
    """Record what the broker dead-lettered behind the ledger's back; how many were recorded.

    Covers the dead-letter queue of every consumer given (custom ``dead_queue`` names need the
    consumer) and ``Q.dead`` of every other queue the ledger knows. A dead-letter queue that
    does not exist is skipped. A copy the broker refuses is noted in ``errors``.
    """
    if connection is None:
        raise RuntimeError("the reconciler is not connected")
    recorded = 0
    for target in await dead_queues(ledger, consumers):
        recorded += await _scan_queue(
            ledger, connection, publisher, target, limit=limit, batch_size=batch_size, errors=errors
        )
    return recorded


async def dead_queues(
    ledger: Executor, consumers: Sequence[type[Consumer[Any]]]
) -> list[DeadQueue]:
    """The consumers' dead-letter queues, then ``Q.dead`` of every other queue in the ledger."""
    by_queue: dict[str, DeadQueue] = {}
    for consumer in consumers:
        work = consumer.work_queue()
        by_queue[work.name] = DeadQueue(
            work.name, work.dead_queue_name, consumer.retry.max_attempts
        )
    default_attempts = RetryPolicy().max_attempts
    for row in await ledger.fetch(query("dead_queue_ledger_queues")):
        queue = row["queue"]
        by_queue.setdefault(queue, DeadQueue(queue, names.dead_queue(queue), default_attempts))
    return list(by_queue.values())


async def _scan_queue(
    ledger: Executor,
    connection: amqp.Connection,
    publisher: amqp.ConfirmingPublisher,
    target: DeadQueue,
    *,
    limit: int,
    batch_size: int,
    errors: list[str],
) -> int:
    recorded = 0
    # A plain channel: a 404 for a missing queue closes it, and messages still unacked when it
    # closes (a failed run) go back to the queue.
    async with amqp.Prober(connection) as prober:
        declared: list[Any] = []

        async def passive(channel: amqp.Channel) -> None:
            declared.append(await channel.declare_queue(target.dead_queue, passive=True))

        outcome, _ = await prober.attempt(passive)
        if outcome != "ok":
            log.debug("%s: no dead-letter queue %r to scan", target.queue, target.dead_queue)
            return 0
        queue = declared[0]
        remaining = min(limit, int(queue.declaration_result.message_count or 0))
        while remaining > 0:
            wanted = min(batch_size, remaining)
            batch: list[Found] = []
            while len(batch) < wanted:
                message = await queue.get(no_ack=False, fail=False)
                if message is None:
                    break
                batch.append(found(message, target))
            remaining = remaining - wanted if len(batch) == wanted else 0  # 0: queue empty
            if not batch:
                break
            batch, inserted = await _record(ledger, target, _twins_apart(batch))
            recorded += len(inserted)
            if not await _rotate(publisher, target, batch, inserted, errors):
                break
    return recorded


def _twins_apart(batch: list[Found]) -> list[Found]:
    """Identical first deliveries without an id in one batch are two messages: keys apart."""
    seen: set[str] = set()
    apart = []
    for item in batch:
        if item.message_id in seen and item.first_without_id:
            item = item.as_twin()
        seen.add(item.message_id)
        apart.append(item)
    return apart


async def _record(
    ledger: Executor, target: DeadQueue, batch: list[Found]
) -> tuple[list[Found], set[str]]:
    """Record the batch's messages the ledger has no row for; the batch (twins keyed apart)
    and the keys inserted. A first delivery without an id whose key was taken is a second,
    identical message: recorded under a key of its own. A redelivered one is the message a
    lost connection put back after it was recorded: left as it is."""
    inserted = await _insert(ledger, target, [f for f in batch if not f.recorded_before])
    twins = {
        index: item.as_twin()
        for index, item in enumerate(batch)
        if item.first_without_id and not item.recorded_before and item.message_id not in inserted
    }
    if twins:
        inserted |= await _insert(ledger, target, list(twins.values()))
        batch = [twins.get(index, item) for index, item in enumerate(batch)]
    return batch, inserted


async def _insert(ledger: Executor, target: DeadQueue, batch: list[Found]) -> set[str]:
    if not batch:
        return set()
    inserted = await repairs.record_broker_dead(
        ledger,
        target.queue,
        [
            repairs.BrokerDeadLetter(
                message_id=f.message_id,
                payload=f.message.body,
                headers=f.stored_headers,
                properties=f.stored_properties,
                exchange=f.exchange,
                routing_key=f.routing_key,
                failure=f.failure,
            )
            for f in batch
        ],
        max_attempts=target.max_attempts,
        reason=REASON,
    )
    for item in batch:
        if item.message_id in inserted:
            log.warning(
                "%s/%s: recorded dead (%s) from %s: %s",
                target.queue,
                item.message_id,
                REASON,
                target.dead_queue,
                item.failure.message,
            )
    return inserted


async def _rotate(
    publisher: amqp.ConfirmingPublisher,
    target: DeadQueue,
    batch: list[Found],
    inserted: set[str],
    errors: list[str],
) -> bool:
    """Put each message back at the tail (confirmed), then ack it; False if the broker refused."""
    for item in batch:
        message = item.message
        copy_headers = headers.kept_dead(message.headers)
        if item.message_id in inserted:
            copy_headers |= headers.death(
                queue=target.queue, reason=REASON, error_type=REASON, error=item.failure.message
            )
        properties = headers.copy_properties(amqp.message_properties(message))
        if message.reply_to:
            properties["reply_to"] = message.reply_to
        try:
            await publisher.publish(
                message.body,
                routing_key=target.dead_queue,
                message_id=message.message_id or item.message_id,
                headers=copy_headers,
                properties=properties,
            )
        except ConnectionLost:
            raise  # the unacked messages go back to the queue with their channel
        except (PublishError, UnpublishableError) as error:
            errors.append(f"{target.dead_queue}: putting back {item.message_id} failed: {error}")
            log.error("%s: putting back %s failed: %s", target.dead_queue, item.message_id, error)
            return False
        await message.ack()
    return True


def found(message: amqp.IncomingMessage, target: DeadQueue) -> Found:
    """What the ledger stores of a message found on ``target``'s dead-letter queue, under
    its id (NULs spelled out), or when it has none, its content's hash."""
    raw_headers = _without_delivery_count(message.headers)
    deaths = headers.x_death(raw_headers)
    exchange, routing_key = message.exchange or "", message.routing_key or ""
    if deaths:
        exchange = str(deaths[0].get("exchange", exchange))
        keys = deaths[0].get("routing-keys")
        if isinstance(keys, list) and keys:
            routing_key = str(keys[0])
    item = Found(
        message=message,
        message_id=storable_text(message.message_id or ""),
        recorded_before=headers.REASON in raw_headers,
        stored_headers=raw_headers,
        stored_properties=amqp.message_properties(message),
        exchange=storable_text(exchange),
        routing_key=storable_text(routing_key),
        failure=rejection(target.queue, REASON, explain(deaths, target.dead_queue)),
    )
    return item if message.message_id else replace(item, message_id=missing_id_key(item.snapshot()))


def explain(deaths: list[dict[str, Any]], dead_queue: str) -> str:
    """Why the message is dead, from its latest ``x-death`` entry (numbers and names vary,
    so the error fingerprint groups these by the broker's reason)."""
    if not deaths:
        return (
            f"found on {dead_queue!r} with no ledger record and no x-death header "
            "(put there by a shovel, another application or by hand)"
        )
    death = deaths[0]
    return (
        f"RabbitMQ dead-lettered it from {str(death.get('queue', '?'))!r}, "
        f"reason {death.get('reason', 'unknown')}, count {death.get('count', '?')}, "
        "with no ledger record"
    )


def _without_delivery_count(raw: Mapping[str, Any] | None) -> dict[str, Any]:
    """The headers, less the count a quorum dead-letter queue adds to its own deliveries."""
    return {key: value for key, value in (raw or {}).items() if key != "x-delivery-count"}
