"""The copies a delivery leaves behind: its snapshot, and the copies published from it.

The ledger keeps a snapshot of each delivery (body, headers, properties, where it came from).
From it the pipeline publishes a copy to the delay path (a retry, or a copy parked until its
claim can succeed) and the dead letter's copy on ``Q.dead``.

A copy the broker refuses names this message, not an outage: its exchange is missing or may not
be used, it comes back unroutable (a binding gone), or its headers cannot be carried. A refused
delay copy would leave the message nowhere but in a requeue loop, so the message ends dead
with the broker's reason (the caller records it); a refused dead-letter copy is logged once,
as the ledger's row is the dead letter. A lost connection or a nack is not a refusal: it is
raised, and the delivery requeued.
"""

from __future__ import annotations

import logging

from rabbitretry.amqp import ConfirmingPublisher, IncomingMessage, message_properties
from rabbitretry.delivery.log_fields import LogFields
from rabbitretry.errors import PublishRefused, UnpublishableError, UnroutableError
from rabbitretry.ledger import Key, Snapshot
from rabbitretry.ledger.failures import Failure
from rabbitretry.message import headers
from rabbitretry.message.storable import storable_text
from rabbitretry.topology import delays

log = logging.getLogger("rabbitretry.worker")


def snapshot_of(message: IncomingMessage) -> Snapshot:
    """What the ledger keeps of a delivery, to publish its copies from."""
    return Snapshot(
        body=message.body,
        headers=headers.without_broker_headers(message.headers),
        properties=message_properties(message),
        exchange=storable_text(message.exchange or ""),
        routing_key=storable_text(message.routing_key or ""),
    )


class Copies:
    """Publishes the copies of one queue's deliveries: to its delay path, and to ``Q.dead``."""

    def __init__(
        self,
        publisher: ConfirmingPublisher,
        queue: str,
        queue_type: str,
        dead_queue: str,
        fields: LogFields,
    ) -> None:
        self.publisher = publisher
        self.queue = queue
        self.queue_type = queue_type
        self.dead_queue = dead_queue
        self._fields = fields

    async def publish_delayed(
        self, key: Key, snapshot: Snapshot, wait: float, attempts: int
    ) -> str | None:
        """Publish a copy to the delay path; why not, if it cannot be encoded or the broker
        refused it (a lost connection or a nack raises: they are not about this message)."""
        route = delays.route(self.queue, self.queue_type, wait)
        try:
            await self.publisher.publish(
                snapshot.body,
                exchange=route.exchange,
                routing_key=route.routing_key,
                message_id=key.message_id,
                headers=headers.republished(snapshot.headers, attempts),
                properties=headers.copy_properties(snapshot.properties),
            )
        except UnpublishableError as error:
            # Content the broker cannot take back: without a copy the message would loop
            # between the ledger and the queue, so it ends dead (the caller records it).
            return f"the copy for the delay path cannot be published: {error}"
        except (PublishRefused, UnroutableError) as error:
            # Its exchange missing or forbidden, or no queue bound: requeued, it met the same
            # refusal on every attempt. Dead with the reason, replayable once the topology is
            # mended. (A lost connection or a nack is not about this message: it is raised.)
            return f"the broker refused the copy for the delay path: {error}"
        return None

    async def publish_dead(
        self, key: Key, snapshot: Snapshot, reason: str, failure: Failure, attempts: int
    ) -> None:
        """The dead letter's copy on ``Q.dead``, for people reading the queue.

        The ledger row is the dead letter (recorded and alerted before this copy is sent); a
        copy that cannot be encoded or that the broker refuses is only logged, once.
        """
        try:
            await self._publish_dead_copy(key, snapshot, reason, failure, attempts)
        except (UnpublishableError, PublishRefused, UnroutableError) as error:
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
            properties=headers.copy_properties(snapshot.properties),
        )
