"""``rabbitretry ledger``: what the ledger holds."""

from __future__ import annotations

import typer
from rich.table import Table

from rabbitretry import db
from rabbitretry.cli.common import age, out, run_async, settings
from rabbitretry.db import query

app = typer.Typer(help="Inspect the ledger.", no_args_is_help=True)


@app.command()
@run_async
async def stats() -> None:
    """Messages per queue and status, with their attempts and the oldest."""
    pool = await db.create_pool(settings().database_url, min_size=1, max_size=1)
    try:
        rows = await pool.fetch(query("ledger_stats"))
    finally:
        await pool.close()
    if not rows:
        out.print("the ledger is empty")
        return
    table = Table()
    for column in ("queue", "status", "messages", "attempts", "oldest"):
        table.add_column(column, justify="right" if column in ("messages", "attempts") else "left")
    for row in rows:
        table.add_row(
            row["queue"],
            row["status"],
            str(row["messages"]),
            str(row["attempts"]),
            age(row["oldest"]),
        )
    out.print(table)
