"""The ``dead`` commands that read: ``list``, ``show`` and ``export``.

They change no message; ``export`` only records in the audit who took a copy.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from rabbitretry import db, ledger, operations
from rabbitretry.cli.common import (
    DatabaseOption,
    JsonOption,
    UserError,
    out,
    print_json,
    run_async,
    settings,
)
from rabbitretry.cli.dead import printing
from rabbitretry.cli.dead.selection import (
    ErrorOption,
    FingerprintOption,
    QueueOption,
    SearchOption,
    SinceOption,
    StatusOption,
    UntilOption,
    actor,
    filter_from,
    find,
)


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
    selection = filter_from(status, queue, error, fingerprint, since, until, search, limit)
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
    (printing.print_groups if group else printing.print_messages)(rows, what, limit)


@run_async
async def show(
    key: Annotated[str, typer.Argument(help="The message_id (ledger key) of the dead letter.")],
    queue: QueueOption = None,
    database: DatabaseOption = None,
) -> None:
    """Show one message: payload, headers, state, every attempt, the audit trail, and the run
    of its consumer's recover hook (on_dead), if it has one."""
    pool = await db.create_pool(settings().database(database), min_size=1, max_size=1)
    try:
        row = await find(pool, key, queue)
        attempts, audit = await operations.history(pool, ledger.Key(row["queue"], key))
        recovery = await operations.recover_run(pool, ledger.Key(row["queue"], key))
    finally:
        await pool.close()
    printing.print_entry(row, attempts, audit, recovery)


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
    selection = filter_from(status, queue, error, fingerprint, since, until, search, limit)
    pool = await db.create_pool(settings().database(database), min_size=1, max_size=1)
    try:
        if output is None:
            count = await operations.export(pool, selection, sys.stdout.write, actor=actor())
        else:
            with output.open("w", encoding="utf-8") as file:
                count = await operations.export(pool, selection, file.write, actor=actor())
    finally:
        await pool.close()
    if output is not None:
        out.print(f"exported {count} message(s) to {output}")
