"""Re-driving ledger rows whose broker copy was lost: overdue retries and expired leases.

A ``retrying`` row overdue by more than ``grace`` seconds lost its delay copy; a ``processing``
row whose lease ran out ``grace`` seconds ago lost its worker and then its delivery (a delivery
that survives re-claims the row by itself, sooner). Each is re-published from the ledger's
snapshot to its work queue through the default exchange under the same ``message_id`` (broker
headers stripped, attempts header set), with confirms and ``mandatory``; a copy that arrives
twice is dropped by the claim, so a re-drive never runs a handler twice. Work past its
consumer's ``expires_after`` is finished ``skipped`` instead, and a snapshot over its
consumer's ``max_body_bytes`` is finished ``dead`` (reason ``too-large``): never published.

A re-drive the broker refuses fails that row alone, reported, and the run goes on: one that
cannot be carried (a header table too large for a frame) is finished ``dead``, reason
``unpublishable``, as the worker ends a copy it cannot publish; one refused for the topology
(its work queue gone: the copy comes back unroutable) stays marked and is tried again after
the grace period, reported on each pass until the queue is back. A lost connection ends the
step: every next publish would fail too.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime

from rabbitretry import ledger
from rabbitretry.db import Executor, Record
from rabbitretry.delivery import validity
from rabbitretry.errors import ConnectionLost, PublishError, UnpublishableError
from rabbitretry.ledger import repairs
from rabbitretry.ledger.failures import rejection
from rabbitretry.message import headers
from rabbitretry.reconcile.run import Run

log = logging.getLogger("rabbitretry.reconcile.reconciler")  # one logger for every step

TOO_LARGE = "too-large"  # the reason the worker records for the same refusal
UNPUBLISHABLE = "unpublishable"  # the worker's reason for a copy it cannot publish

Scan = Callable[[Executor, float, int], Awaitable[list[Record]]]
"""Takes and marks a batch of lost rows, ``(ledger, grace, limit)``: ``repairs.take_*``."""


async def redrive(
    run: Run,
    scan: Scan,
    expiry: Mapping[str, float],
    body_limits: Mapping[str, int] | None = None,
) -> int:
    """Take marked batches of ``scan`` and publish (or skip) each row; how many published.

    ``expiry`` maps a queue to its consumer's ``expires_after``, ``body_limits`` to its
    ``max_body_bytes``: a snapshot over it is recorded dead, never published.
    """
    published = 0
    for _ in range(run.max_batches):
        rows = await scan(run.ledger, run.grace, run.batch_size)
        for row in rows:
            if await _skip_if_expired(run, row, expiry):
                run.report.expired_skipped += 1
            elif await _dead_if_too_large(run, row, body_limits or {}):
                pass  # the worker would refuse it: re-driving it would loop for ever
            elif await _publish_row(run, row):
                published += 1
        if len(rows) < run.batch_size:
            break
    return published


async def _skip_if_expired(run: Run, row: Record, expiry: Mapping[str, float]) -> bool:
    expires_after = expiry.get(row["queue"])
    if expires_after is None:
        return False
    if not validity.is_expired(expires_after, _born(row), datetime.now(UTC)):
        return False
    key = ledger.Key(row["queue"], row["message_id"])
    skipped = await repairs.skip_expired(run.ledger, key, validity.EXPIRED)
    if skipped:
        log.info("%s/%s: expired, marked skipped", row["queue"], row["message_id"])
    return skipped


async def _dead_if_too_large(run: Run, row: Record, body_limits: Mapping[str, int]) -> bool:
    """Record dead (reason ``too-large``) a row whose snapshot is over its consumer's
    ``max_body_bytes``, as the worker would refuse every copy; True (never publish it) when
    the snapshot is over the limit, whether or not the row was still in flight."""
    limit = body_limits.get(row["queue"])
    size = len(row["payload"])
    if limit is None or size <= limit:
        return False
    detail = f"body of {size} bytes is over the limit of {limit} bytes"  # as the worker says
    failure = rejection(row["queue"], TOO_LARGE, detail)
    key = ledger.Key(row["queue"], row["message_id"])
    if await repairs.refuse_in_flight(run.ledger, key, TOO_LARGE, failure):
        log.error("%s: dead (%s), not re-driven: %s", key, TOO_LARGE, detail)
    return True  # a row that moved on meanwhile (a live claim) is its owner's to settle


async def _publish_row(run: Run, row: Record) -> bool:
    """Re-publish a row's snapshot to its work queue; False (and recorded) on a refusal."""
    snapshot = ledger.snapshot_of(row)
    await run.limiter.wait()
    try:
        await run.publisher.publish(
            snapshot.body,
            routing_key=row["queue"],
            message_id=row["message_id"],
            headers=headers.republished(snapshot.headers, row["attempts"]),
            properties=headers.copy_properties(snapshot.properties),
        )
    except ConnectionLost:
        raise  # every next publish would fail too: end the run, the rows stay marked
    except UnpublishableError as error:
        # No re-drive can carry it, and the worker could not retry it either: dead.
        run.report.errors.append(f"{row['queue']}/{row['message_id']}: {error}")
        key = ledger.Key(row["queue"], row["message_id"])
        failure = rejection(
            row["queue"], UNPUBLISHABLE, f"the re-drive cannot be published: {error}"
        )
        if await repairs.refuse_in_flight(run.ledger, key, UNPUBLISHABLE, failure):
            log.error("%s: dead (%s), not re-driven: %s", key, UNPUBLISHABLE, error)
        return False
    except PublishError as error:
        # Refused for the topology (no queue bound), or nacked: the row stays marked and is
        # tried again after the grace period, reported on each pass; the run goes on.
        run.report.errors.append(f"{row['queue']}/{row['message_id']}: {error}")
        log.error("re-driving %s/%s failed: %s", row["queue"], row["message_id"], error)
        return False
    log.info("%s/%s re-driven to its work queue", row["queue"], row["message_id"])
    return True


def _born(row: Record) -> datetime | None:
    """When the message was published (its AMQP timestamp), else when it was first seen."""
    published = headers.published_at(json.loads(row["properties"]))
    first_seen: datetime | None = row["first_seen"]
    return published or first_seen
