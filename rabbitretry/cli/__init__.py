"""The ``rabbitretry`` command line."""

from __future__ import annotations

import typer

from rabbitretry.cli import (
    alerts,
    console,
    dead,
    jobs,
    ledger,
    migrate,
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
    add_completion=False,
)
app.add_typer(migrate.app, name="db")
app.add_typer(topology.app, name="topology")
app.command("run")(run.run)
app.add_typer(dead.app, name="dead")
app.add_typer(ledger.app, name="ledger")
app.add_typer(outbox.app, name="outbox")
app.command("reconcile")(reconcile.reconcile)
app.add_typer(jobs.app, name="job")
app.add_typer(alerts.app, name="alerts")
app.command("status")(status.status)
app.command("console")(console.console)


def main() -> None:
    app()
