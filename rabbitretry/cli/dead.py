"""``rabbitretry dead``: list, group, inspect, replay, ignore, edit and export dead letters.

Every command is a thin shell over :mod:`rabbitretry.operations`, which the console uses too.
"""

from __future__ import annotations

import getpass
import socket
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import Progress

from rabbitretry import amqp, db, ledger, operations
from rabbitretry.cli import dead_output as output
from rabbitretry.cli.common import (
    DatabaseOption,
    JsonOption,
    UserError,
    load_consumer,
    out,
    parse_time,
    print_json,
    run_async,
    settings,
)
from rabbitretry.db import Pool, Record

app = typer.Typer(
    help="Dead letters: messages that will not be retried again until someone replays them.",
    no_args_is_help=True,
)

QueueOption = Annotated[str | None, typer.Option("--queue", "-q", help="Only this work queue.")]


StatusOption = Annotated[
    list[str] | None,
    typer.Option(
        "--status",
        "-s",
        help="dead (default), retrying or ignored; repeat the option for several.",
    ),
]
ErrorOption = Annotated[
    str | None,
    typer.Option(
        "--error",
        "-e",
        help="Only this error type or reason, e.g. TimeoutError or invalid-payload.",
    ),
]
FingerprintOption = Annotated[
    str | None,
    typer.Option("--fingerprint", "-f", help="Only this error group (see `dead list --group`)."),
]
SinceOption = Annotated[
    str | None,
    typer.Option("--since", help="Only those that changed since: 30m, 2h, 7d or a timestamp."),
]
UntilOption = Annotated[
    str | None, typer.Option("--until", help="Only those that changed up to: 2h or a timestamp.")
]
SearchOption = Annotated[
    str | None,
    typer.Option("--search", help="Text to find in the key, error type or error message."),
]


def _filter(
    status: list[str] | None,
    queue: str | None,
    error: str | None,
    fingerprint: str | None,
    since: str | None,
    until: str | None,
    search: str | None,
    limit: int,
) -> operations.Filter:
    return operations.Filter(
        statuses=tuple(status or ("dead",)),
        queue=queue,
        error=error,
        fingerprint=fingerprint,
        since=parse_time(since) if since else None,
        until=parse_time(until) if until else None,
        text=search,
        limit=limit,
    )


@app.command("list")
@run_async
async def list_(
    queue: QueueOption = None,
    status: StatusOption = None,
    error: ErrorOption = None,
    fingerprint: FingerprintOption = None,
    since: SinceOption = None,
    until: UntilOption = None,
    search: SearchOption = None,
    group: Annotated[
        bool,
        typer.Option("--group", "-g", help="One row per error group (fingerprint), with counts."),
    ] = False,
    limit: Annotated[int, typer.Option(min=1, help="At most this many rows.")] = 100,
    as_json: JsonOption = False,
    database: DatabaseOption = None,
) -> None:
    """List dead letters (or retrying and ignored messages), newest first.

    With --group, messages that failed the same way (the same error with different ids or
    numbers) are counted together: replay a whole group with `dead replay --group FINGERPRINT`.

    With --json: an array of objects, one per message (queue, message_id, status, attempts,
    error_type, error_message, error_fingerprint, changed_at, ...) or per group (queue,
    fingerprint, messages, error_type, example_message, first_seen, last_seen); [] when none.
    """
    selection = _filter(status, queue, error, fingerprint, since, until, search, limit)
    pool = await db.create_pool(settings().database(database), min_size=1, max_size=1)
    try:
        if group:
            rows = await operations.groups(pool, selection)
        else:
            rows = await operations.list_messages(pool, selection)
    finally:
        await pool.close()
    if as_json:
        print_json([dict(row) for row in rows])
        return
    what = "/".join(selection.statuses)
    if not rows:
        narrowed = any((queue, error, fingerprint, since, until, search))
        out.print(f"no {what} messages" + (" match these filters" if narrowed else ""))
        return
    (output.print_groups if group else output.print_messages)(rows, what, limit)


@app.command()
@run_async
async def show(
    key: Annotated[str, typer.Argument(help="The message_id (ledger key) of the dead letter.")],
    queue: QueueOption = None,
    database: DatabaseOption = None,
) -> None:
    """Show one message: payload, headers, state, every attempt and the audit trail."""
    pool = await db.create_pool(settings().database(database), min_size=1, max_size=1)
    try:
        row = await _find(pool, key, queue)
        attempts, audit = await operations.history(pool, ledger.Key(row["queue"], key))
    finally:
        await pool.close()
    output.print_entry(row, attempts, audit)


@app.command()
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
        chosen = [await _dead_key(pool, key, queue) for key in keys] if keys else None
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
            output.print_targets(targets)
            out.print(f"dry run: {len(targets)} dead letter(s) would be replayed")
            return
        async with operations.publisher(config.amqp_url) as sender:
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
    if report.stopped:
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
            pool, sender, targets, actor=_actor(), on_progress=advance, **options
        )


@app.command()
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
        row = await _find(pool, key, queue)
        entry = ledger.Key(row["queue"], key)
        if not await operations.ignore(pool, entry, actor=_actor(), comment=comment):
            raise UserError(f"{entry} is {row['status']}: only dead or retrying messages")
    finally:
        await pool.close()
    out.print(f"ignored {entry}")


@app.command()
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
        entry = await _dead_key(pool, key, queue)
        async with operations.publisher(config.amqp_url) as sender:
            done = await operations.edit_and_replay(
                pool, sender, entry, text, actor=_actor(), payload_adapter=adapter, comment=comment
            )
    finally:
        await pool.close()
    if not done:
        raise UserError(f"{entry} is no longer dead: nothing to replay")
    out.print(f"replayed {entry} with the new payload")


@app.command()
@run_async
async def export(
    format_: Annotated[
        str, typer.Option("--format", help="Output format: jsonl (one message per line).")
    ] = "jsonl",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here instead of to stdout.")
    ] = None,
    queue: QueueOption = None,
    status: StatusOption = None,
    error: ErrorOption = None,
    fingerprint: FingerprintOption = None,
    since: SinceOption = None,
    until: UntilOption = None,
    search: SearchOption = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many messages.")] = 100_000,
    database: DatabaseOption = None,
) -> None:
    """Export messages with payloads, headers and errors, oldest first.

    Payloads that are JSON are embedded as JSON; others as base64 in payload_base64.
    """
    if format_ != "jsonl":
        raise UserError(f"unknown format {format_!r}: only jsonl is supported")
    selection = _filter(status, queue, error, fingerprint, since, until, search, limit)
    pool = await db.create_pool(settings().database(database), min_size=1, max_size=1)
    try:
        if output is None:
            count = await operations.export(pool, selection, sys.stdout.write, actor=_actor())
        else:
            with output.open("w", encoding="utf-8") as file:
                count = await operations.export(pool, selection, file.write, actor=_actor())
    finally:
        await pool.close()
    if output is not None:
        out.print(f"exported {count} message(s) to {output}")


def _actor() -> str:
    return f"cli:{getpass.getuser()}@{socket.gethostname()}"


async def _find(pool: Pool, key: str, queue: str | None) -> Record:
    rows = await operations.find(pool, key, queue)
    if not rows:
        where = f"in queue {queue!r}" if queue else "in the ledger"
        raise UserError(f"no message with key {key!r} {where}")
    if len(rows) > 1:
        queues = ", ".join(r["queue"] for r in rows)
        raise UserError(f"key {key!r} exists in several queues ({queues}): add --queue")
    return rows[0]


async def _dead_key(pool: Pool, key: str, queue: str | None) -> ledger.Key:
    row = await _find(pool, key, queue)
    if row["status"] != "dead":
        raise UserError(f"{row['queue']}/{key} is {row['status']}, not dead: nothing to replay")
    return ledger.Key(row["queue"], key)
