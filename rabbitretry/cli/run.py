"""``rabbitretry run``: start a worker."""

from __future__ import annotations

import contextlib
from typing import Annotated

import typer

from rabbitretry.cli.common import configure_logging, load_consumer, run_async, settings
from rabbitretry.delivery.worker import Worker
from rabbitretry.monitoring.metrics import worker_endpoint


@run_async
async def run(
    consumers: Annotated[
        list[str],
        typer.Argument(help="Consumer classes as MODULE:CLASS, e.g. examples.points:AwardPoints"),
    ],
    concurrency: Annotated[
        int,
        typer.Option(
            "--concurrency", "-c", min=1, max=256, help="Consumers per queue (each prefetches 1)."
        ),
    ] = 1,
    declare: Annotated[
        bool,
        typer.Option(
            "--declare", help="Declare the topology first instead of refusing to start without it."
        ),
    ] = False,
    shutdown_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds in-flight attempts may run on after SIGTERM; then they are requeued."
        ),
    ] = 30.0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every delivery.")] = False,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=65535,
            help="Serve Prometheus metrics (/metrics) and health (/healthz) on this port.",
        ),
    ] = None,
    metrics_host: Annotated[
        str,
        typer.Option(help="Interface the metrics port listens on; 0.0.0.0 for every one."),
    ] = "127.0.0.1",
    database: Annotated[
        str | None,
        typer.Option(
            "--database",
            metavar="URL",
            help="The ledger database of consumers that name no database_url of their own "
            "(default: RABBITRETRY_DATABASE_URL).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Consume messages until SIGTERM or Ctrl-C.

    The ledger must be migrated (rabbitretry db migrate) and the topology declared
    (rabbitretry topology declare, or pass --declare). A consumer whose class sets
    database_url keeps its ledger in that database; the others in --database.
    RABBITRETRY_AMQP_URL may list several nodes of a cluster, comma-separated: the worker
    connects to the first that answers and fails over to the next.
    """
    configure_logging(verbose)
    config = settings()
    ledger_database = config.database(database)
    worker = Worker(
        consumers=[load_consumer(target) for target in consumers],
        amqp_url=config.amqp_url,
        database_url=ledger_database,
        concurrency=concurrency,
        shutdown_timeout=shutdown_timeout,
        declare_topology=declare,
    )
    async with contextlib.AsyncExitStack() as stack:
        if metrics_port is not None:
            used = {label: url or ledger_database for url, label in worker.ledger_databases.items()}
            databases = used if len(used) > 1 else ledger_database
            endpoint = worker_endpoint(databases, metrics_port, metrics_host, health=worker.health)
            worker.on_outcome = (await stack.enter_async_context(endpoint)).observe
        await worker.run(install_signal_handlers=True)
