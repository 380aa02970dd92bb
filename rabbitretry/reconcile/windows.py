"""Checking a reconciliation's window against the ledger: the expected keys never seen are
re-published (once per claim, whichever reconciler gets there first), the keys that succeeded
without being expected are reported as orphans. What a window is and how keys are sorted is
pure, in :mod:`rabbitretry.reconcile.expected`."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from rabbitretry.db import query
from rabbitretry.errors import ConnectionLost, PublishError, UnpublishableError
from rabbitretry.publisher import encode
from rabbitretry.reconcile.expected import Expected, Reconciliation, WindowReport, classify
from rabbitretry.reconcile.run import Run

log = logging.getLogger("rabbitretry.reconcile.reconciler")  # one logger for every step

KEY_CHUNK = 1000  # expected keys looked up per query
ORPHAN_EXAMPLES = 20


async def check_window(run: Run, item: Reconciliation) -> WindowReport:
    """Compare ``item``'s current window with the ledger, re-publishing what is missing."""
    start, end = item.window(datetime.now(UTC))
    window = WindowReport(item.name, item.queue, start, end)
    expected_keys: list[str] = []
    chunk: list[Expected] = []
    async for expected in item.expected(start, end):
        chunk.append(expected)
        if len(chunk) >= KEY_CHUNK:
            await _check_chunk(run, item, chunk, window)
            expected_keys += [e.message_id for e in chunk]
            chunk = []
    if chunk:
        await _check_chunk(run, item, chunk, window)
        expected_keys += [e.message_id for e in chunk]
    orphans = await run.ledger.fetch(
        query("reconcile_orphans"), item.queue, start, end, expected_keys, ORPHAN_EXAMPLES
    )
    await run.ledger.execute(query("reconcile_forget_republished"), item.name, item.lookback)
    window.orphaned = orphans[0]["total"] if orphans else 0
    window.orphan_examples = [row["message_id"] for row in orphans]
    if window.orphaned:
        log.warning(
            "%s: %d key(s) of %s succeeded without being expected, e.g. %s",
            item.name,
            window.orphaned,
            item.queue,
            ", ".join(window.orphan_examples[:5]),
        )
    return window


async def _check_chunk(
    run: Run, item: Reconciliation, chunk: list[Expected], window: WindowReport
) -> None:
    rows = await run.ledger.fetch(
        query("reconcile_key_statuses"), item.queue, [e.message_id for e in chunk]
    )
    classified = classify([e.message_id for e in chunk], {r[0]: r[1] for r in rows})
    window.add(classified)
    if not classified.missing:
        return
    # The claim rows make two reconcilers running at once re-publish a key only once.
    claimed = await run.ledger.fetch(
        query("reconcile_claim_republish"),
        item.queue,
        classified.missing,
        item.name,
        run.grace,
    )
    by_key = {e.message_id: e for e in chunk}
    for row in claimed:
        if await _republish(run, item.queue, by_key[row["message_id"]]):
            window.republished += 1


async def _republish(run: Run, queue: str, expected: Expected) -> bool:
    body, content_type = encode(expected.payload)
    await run.limiter.wait()
    try:
        await run.publisher.publish(
            body,
            routing_key=queue,
            message_id=expected.message_id,
            headers=expected.headers,
            properties={"content_type": content_type},
        )
    except ConnectionLost:
        raise
    except (PublishError, UnpublishableError) as error:  # this key alone; the others go on
        run.report.errors.append(f"{queue}/{expected.message_id}: {error}")
        return False
    log.info("%s/%s was never seen: re-published", queue, expected.message_id)
    return True
