"""``rabbitretry ledger``: what the ledger holds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
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

    Succeeded messages compacted by `ledger prune` keep no queue: they are counted on a line
    of their own (status "succeeded, compacted", oldest: when the oldest finished).

    With --json: an array of {queue, status, messages, attempts, oldest} (oldest: when the
    oldest was first seen, ISO 8601; queue null for the compacted line), [] when the ledger is
    empty.
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
            "(compacted: queue not kept)" if row["queue"] is None else literal(row["queue"]),
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
    compact_after: Annotated[
        str | None,
        typer.Option(
            "--compact-after",
            help="Compact succeeded messages that finished longer ago than this (at least 1d, "
            "shorter than --older-than): each keeps only its key's hash, when it finished and "
            "its attempts, enough to drop a late duplicate; 'off' keeps them whole. Default: "
            f"{retention.COMPACT_AFTER.days}d, or off when --older-than is no longer.",
            show_default=False,
        ),
    ] = None,
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
    callback receipts, and compact the succeeded messages past --compact-after.

    Dead letters and messages in flight are never removed. A duplicate of a pruned message
    would run again, so keep the window longer than any redelivery or replay you expect. A
    compacted message still drops its duplicates, but its message id, its attempts' history
    and its snapshot are gone: `ledger stats` counts it, no listing shows it.
    """
    window = parse_duration(older_than)
    try:
        retention.check_window(window)
    except ValueError as error:
        raise UserError(f"--older-than {older_than} is too short: {error}") from None
    now = datetime.now(UTC)
    before = now - window
    compaction = _compaction(compact_after, window)
    compact_before = None if compaction is None else now - compaction
    pool = await db.create_pool(settings().database(database), min_size=1, max_size=1)
    try:
        if dry_run:
            found = await retention.prunable(pool, before, compact_before)
            out.print("dry run: would " + _summary(found, before, compact_before, DRY_RUN))
            return
        pruned = await retention.prune(pool, before, compact_before=compact_before, rest=rest)
    finally:
        await pool.close()
    out.print(_summary(pruned, before, compact_before, DONE))


def _compaction(given: str | None, window: timedelta) -> timedelta | None:
    """How old a success must be to be compacted; None: compaction off."""
    if given is None:  # the default, unless the retention window is no longer than it
        return retention.COMPACT_AFTER if window > retention.COMPACT_AFTER else None
    if given.strip().lower() == "off":
        return None
    compaction = parse_duration(given)
    try:
        retention.check_compaction(compaction, window)
    except ValueError as error:
        raise UserError(f"--compact-after {given}: {error}") from None
    return compaction


DRY_RUN = ("remove", "compact", "")
DONE = ("removed", "compacted", "; dead letters are kept")


def _summary(
    counts: retention.Pruned,
    before: datetime,
    compact_before: datetime | None,
    words: tuple[str, str, str],
) -> str:
    """What went (or would go), a line for the removals and one for the compaction."""
    removed, compacted, coda = words
    removals = (
        f"{removed} {counts.ledger} ledger row(s), {counts.succeeded_keys} expired compacted "
        f"key(s), {counts.outbox} sent outbox row(s), {counts.alerts} sent alert(s) and "
        f"{counts.callback_receipts} callback receipt(s) from before "
        f"{before:%Y-%m-%d %H:%M %Z}{coda}"
    )
    if compact_before is None:
        return f"{removals}\ncompaction off"
    return (
        f"{removals}\n{compacted} {counts.compacted} succeeded message(s) from before "
        f"{compact_before:%Y-%m-%d %H:%M %Z}"
    )
