"""``rabbitretry downstream``: see the downstream breakers, hold one open, close one.

A thin shell over :mod:`rabbitretry.operations.downstreams`; each open and close is recorded
in the audit table under the actor of :func:`rabbitretry.cli.dead.selection.actor`.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from rabbitretry import db
from rabbitretry.cli.common import (
    DatabaseOption,
    JsonOption,
    age,
    err,
    literal,
    out,
    print_json,
    run_async,
    settings,
    shown,
)
from rabbitretry.cli.dead.selection import actor
from rabbitretry.operations import downstreams
from rabbitretry.operations.downstreams import Breaker, Change, Waiting

app = typer.Typer(
    help=(
        "Downstream breakers: each service your handlers call (a consumer's `downstreams = "
        '(Downstream("wms", ...),)`) has one circuit breaker, shared by every worker.\n\n'
        "When its calls keep failing the breaker opens: the consumers that call it stop taking "
        "deliveries (messages wait on the broker, no attempt is charged) and one worker probes "
        "it now and then until it answers. An operator may hold it open, and close it.\n\n"
        "Examples:\n"
        "  rabbitretry downstream list\n"
        '  rabbitretry downstream open wms --reason "WMS maintenance until 14:00"\n'
        "  rabbitretry downstream close wms"
    ),
    no_args_is_help=True,
)

LAST_ERROR_WIDTH = 60

NameArgument = Annotated[str, typer.Argument(help="The downstream, as `downstream list` names it.")]
ReasonOption = Annotated[
    str | None,
    typer.Option(
        "--reason",
        "--comment",
        "-m",
        help="Why (kept in the audit with who did it and when).",
        show_default=False,
    ),
]


@app.command("list")
@run_async
async def list_(as_json: JsonOption = False, database: DatabaseOption = None) -> None:
    """Every downstream breaker: its state, failures, last error, probes, who holds it open,
    and how many messages wait on each queue that calls it (asked of the broker: "?" when it
    cannot be reached).

    With --json: an array of objects (name, state, since, failures, last_error,
    pause_seconds, next_probe_at, probe_worker, probes, opened, forced, forced_by, queues,
    updated_at, waiting: an object of queue to ready messages, null when unknown); [] when
    there are none.
    """
    config = settings()
    pool = await db.create_pool(config.database(database), min_size=1, max_size=1)
    try:
        found = await downstreams.breakers(pool)
    finally:
        await pool.close()
    queues = list(dict.fromkeys(q for breaker in found for q in breaker.queues))
    waiting = await downstreams.waiting(config.amqp_url, queues)
    if waiting.error:
        err.print(
            f"[yellow]warning:[/yellow] messages waiting unknown ({shown(waiting.error)})",
            highlight=False,
        )
    if as_json:
        print_json(
            [
                {
                    **dataclasses.asdict(breaker),
                    "waiting": {q: waiting.counts.get(q) for q in breaker.queues},
                }
                for breaker in found
            ]
        )
        return
    if not found:
        out.print(
            literal(
                "no downstream has been recorded yet: declare one on a consumer, "
                'downstreams = (Downstream("wms", unavailable_on=(WmsDown,)),), and wrap its '
                'calls in `async with ctx.downstream("wms"):`; a worker records it when it starts'
            ),
            highlight=False,
        )
        return
    out.print(_table(found, waiting))


def _table(found: list[Breaker], waiting: Waiting) -> Table:
    now = datetime.now(UTC)
    table = Table()
    for column in (
        "name",
        "state",
        "since",
        "failures",
        "last error",
        "probes",
        "next probe",
        "forced by",
        "queues (messages waiting)",
    ):
        table.add_column(column, justify="right" if column in ("failures", "probes") else "left")
    for breaker in found:
        table.add_row(
            literal(breaker.name),
            _state(breaker),
            f"{age(breaker.since, now)} ago",
            str(breaker.failures),
            literal(_shortened(breaker.last_error)),
            str(breaker.probes),
            literal(_next_probe(breaker, now)),
            literal(breaker.forced_by if breaker.held_open and breaker.forced_by else "-"),
            literal(_queues(breaker, waiting)),
        )
    return table


def _state(breaker: Breaker) -> Text:
    if breaker.held_open:
        return Text("open (held)", style="red")
    style = {"closed": "green", "open": "red", "half-open": "yellow"}.get(breaker.state, "")
    return Text(breaker.state, style=style)


def _next_probe(breaker: Breaker, now: datetime) -> str:
    if breaker.held_open:
        return "none until closed"
    if breaker.state == "half-open":
        return f"probing ({breaker.probe_worker})"
    if breaker.state != "open" or breaker.next_probe_at is None:
        return "-"
    if breaker.next_probe_at <= now:
        return "due"
    return f"in {age(now, breaker.next_probe_at)}"


def _queues(breaker: Breaker, waiting: Waiting) -> str:
    if not breaker.queues:
        return "-"
    return ", ".join(f"{q}: {_count(waiting.counts.get(q), waiting)}" for q in breaker.queues)


def _count(count: int | None, waiting: Waiting) -> str:
    if count is not None:
        return str(count)
    return "?" if waiting.error else "no such queue"


def _shortened(text: str | None) -> str:
    if not text:
        return "-"
    line = " ".join(text.split())
    return line if len(line) <= LAST_ERROR_WIDTH else line[: LAST_ERROR_WIDTH - 1] + "…"


@app.command("open")
@run_async
async def open_(
    name: NameArgument, reason: ReasonOption = None, database: DatabaseOption = None
) -> None:
    """Hold a downstream's breaker open until you close it: within a second every consumer
    that calls it stops taking deliveries, and no worker probes it. The messages wait on the
    broker; no attempt is charged.

    For a planned outage, or one the probes would only prolong. Recorded in the audit table
    (who, when, the reason).

    \bExample:
      rabbitretry downstream open wms --reason "WMS maintenance until 14:00"
    """
    pool = await db.create_pool(settings().database(database), min_size=1, max_size=1)
    try:
        change = await downstreams.hold_open(pool, name, actor=actor(), reason=reason)
    finally:
        await pool.close()
    before = change.before
    if before.held_open:
        was = f"it was already held open by {before.forced_by or 'an operator'}"
    else:
        was = f"it was {before.state}"
    out.print(
        f"held downstream {shown(name)} open ({was}): {_callers(before)} stop taking "
        "deliveries within a second, and no probe is tried; the messages wait on the broker. "
        f"Close it when the service is back: rabbitretry downstream close {shown(name)}",
        highlight=False,
    )


@app.command("close")
@run_async
async def close(
    name: NameArgument, reason: ReasonOption = None, database: DatabaseOption = None
) -> None:
    """Close a downstream's breaker now, whether it tripped or was held open: within a second
    the consumers that call it take deliveries again.

    Its failure count starts from zero; if the calls fail again, it trips again by itself
    once they cross its threshold. Recorded in the audit table (who, when, the reason).

    \bExample:
      rabbitretry downstream close wms --reason "WMS is back"
    """
    pool = await db.create_pool(settings().database(database), min_size=1, max_size=1)
    try:
        change = await downstreams.close(pool, name, actor=actor(), reason=reason)
    finally:
        await pool.close()
    out.print(_closed(name, change), highlight=False)


def _closed(name: str, change: Change) -> str:
    before = change.before
    if before.state == "closed" and not before.held_open:
        return (
            f"downstream {shown(name)} was already closed; its failure count "
            f"({before.failures}) starts from zero again"
        )
    was = (
        f"held open by {before.forced_by or 'an operator'}"
        if before.held_open
        else f"{before.state} since {age(before.since)} ago"
    )
    return (
        f"closed downstream {shown(name)} (it was {was}): {_callers(before)} take deliveries "
        "again within a second. Its failures count from zero; it trips again by itself if "
        "they cross its threshold"
    )


def _callers(breaker: Breaker) -> str:
    if not breaker.queues:
        return "the consumers that call it"
    return "the consumers of " + ", ".join(shown(q) for q in breaker.queues)
