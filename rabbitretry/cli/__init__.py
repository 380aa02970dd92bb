"""The ``rabbitretry`` command line."""

from __future__ import annotations

from typing import Annotated

import typer

from rabbitretry import __version__, logs
from rabbitretry.cli import (
    alerts,
    callbacks,
    console,
    database,
    dead,
    downstream,
    job,
    ledger,
    outbox,
    reconcile,
    run,
    status,
    topology,
)

app = typer.Typer(
    name="rabbitretry",
    help=(
        "Consume RabbitMQ messages without losing any: a Postgres ledger counts every attempt, "
        "failures are retried with backoff through delay queues, and what cannot succeed is kept "
        "as a dead letter you can inspect and replay.\n\n"
        "Connections come from RABBITRETRY_AMQP_URL and RABBITRETRY_DATABASE_URL "
        "(default: the local services)."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"rabbitretry {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    log_level: Annotated[
        logs.Level | None,
        typer.Option(
            envvar="RABBITRETRY_LOG_LEVEL",
            case_sensitive=False,
            help="Log this level and above (default info; a command's -v means debug).",
            show_default=False,
        ),
    ] = None,
    log_format: Annotated[
        logs.Format,
        typer.Option(
            envvar="RABBITRETRY_LOG_FORMAT",
            case_sensitive=False,
            help="text, or json: one JSON object per line, for log pipelines.",
        ),
    ] = logs.Format.text,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    logs.choose(log_level, log_format)


app.add_typer(database.app, name="db")
app.add_typer(topology.app, name="topology")
app.command("run")(run.run)
app.add_typer(dead.app, name="dead")
app.add_typer(ledger.app, name="ledger")
app.add_typer(outbox.app, name="outbox")
app.command("reconcile")(reconcile.reconcile)
app.add_typer(job.app, name="job")
app.add_typer(alerts.app, name="alerts")
app.command("status")(status.status)
app.command("console")(console.console)
app.add_typer(callbacks.app, name="callbacks")
app.add_typer(downstream.app, name="downstream")


def main() -> None:
    app(prog_name="rabbitretry")
