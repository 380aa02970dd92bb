"""``rabbitretry outbox``: relay the transactional outbox and see what it holds."""

from __future__ import annotations

import asyncio
import signal
from typing import Annotated

import typer
from rich.table import Table

from rabbitretry import db
from rabbitretry.cli.common import (
    DatabaseOption,
    VerboseOption,
    age,
    configure_logging,
    literal,
    out,
    run_async,
    settings,
)
from rabbitretry.db import query
from rabbitretry.outbox import OutboxRelay

app = typer.Typer(
    help="The transactional outbox: messages enqueued in your transactions, published by a relay.",
    no_args_is_help=True,
)


@app.command()
@run_async
async def relay(
    batch_size: Annotated[int, typer.Option(min=1, max=10_000, help="Rows per batch.")] = 100,
    poll_interval: Annotated[
        float, typer.Option(min=0.05, help="Seconds between scans when no notification comes.")
    ] = 1.0,
    max_tries: Annotated[
        int, typer.Option(min=1, help="Failed publishes before a row is marked failed.")
    ] = 10,
    verbose: VerboseOption = False,
    database: DatabaseOption = None,
) -> None:
    """Publish pending outbox rows until SIGTERM or Ctrl-C (several relays may run at once)."""
    configure_logging(verbose)
    config = settings()
    pool = await db.create_pool(config.database(database), min_size=2, max_size=3)
    try:
        worker = OutboxRelay(
            pool,
            config.amqp_url,
            batch_size=batch_size,
            poll_interval=poll_interval,
            max_tries=max_tries,
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        await worker.run()
        out.print(
            f"relay stopped: {worker.stats.sent} sent, {worker.stats.failed_tries} failed tries, "
            f"{worker.stats.given_up} given up"
        )
    finally:
        await pool.close()


@app.command()
@run_async
async def status(
    limit: Annotated[int, typer.Option(min=1, help="Failed rows to list.")] = 20,
    database: DatabaseOption = None,
) -> None:
    """Rows by status, and the failed ones with their last error (exit 1 if any failed)."""
    pool = await db.create_pool(settings().database(database), min_size=1, max_size=1)
    try:
        counts = await pool.fetch(query("outbox_stats"))
        failed = await pool.fetch(query("outbox_list_failed"), limit)
    finally:
        await pool.close()
    if not counts:
        out.print("the outbox is empty")
        return
    table = Table()
    for column in ("status", "messages", "oldest", "most tries"):
        table.add_column(column)
    for row in counts:
        table.add_row(
            row["status"], str(row["messages"]), age(row["oldest"]), str(row["most_tries"])
        )
    out.print(table)
    if failed:
        detail = Table(title="failed rows (they are not retried until you run `outbox retry`)")
        for column in ("id", "message_id", "destination", "tries", "last error", "age"):
            detail.add_column(column, overflow="fold")
        for row in failed:
            destination = f"{row['exchange'] or '(default)'} / {row['routing_key']}"
            detail.add_row(
                str(row["id"]),
                literal(row["message_id"]),
                literal(destination),
                str(row["tries"]),
                literal(row["last_error"] or ""),
                age(row["created_at"]),
            )
        out.print(detail)
        raise typer.Exit(1)


@app.command()
@run_async
async def retry(
    row_id: Annotated[
        int | None, typer.Argument(help="One failed row's id; all when omitted.")
    ] = None,
    database: DatabaseOption = None,
) -> None:
    """Give failed rows a fresh set of tries (after fixing their cause, e.g. a missing binding)."""
    pool = await db.create_pool(settings().database(database), min_size=1, max_size=1)
    try:
        rows = await pool.fetch(query("outbox_retry_failed"), row_id)
    finally:
        await pool.close()
    out.print(f"{len(rows)} failed row(s) are pending again")
