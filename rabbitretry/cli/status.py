"""``rabbitretry status``: service levels per queue against thresholds, for people and monitors."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.table import Table

from rabbitretry import db
from rabbitretry.cli.common import (
    DatabaseOption,
    literal,
    out,
    parse_time,
    print_json,
    run_async,
    settings,
)
from rabbitretry.db import query
from rabbitretry.monitoring import heartbeat, levels
from rabbitretry.monitoring.thresholds import RETRIED_OVER, Breach, Report, Thresholds, evaluate

BREACHED_EXIT = 3


@run_async
async def status(
    window: Annotated[
        str,
        typer.Option(help="History the latencies cover: 15m, 1h, 1d, or a timestamp (since)."),
    ] = "15m",
    p95: Annotated[float, typer.Option(min=0, help="p95 end-to-end latency limit, seconds.")] = 5.0,
    p99: Annotated[
        float, typer.Option(min=0, help="p99 end-to-end latency limit, seconds.")
    ] = 10.0,
    max_backlog: Annotated[
        int, typer.Option(min=1, help="Ready messages a work queue may hold (below this).")
    ] = 500,
    max_dead: Annotated[
        int, typer.Option(min=0, help="Dead letters a queue may hold before it is a breach.")
    ] = 0,
    max_retried: Annotated[
        int | None,
        typer.Option(
            min=0,
            help=f"Messages retried more than {RETRIED_OVER} times a queue may have "
            "(default: shown, never a breach).",
        ),
    ] = None,
    require_heartbeat: Annotated[
        list[str] | None,
        typer.Option(
            help="A component that must have run recently, e.g. reconciler (repeatable). "
            "Every heartbeat present is judged anyway."
        ),
    ] = None,
    queue: Annotated[
        list[str] | None,
        typer.Option(help="Only these queues (repeatable). Default: every queue in the ledger."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
    database: DatabaseOption = None,
) -> None:
    """Service levels per queue, judged against thresholds; exit 3 on a breach.

    Per queue: p95 and p99 end-to-end latency over the window (from the
    message's publish timestamp, or when the ledger first saw it, to its
    finish), the broker backlog ("unknown" when the broker is unreachable),
    messages retried more than 5 times, and dead letters waiting. Then every
    heartbeat (reconciler, alert deliverer): stale or failing is a breach.

    Exit codes: 0 healthy, 3 a threshold breached, 1 the ledger unreachable,
    2 a usage error. For cron and monitors: rabbitretry status --json
    """
    config = settings()
    since = parse_time(window)
    limits = Thresholds(
        p95=p95,
        p99=p99,
        backlog=max_backlog,
        dead=max_dead,
        retried=max_retried,
        required_heartbeats=tuple(require_heartbeat or ()),
    )
    pool = await db.create_pool(config.database(database), min_size=1, max_size=1)
    try:
        now: datetime = await pool.fetchval(query("status_now"))
        seconds = float(max(0, round((datetime.now(UTC) - since).total_seconds())))
        queues = list(queue or ()) or await levels.known_queues(pool)
        depths = await levels.queue_depths(config.amqp_url, queues)
        measured = await levels.measure(pool, queues, depths, seconds)
        beats = await heartbeat.read_all(pool)
    finally:
        await pool.close()
    report = evaluate(measured, beats, now, limits, seconds)
    if as_json:
        print_json(report.as_json())
    else:
        _print(report)
    if not report.healthy:
        raise typer.Exit(BREACHED_EXIT)


def _print(report: Report) -> None:
    breached = {(b.subject, b.level) for b in report.breaches}

    def cell(subject: str, level: str, text: str) -> str:
        return f"[red]{text}[/red]" if (subject, level) in breached else text

    table = Table(title=f"service levels over the last {_duration(report.window)}")
    for column in (
        "queue",
        "finished",
        "p95",
        "p99",
        "backlog",
        f"retried >{RETRIED_OVER}",
        "dead",
    ):
        table.add_column(column, justify="left" if column == "queue" else "right")
    for q in report.queues:
        table.add_row(
            literal(q.queue),
            str(q.finished),
            cell(q.queue, "p95", _latency(q.p95)),
            cell(q.queue, "p99", _latency(q.p99)),
            cell(q.queue, "backlog", "unknown" if q.backlog is None else str(q.backlog)),
            cell(q.queue, "retried", str(q.retried)),
            cell(q.queue, "dead", str(q.dead)),
        )
    if report.queues:
        out.print(table)
    else:
        out.print("no queues in the ledger yet")
    if report.heartbeats:
        beats = Table(title="heartbeats")
        for column in ("component", "last run", "state"):
            beats.add_column(column)
        for beat in report.heartbeats:
            state = "stale" if beat.stale else "failing" if beat.failing else "ok"
            beats.add_row(
                literal(beat.name),
                "never" if beat.age is None else f"{_duration(beat.age)} ago",
                cell(beat.name, "heartbeat", state),
            )
        out.print(beats)
    _print_verdict(report.breaches)


def _print_verdict(breaches: list[Breach]) -> None:
    if not breaches:
        out.print("[green]healthy[/green]: every level is within its threshold")
        return
    out.print(f"[red]{len(breaches)} breach(es)[/red]:")
    for breach in breaches:
        out.print(literal(f"  {breach}"), highlight=False)


def _latency(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}s"


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:.0f}s"
