"""The ``dead`` commands that act on messages: ``replay``, ``ignore`` and ``edit``.

Each change is recorded in the audit table under the actor of :func:`.selection.actor`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import Progress

from rabbitretry import amqp, db, ledger, operations
from rabbitretry.cli.common import (
    DatabaseOption,
    UserError,
    load_consumer,
    out,
    parse_time,
    run_async,
    settings,
    shown,
)
from rabbitretry.cli.dead import printing
from rabbitretry.cli.dead.selection import QueueOption, actor, dead_key, find
from rabbitretry.db import Pool

FAILURES_SHOWN = 20  # refused messages listed, each with the broker's reason


@run_async
async def replay(
    keys: Annotated[
        list[str] | None, typer.Argument(help="Replay these message_ids (one or more).")
    ] = None,
    queue: QueueOption = None,
    group: Annotated[
        str | None,
        typer.Option(
            "--group",
            "--fingerprint",
            "-g",
            "-f",
            help="Replay an error group: its FINGERPRINT (as `dead list --group` shows).",
        ),
    ] = None,
    all_: Annotated[
        bool, typer.Option("--all", help="Replay every dead letter (of --queue, if given).")
    ] = False,
    error: Annotated[
        str | None, typer.Option("--error", "-e", help="Only this error type or reason.")
    ] = None,
    before: Annotated[
        str | None,
        typer.Option(
            "--before",
            help="Cutoff: only those that died up to this time (2h = two hours ago, or a "
            "timestamp). Those that die during the replay are never included.",
        ),
    ] = None,
    rate: Annotated[
        str | None,
        typer.Option(
            "--rate",
            help="At most this many messages a second: 20 or 20/s, or a minute: 300/m.",
        ),
    ] = None,
    canary: Annotated[
        bool,
        typer.Option(
            "--canary",
            help="Replay one first and wait until a worker finishes it; go on only if it "
            "succeeded.",
        ),
    ] = False,
    canary_timeout: Annotated[
        float, typer.Option(min=1, help="Seconds to wait for the canary's outcome.")
    ] = 60.0,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what would be replayed; change nothing.")
    ] = False,
    database: DatabaseOption = None,
) -> None:
    """Republish dead letters from the ledger with a fresh attempt budget.

    Give KEYs, or --group FINGERPRINT, --queue QUEUE, --error E, or --all. The list of
    messages is taken once, at the start. Each replay is recorded in the audit table, and
    replaying a message twice never creates two live copies. A worker must be running for
    --canary to see its outcome.

    A message the broker refuses (its work queue deleted, headers too large for a frame) is
    listed with the broker's reason and stays dead; the others are replayed. Exits 1 if any
    was refused or a canary stopped the replay.
    """
    if not keys and queue is None and group is None and error is None and not all_:
        raise UserError("say what to replay: KEYs, --group FINGERPRINT, --queue QUEUE, or --all")
    if keys and (all_ or group):
        raise UserError("give either KEYs or --group/--all, not both")
    per_second = operations.parse_rate(rate) if rate else None
    cutoff = parse_time(before) if before else None
    config = settings()
    pool = await db.create_pool(config.database(database), min_size=1, max_size=2)
    try:
        chosen = [await dead_key(pool, key, queue) for key in keys] if keys else None
        targets = await operations.replay_targets(
            pool,
            keys=chosen,
            queue=queue,
            fingerprint=group,
            error=error,
            before=cutoff,
        )
        if not targets:
            out.print("no dead letters match")
            return
        if dry_run:
            printing.print_targets(targets)
            out.print(f"dry run: {len(targets)} dead letter(s) would be replayed")
            return
        async with operations.sender(config.amqp_url) as sender:
            report = await _replay_with_progress(
                pool,
                sender,
                targets,
                rate=per_second,
                canary=canary,
                canary_timeout=canary_timeout,
                description={"group": group, "queue": queue, "error": error, "before": cutoff},
            )
    finally:
        await pool.close()
    out.print(report.summary())
    for failure in report.failures[:FAILURES_SHOWN]:
        out.print(f"refused: {shown(failure)}", highlight=False)
    if report.failed > FAILURES_SHOWN:
        out.print(f"... and {report.failed - FAILURES_SHOWN} more refused", highlight=False)
    if report.stopped or report.failed:
        raise typer.Exit(1)


async def _replay_with_progress(
    pool: Pool,
    sender: amqp.ConfirmingPublisher,
    targets: list[ledger.Key],
    **options: Any,
) -> operations.ReplayReport:
    with Progress(transient=True, console=out) as progress:
        task = progress.add_task("replaying", total=len(targets))

        def advance(report: operations.ReplayReport) -> None:
            progress.update(task, completed=report.replayed + report.skipped)

        return await operations.replay(
            pool, sender, targets, actor=actor(), on_progress=advance, **options
        )


@run_async
async def ignore(
    key: Annotated[str, typer.Argument(help="The message_id to ignore.")],
    comment: Annotated[
        str, typer.Option("--comment", "-m", help="Why no one will retry it (kept in the audit).")
    ],
    queue: QueueOption = None,
    database: DatabaseOption = None,
) -> None:
    """Mark a dead (or retrying) message as ignored: it will not be retried or replayed.

    Copies still on the broker are dropped when they arrive. The comment is required.
    """
    pool = await db.create_pool(settings().database(database), min_size=1, max_size=1)
    try:
        row = await find(pool, key, queue)
        entry = ledger.Key(row["queue"], key)
        if not await operations.ignore(pool, entry, actor=actor(), comment=comment):
            raise UserError(f"{entry} is {row['status']}: only dead or retrying messages")
    finally:
        await pool.close()
    out.print(f"ignored {entry}")


@run_async
async def edit(
    key: Annotated[str, typer.Argument(help="The message_id of the dead letter to fix.")],
    payload: Annotated[
        str | None, typer.Option("--payload", "-p", help="The new payload (JSON).")
    ] = None,
    payload_file: Annotated[
        Path | None, typer.Option("--payload-file", help="Read the new payload from this file.")
    ] = None,
    consumer: Annotated[
        str | None,
        typer.Option("--consumer", help="MODULE:CLASS whose model the payload must fit."),
    ] = None,
    comment: Annotated[
        str | None, typer.Option("--comment", "-m", help="Why it was changed.")
    ] = None,
    queue: QueueOption = None,
    database: DatabaseOption = None,
) -> None:
    """Replace a dead letter's payload and replay it (the old payload is kept in the audit).

    The payload must be JSON; with --consumer it must also validate into the consumer's model.
    """
    if (payload is None) == (payload_file is None):
        raise UserError("give the new payload: --payload JSON or --payload-file FILE")
    if payload_file is not None and not payload_file.is_file():
        raise UserError(f"payload file {payload_file} does not exist")
    text = payload if payload is not None else payload_file.read_text()  # type: ignore[union-attr]
    adapter = load_consumer(consumer).payload_adapter if consumer else None
    operations.checked_payload(text, adapter)
    config = settings()
    pool = await db.create_pool(config.database(database), min_size=1, max_size=2)
    try:
        entry = await dead_key(pool, key, queue)
        async with operations.sender(config.amqp_url) as sender:
            done = await operations.edit_and_replay(
                pool, sender, entry, text, actor=actor(), payload_adapter=adapter, comment=comment
            )
    finally:
        await pool.close()
    if not done:
        raise UserError(f"{entry} is no longer dead: nothing to replay")
    out.print(f"replayed {entry} with the new payload")
