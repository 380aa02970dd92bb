"""``rabbitretry db``: the ledger's schema."""

from __future__ import annotations

import typer

from rabbitretry import db
from rabbitretry.cli.common import DatabasesOption, out, run_async, settings
from rabbitretry.ledger import migrations
from rabbitretry.urls import mask_url

app = typer.Typer(help="Create and upgrade the ledger schema in PostgreSQL.", no_args_is_help=True)


def _label(url: str, several: bool) -> str:
    """Which database a line is about, when a command acts on several."""
    return f"{mask_url(url)}: " if several else ""


@app.command()
@run_async
async def migrate(database: DatabasesOption = None) -> None:
    """Apply the schema migrations not yet applied (safe to run again, and concurrently).

    With several --database, each ledger database is migrated in turn.
    """
    urls = settings().databases(database)
    for url in urls:
        pool = await db.create_pool(url, min_size=1, max_size=1)
        try:
            async with pool.acquire() as conn:
                applied = await migrations.migrate(conn)
        finally:
            await pool.close()
        label = _label(url, len(urls) > 1)
        if applied:
            for name in applied:
                out.print(f"{label}applied [bold]{name}[/bold]")
        else:
            out.print(f"{label}the ledger schema is up to date")


@app.command()
@run_async
async def status(database: DatabasesOption = None) -> None:
    """Show which migrations are applied and which are pending (exit 1 if any is pending)."""
    urls = settings().databases(database)
    behind = False
    for url in urls:
        pool = await db.create_pool(url, min_size=1, max_size=1)
        try:
            async with pool.acquire() as conn:
                pending = await migrations.pending_migrations(conn)
        finally:
            await pool.close()
        label = _label(url, len(urls) > 1)
        if pending:
            behind = True
            out.print(
                f"{label}pending: "
                + ", ".join(pending)
                + " — run [bold]rabbitretry db migrate[/bold]",
            )
        else:
            out.print(f"{label}the ledger schema is up to date")
    if behind:
        raise typer.Exit(1)
