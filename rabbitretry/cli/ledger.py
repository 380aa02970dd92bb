"""``rabbitretry ledger``: what the ledger holds."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.table import Table

from rabbitretry import db
from rabbitretry.cli.common import (
    DatabaseOption,
    JsonOption,
    UserError,
    age,
    literal,
    out,
    parse_duration,
    print_json,
    run_async,
    settings,
)
from rabbitretry.db import query
from rabbitretry.ledger import retention

app = typer.Typer(help="Inspect the ledger.", no_args_is_help=True)


@app.command()
@run_async
async def stats(as_json: JsonOption = False, database: DatabaseOption = None) -> None:
    """Messages per queue and status, with their attempts and the oldest.

    With --json: an array of {queue, status, messages, attempts, oldest} (oldest: when the
    oldest was first seen, ISO 8601), [] when the ledger is empty.
    """
    pool = await db.create_pool(settings().database(database), min_size=1, max_size=1)
    try:
        rows = await pool.fetch(query("ledger_stats"))
    finally:
        await pool.close()
    if as_json:
        print_json([dict(row) for row in rows])
        return
    if not rows:
        out.print("the ledger is empty")
        return
    table = Table()
    for column in ("queue", "status", "messages", "attempts", "oldest"):
        table.add_column(column, justify="right" if column in ("messages", "attempts") else "left")
    for row in rows:
        table.add_row(
            literal(row["queue"]),
            row["status"],
            str(row["messages"]),
            str(row["attempts"]),
            age(row["oldest"]),
        )
    out.print(table)


@app.command()
@run_async
async def prune(
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than",
            help="Remove what finished longer ago than this: a whole number and a unit, h "
            "(hours), d (days) or w (weeks), such as 72h, 30d or 2w; at least 3d (72h).",
        ),
    ] = "30d",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would be removed; remove nothing.")
    ] = False,
    rest: Annotated[
        float,
        typer.Option(
            "--rest",
            min=0.0,
            max=100.0,
            help="After each batch of 5,000 rows, rest this many times as long as the batch "
            "took, so that the workers writing to the same database keep most of it; 0 goes "
            "flat out (off-peak).",
        ),
    ] = retention.REST,
    database: DatabaseOption = None,
) -> None:
    """Remove finished messages (succeeded, skipped, ignored), sent outbox rows, sent alerts and
    callback receipts.

    Dead letters and messages in flight are never removed. A duplicate of a pruned message
    would run again, so keep the window longer than any redelivery or replay you expect.
    """
    window = parse_duration(older_than)
    try:
        retention.check_window(window)
    except ValueError as error:
        raise UserError(f"--older-than {older_than} is too short: {error}") from None
    before = datetime.now(UTC) - window
    pool = await db.create_pool(settings().database(database), min_size=1, max_size=1)
    try:
        if dry_run:
            found = await retention.prunable(pool, before)
            out.print(
                f"dry run: would remove {found.ledger} ledger row(s), {found.outbox} sent "
                f"outbox row(s), {found.alerts} sent alert(s) and {found.callback_receipts} "
                f"callback receipt(s) from before {before:%Y-%m-%d %H:%M %Z}"
            )
            return
        pruned = await retention.prune(pool, before, rest=rest)
    finally:
        await pool.close()
    out.print(
        f"removed {pruned.ledger} ledger row(s), {pruned.outbox} sent outbox row(s), "
        f"{pruned.alerts} sent alert(s) and {pruned.callback_receipts} callback receipt(s) "
        f"from before {before:%Y-%m-%d %H:%M %Z}; dead letters are kept"
    )
