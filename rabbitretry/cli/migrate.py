"""``rabbitretry db``: the ledger's schema."""

from __future__ import annotations

import typer

from rabbitretry import db
from rabbitretry.cli.common import out, run_async, settings

app = typer.Typer(help="Create and upgrade the ledger schema in PostgreSQL.", no_args_is_help=True)


@app.command()
@run_async
async def migrate() -> None:
    """Apply the schema migrations not yet applied (safe to run again, and concurrently)."""
    pool = await db.create_pool(settings().database_url, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            applied = await db.migrate(conn)
    finally:
        await pool.close()
    if applied:
        for name in applied:
            out.print(f"applied [bold]{name}[/bold]")
    else:
        out.print("the ledger schema is up to date")


@app.command()
@run_async
async def status() -> None:
    """Show which migrations are applied and which are pending (exit 1 if any is pending)."""
    pool = await db.create_pool(settings().database_url, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            pending = await db.pending_migrations(conn)
    finally:
        await pool.close()
    if pending:
        out.print("pending: " + ", ".join(pending) + " — run [bold]rabbitretry db migrate[/bold]")
        raise typer.Exit(1)
    out.print("the ledger schema is up to date")
