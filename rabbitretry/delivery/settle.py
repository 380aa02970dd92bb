"""Settling a delivery: ack it, or requeue it, on whatever state its channel is in."""

from __future__ import annotations

import logging

from rabbitretry.amqp import CHANNEL_ERRORS, IncomingMessage, error_text

log = logging.getLogger("rabbitretry.worker")


async def settle(message: IncomingMessage, *, requeue: bool) -> None:
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
            error_text(error),
            extra={"message_id": message.message_id},
        )
