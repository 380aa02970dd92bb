"""Publishing outbox rows no relay published: still pending ``grace`` seconds after they were
due (no relay is running, or it stalled). The rows are taken and locked as a relay takes them,
so a relay and the reconciler never publish the same row; like a relay, a batch takes each
ordering key's oldest row with the rows behind it, and publishes them in order."""

from __future__ import annotations

import logging

from rabbitretry import db
from rabbitretry.db import Connection, Record, query
from rabbitretry.errors import ConnectionLost, PublishError, PublishRefused, UnpublishableError
from rabbitretry.outbox import fail_unpublishable, failed_try, publish_run, take_runs
from rabbitretry.reconcile.run import Run

log = logging.getLogger("rabbitretry.reconcile.reconciler")  # one logger for every step


async def publish_stuck_outbox(run: Run) -> int:
    """Publish outbox rows no relay took, holding their locks like a relay does.

    The transaction spans the publishing (paced), so each statement, not the whole, is
    bounded: one the database does not answer within ``db.SILENT_AFTER`` fails the step.
    """
    published = 0
    for _ in range(run.max_batches):
        async with (
            run.ledger.pool.acquire(timeout=db.SILENT_AFTER) as conn,
            db.answered_transaction(conn),
        ):
            async with db.answered(conn):
                heads = await conn.fetch(query("reconcile_stuck_outbox"), run.grace, run.batch_size)
                key_runs = await take_runs(conn, heads, run.batch_size)
            sent, lost = await _publish_outbox_runs(run, conn, key_runs)
            if sent:
                async with db.answered(conn):
                    await conn.execute(query("outbox_sent"), sent)
        if lost is not None:
            raise lost  # every next publish would fail too; the confirmed rows stay sent
        published += len(sent)
        if len(heads) < run.batch_size:
            break
    return published


async def _publish_outbox_runs(
    run: Run, conn: Connection, key_runs: list[list[Record]]
) -> tuple[list[int], ConnectionLost | None]:
    """Publish each key's rows in turn: the ids confirmed, and the lost connection that cut
    the batch short, if one did. A row that cannot be published fails alone; any other
    failure ends its key's run, and the rows behind it wait, untried, for the next pass."""
    sent: list[int] = []
    for key_run in key_runs:
        outcomes = await publish_run(run.publisher, key_run, pace=run.limiter.wait)
        for row, outcome in zip(key_run[: len(outcomes)], outcomes, strict=True):
            if outcome is None:
                sent.append(row["id"])
            elif isinstance(outcome, ConnectionLost):
                return sent, outcome
            else:
                await _not_published(run, conn, row, outcome)
    return sent, None


async def _not_published(run: Run, conn: Connection, row: Record, error: Exception) -> None:
    if isinstance(error, UnpublishableError):
        # No try can succeed: failed now, with the reason, as the relay does.
        async with db.answered(conn):
            await fail_unpublishable(conn, row, error)
        run.report.errors.append(f"outbox row {row['id']} cannot be published: {error}")
    elif isinstance(error, PublishRefused):
        # The broker refused this row: a counted try, as the relay counts one, so that a row
        # no relay takes still ends failed after its tries.
        async with db.answered(conn):
            await failed_try(conn, row, str(error))
        run.report.errors.append(f"outbox row {row['id']}: {error}")
    elif isinstance(error, PublishError):
        # Left pending for the relay, whose backoff and give-up rules apply.
        run.report.errors.append(f"outbox row {row['id']}: {error}")
    else:
        # A bug: left pending for the relay, and the run goes on to its other checks.
        log.error("publishing outbox row %s failed", row["id"], exc_info=error)
        run.report.errors.append(f"outbox row {row['id']}: {type(error).__name__}: {error}")
