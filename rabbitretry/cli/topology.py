"""``rabbitretry topology``: declare, compare and export the queues rabbitretry needs."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from rabbitretry import amqp
from rabbitretry.cli.common import load_topology, out, run_async, settings
from rabbitretry.topology import Plan, PlanEntry, declare, delays, export_definitions, plan

app = typer.Typer(
    help=(
        "The exchanges and queues of your work queues: each work queue Q gets Q.dead (dead "
        "letters, no TTL) and a binding on the delay chain that holds retries until they are "
        "due (rabbitretry.delay.*: 24 levels per queue type, shared by all work queues)."
    ),
    no_args_is_help=True,
)

Targets = Annotated[
    list[str],
    typer.Argument(
        help="Topology files (topology/*.toml) and/or consumer classes (MODULE:CLASS).",
        show_default=False,
    ),
]

_STYLE = {"create": "green", "ok": "dim", "mismatch": "bold red", "ensure": "cyan"}


@app.command("declare")
@run_async
async def declare_(targets: Targets) -> None:
    """Create what is missing (idempotent). Refuses, changing nothing, if an existing queue
    has other arguments (RabbitMQ would answer 406 PRECONDITION_FAILED)."""
    topology = load_topology(targets)
    connection = await amqp.connect(settings().amqp_url, name="rabbitretry-topology")
    try:
        applied = await declare(connection, topology)
    finally:
        await connection.close()
    created = [e for e in applied.entries if e.action == "create"]
    _print(applied, only_changes=True)
    out.print(
        f"declared: {len(created)} created, {len(applied.entries) - len(created)} already in place"
    )


@app.command("plan")
@run_async
async def plan_(targets: Targets) -> None:
    """Compare with the live broker without changing it; exit 1 on any argument mismatch."""
    topology = load_topology(targets)
    connection = await amqp.connect(settings().amqp_url, name="rabbitretry-topology")
    try:
        result = await plan(connection, topology)
    finally:
        await connection.close()
    _print(result, only_changes=False)
    if result.has_mismatch:
        out.print(
            "[bold red]mismatch[/bold red]: a queue's arguments cannot change in place; delete "
            "and redeclare it (after moving its messages), or change the topology to match"
        )
        raise typer.Exit(1)


@app.command("export")
@run_async
async def export(
    targets: Targets,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write to this file instead of stdout.")
    ] = None,
    vhost: Annotated[str, typer.Option(help="Virtual host to write into the definitions.")] = "/",
) -> None:
    """Write RabbitMQ definitions JSON (for rabbitmqctl import_definitions or the management UI)."""
    text = json.dumps(export_definitions(load_topology(targets), vhost=vhost), indent=2)
    if output is None:
        print(text)
    else:
        output.write_text(text + "\n")
        out.print(f"wrote {output}")


def _print(result: Plan, *, only_changes: bool) -> None:
    entries = [e for e in result.entries if not only_changes or e.action not in ("ok", "ensure")]
    if not entries:
        return
    table = Table()
    for column in ("kind", "name", "action", "detail"):
        table.add_column(column, overflow="fold")
    for kind, name, action, detail in plan_rows(entries):
        style = _STYLE.get(action, "")
        table.add_row(kind, name, f"[{style}]{action}[/{style}]", detail)
    out.print(table)


Row = tuple[str, str, str, str]  # kind, name, action, detail


def plan_rows(entries: list[PlanEntry]) -> list[Row]:
    """The rows to show: the delay chain's hundred-odd entities, which would drown the work
    queues' own, as one row per action; a mismatch in it still gets a row of its own."""
    rows: list[Row] = []
    chain: Counter[tuple[str, str]] = Counter()
    for e in entries:
        if e.name.startswith(f"{delays.PREFIX}.") and e.action != "mismatch":
            chain[(e.action, e.kind)] += 1
        else:
            rows.append((e.kind, e.name, e.action, e.detail))
    for action in dict.fromkeys(action for action, _ in chain):
        counts = [
            f"{count} {kind}{'s' if count != 1 else ''}"
            for kind in ("exchange", "queue", "binding")
            if (count := chain[(action, kind)])
        ]
        rows.append(("chain", f"{delays.PREFIX}.* (delay chain)", action, ", ".join(counts)))
    return rows
