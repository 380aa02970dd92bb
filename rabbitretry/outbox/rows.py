"""Publishing one outbox row, and recording a try that failed."""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Awaitable, Callable, Sequence

from rabbitretry import amqp
from rabbitretry.db import Connection, Record, query
from rabbitretry.errors import UnpublishableError

log = logging.getLogger("rabbitretry.outbox")

MAX_TRIES = 10  # tries of a row the broker refuses before it is failed for good
INITIAL_BACKOFF = 1.0  # seconds before the second try, doubling up to MAX_BACKOFF
MAX_BACKOFF = 300.0


async def publish_row(
    publisher: amqp.ConfirmingPublisher, row: Record, timeout: float = 30.0
) -> None:
    """Publish one outbox row as it was enqueued (confirmed, mandatory).

    Raises :class:`UnpublishableError`, before sending anything, for a row AMQP cannot carry
    (:func:`fail_unpublishable` records it), and :class:`PublishError` for a refusal or a loss.
    """
    await publisher.publish(
        bytes(row["payload"]),
        exchange=row["exchange"],
        routing_key=row["routing_key"],
        message_id=row["message_id"],
        headers=json.loads(row["headers"]),
        properties={"content_type": row["content_type"]},
        timeout=timeout,
    )


async def take_runs(conn: Connection, heads: list[Record], batch_size: int) -> list[list[Record]]:
    """Each head row taken, followed by the rows of its ordering key it holds back (locked,
    due, in order; ``batch_size`` shared among the keys): a key with a backlog leaves a run
    a pass rather than a row."""
    runs = [[head] for head in heads]
    keyed = {head["ordering_key"]: run for head, run in zip(heads, runs, strict=True)}
    keyed.pop(None, None)
    per_key = batch_size // max(1, len(keyed)) - 1
    if keyed and per_key > 0:
        followers = await conn.fetch(
            query("outbox_take_followers"),
            list(keyed),
            [run[0]["id"] for run in keyed.values()],
            per_key,
        )
        for row in followers:
            keyed[row["ordering_key"]].append(row)
    return runs


async def publish_run(
    publisher: amqp.ConfirmingPublisher,
    run: Sequence[Record],
    timeout: float = 30.0,
    pace: Callable[[], Awaitable[None]] | None = None,
) -> list[Exception | None]:
    """Publish the rows of one ordering key in order, each once the one before it is
    confirmed (and ``pace`` let it go, if given); the outcome of each row tried (None:
    confirmed).

    The first row not confirmed ends the run, and the rows after it stay pending, untried: it
    is tried again first, and none may overtake it. A row AMQP cannot carry does not end it,
    as it fails at once and holds nothing back.
    """
    outcomes: list[Exception | None] = []
    for row in run:
        if pace is not None:
            await pace()
        try:
            await publish_row(publisher, row, timeout)
        except UnpublishableError as error:
            outcomes.append(error)
        except Exception as error:
            outcomes.append(error)
            break
        else:
            outcomes.append(None)
    return outcomes


async def failed_try(
    conn: Connection,
    row: Record,
    reason: str,
    *,
    max_tries: int = MAX_TRIES,
    initial_backoff: float = INITIAL_BACKOFF,
    max_backoff: float = MAX_BACKOFF,
) -> tuple[int, float]:
    """Count a failed try of ``row``: due again after a jittered, doubling backoff, or
    ``failed`` once it had ``max_tries``. Its number of tries, and the backoff."""
    tries = row["tries"] + 1
    backoff = min(max_backoff, initial_backoff * 2 ** min(tries - 1, 30))
    backoff *= random.uniform(0.8, 1.2)
    await conn.execute(query("outbox_failed_try"), row["id"], reason, max_tries, backoff)
    return tries, backoff


async def fail_unpublishable(conn: Connection, row: Record, error: UnpublishableError) -> None:
    """Mark a row ``failed`` at once, with the reason: an encoding error is the content's
    fault, so backing off and trying again could never succeed."""
    await conn.execute(query("outbox_unpublishable"), row["id"], str(error))
    log.error(
        "outbox row %s (%.60s) cannot be published, marked failed: %s",
        row["id"],
        row["message_id"],
        error,
    )
