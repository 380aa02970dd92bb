"""``rabbitretry reconcile``: re-drive what the broker dropped, compare expected with actual."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import Annotated, Any

import typer
from rich.table import Table

from rabbitretry import db
from rabbitretry.cli.common import (
    DatabasesOption,
    UserError,
    VerboseOption,
    configure_logging,
    literal,
    load_attribute,
    out,
    print_json,
    run_async,
    settings,
    shown,
)
from rabbitretry.consumer import Consumer
from rabbitretry.operations import parse_rate
from rabbitretry.reconcile.expected import Reconciliation
from rabbitretry.reconcile.reconciler import Reconciler, RunReport
from rabbitretry.urls import mask_url

TARGET_SHAPE = "MODULE:NAME (a Consumer class or a Reconciliation, e.g. myapp.orders:paid_orders)"


@run_async
async def reconcile(
    targets: Annotated[
        list[str] | None,
        typer.Argument(
            help="Consumer classes (for their expires_after) and reconciliations, as "
            "MODULE:NAME. Without any, the ledger and outbox scans still cover every queue.",
        ),
    ] = None,
    once: Annotated[bool, typer.Option("--once", help="Run one pass, print it, exit.")] = False,
    interval: Annotated[
        float | None,
        typer.Option(min=1, help="Run a pass every SECONDS until SIGTERM or Ctrl-C."),
    ] = None,
    grace: Annotated[
        float,
        typer.Option(
            min=1,
            help="Seconds a retry may be overdue, or a lease expired, before its copy counts "
            "as lost. Keep it above the usual queue backlog: a re-drive while the copy is "
            "merely slow only costs a duplicate the ledger drops.",
        ),
    ] = 30.0,
    batch_size: Annotated[int, typer.Option(min=1, max=10_000, help="Rows per batch.")] = 100,
    max_batches: Annotated[
        int, typer.Option(min=1, help="Batches per scan and pass; the rest waits a pass.")
    ] = 10,
    rate: Annotated[
        str,
        typer.Option(
            help="At most this many re-published messages a second: 200 or 200/s, or a "
            "minute: 600/m."
        ),
    ] = "200/s",
    verbose: VerboseOption = False,
    database: DatabasesOption = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print each pass as one line of JSON on stdout (counts, errors, and per "
            "reconciliation the missing and orphaned keys) instead of tables.",
        ),
    ] = False,
) -> None:
    """Find work the broker lost and re-drive it from the ledger; check expected messages.

    Re-drives retries whose delay copy never came back, attempts whose worker died and whose
    delivery was lost, and outbox rows no relay published; marks work past its consumer's
    expires_after as skipped. For each reconciliation, reports expected, succeeded, in
    flight, missing (re-published under their key) and orphaned keys.

    Safe to run on several machines at once. --once exits 1 if anything failed or an
    orphan was found, so cron can alert on it.

    Ledgers spread over several databases: each --database is reconciled (by default
    RABBITRETRY_DATABASE_URL and the database_url of each consumer named), one reconciler
    per database; a reconciliation runs in the database of its queue's consumer.

    With --json, every pass (one with --once, one per interval otherwise) is one line of
    JSON: the repair counts, errors, and per reconciliation window its counts with
    missing_keys (up to 1000) and orphan_examples.
    """
    if once == (interval is not None):
        raise UserError("say --once, or --interval SECONDS to keep running")
    per_second = parse_rate(rate)
    consumers, reconciliations = _load(targets or [])
    configure_logging(verbose)
    config = settings()
    default = config.database_url if not database else None
    try:
        shares = ledger_shares(config.databases(database), default, consumers, reconciliations)
    except ValueError as error:
        raise UserError(str(error)) from None
    amqp_url = config.amqp_url
    async with contextlib.AsyncExitStack() as stack:
        reconcilers = []
        for url, share in shares.items():
            pool = await db.create_pool(url, min_size=1, max_size=2)
            stack.push_async_callback(pool.close)
            reconciler = (_JsonReconciler if as_json else Reconciler)(
                pool,
                amqp_url,
                consumers=consumers,
                reconciliations=share,
                batch_size=batch_size,
                max_batches=max_batches,
                publish_rate=per_second,
                grace=grace,
            )
            stack.push_async_callback(reconciler.close)
            reconcilers.append(reconciler)
        if interval is not None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                for reconciler in reconcilers:
                    loop.add_signal_handler(sig, reconciler.stop)
            await asyncio.gather(*(r.run(interval) for r in reconcilers))
            return
        reports = [await reconciler.run_once() for reconciler in reconcilers]
    failed = False
    for url, report in zip(shares, reports, strict=True):
        if not as_json:
            if len(shares) > 1:
                out.print(f"[bold]{mask_url(url)}[/bold]", highlight=False)
            print_report(report)
        failed = failed or bool(report.errors or report.orphaned)
    if failed:
        raise typer.Exit(1)


def ledger_shares(
    databases: list[str],
    default: str | None,
    consumers: list[type[Consumer[Any]]],
    reconciliations: list[Reconciliation],
) -> dict[str, list[Reconciliation]]:
    """Each ledger database to reconcile, with the reconciliations that run in it.

    ``default`` (the variable's database, when no --database was given) comes with the
    databases the consumers name. A reconciliation runs in the database of its queue's
    consumer (the default one when no consumer named handles its queue): only there does
    the ledger hold that queue's keys; elsewhere all would look missing and be re-published.
    """
    if default is not None:
        databases = list(dict.fromkeys([default, *(c.database_url or default for c in consumers)]))
    home = dict((c.queue, c.database_url) for c in consumers if c.database_url)
    shares: dict[str, list[Reconciliation]] = {url: [] for url in databases}
    for reconciliation in reconciliations:
        url = home.get(reconciliation.queue) or default or databases[0]
        if url not in shares:
            raise ValueError(
                f"reconciliation {reconciliation.name!r} is for queue {reconciliation.queue!r}, "
                f"whose ledger is in {mask_url(url)}: add --database for it"
            )
        shares[url].append(reconciliation)
    return shares


class _JsonReconciler(Reconciler):
    """Prints every pass as it ends, as one line of JSON."""

    async def run_once(self) -> RunReport:
        report = await super().run_once()
        print_json(report_json(report))
        return report


def report_json(report: RunReport) -> dict[str, Any]:
    """One pass as JSON: the heartbeat counts, the errors, and each window with its keys."""
    return {
        **report.counts(),
        "errors": list(report.errors),
        "windows": [
            {
                "reconciliation": w.name,
                "queue": w.queue,
                "start": w.start,
                "end": w.end,
                "expected": w.expected,
                "succeeded": w.succeeded,
                "in_flight": w.in_flight,
                "dead": w.dead,
                "skipped": w.skipped,
                "missing": w.missing,
                "missing_keys": w.missing_keys,
                "republished": w.republished,
                "orphaned": w.orphaned,
                "orphan_examples": w.orphan_examples,
            }
            for w in report.windows
        ],
    }


def _load(targets: list[str]) -> tuple[list[type[Consumer[Any]]], list[Reconciliation]]:
    consumers: list[type[Consumer[Any]]] = []
    reconciliations: list[Reconciliation] = []
    for target in targets:
        found = load_attribute(target, TARGET_SHAPE)
        if isinstance(found, Reconciliation):
            reconciliations.append(found)
        elif isinstance(found, type) and issubclass(found, Consumer):
            consumers.append(found)
        else:
            raise UserError(f"{target} is neither a Consumer class nor a Reconciliation")
    return consumers, reconciliations


def print_report(report: RunReport) -> None:
    repairs = Table(title="reconciler pass")
    repairs.add_column("repair")
    repairs.add_column("messages", justify="right")
    repairs.add_row("overdue retries re-driven", str(report.retries_redriven))
    repairs.add_row("expired leases re-driven", str(report.leases_redriven))
    repairs.add_row("stuck outbox rows published", str(report.outbox_published))
    repairs.add_row("expired work skipped", str(report.expired_skipped))
    repairs.add_row("broker dead letters recorded", str(report.broker_dead_recorded))
    repairs.add_row("errors", str(len(report.errors)))
    out.print(repairs)
    for error in report.errors[:20]:
        out.print(f"[red]error:[/red] {shown(error)}", highlight=False)
    if not report.windows:
        return
    windows = Table(title="expected vs actual")
    columns = ("reconciliation", "queue", "window (UTC)", "expected", "succeeded", "in flight")
    for column in (*columns, "dead", "skipped", "missing", "re-published", "orphaned"):
        windows.add_column(column, justify="left" if column in columns[:3] else "right")
    for w in windows_of(report):
        windows.add_row(*map(literal, w))
    out.print(windows)
    for window in report.windows:
        if window.orphaned:
            out.print(
                f"[yellow]{window.orphaned} orphan(s) in {shown(window.queue)}[/yellow] "
                f"(succeeded, never expected by {shown(window.name)}): "
                f"{shown(', '.join(window.orphan_examples))}",
                highlight=False,
            )


def windows_of(report: RunReport) -> list[list[str]]:
    rows = []
    for w in report.windows:
        span = f"{w.start:%Y-%m-%d %H:%M:%S} → {w.end:%H:%M:%S}"
        numbers = (w.expected, w.succeeded, w.in_flight, w.dead, w.skipped, w.missing)
        rows.append(
            [w.name, w.queue, span, *map(str, numbers), str(w.republished), str(w.orphaned)]
        )
    return rows
