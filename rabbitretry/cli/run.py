"""``rabbitretry run``: start a worker."""

from __future__ import annotations

import contextlib
from typing import Annotated

import typer

from rabbitretry.cli.common import configure_logging, load_consumer, run_async, settings
from rabbitretry.delivery.worker import Worker
from rabbitretry.metrics import worker_endpoint


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
) -> None:
    """Consume messages until SIGTERM or Ctrl-C.

    The ledger must be migrated (rabbitretry db migrate) and the topology declared
    (rabbitretry topology declare, or pass --declare).
    """
    configure_logging(verbose)
    config = settings()
    worker = Worker(
        consumers=[load_consumer(target) for target in consumers],
        amqp_url=config.amqp_url,
        database_url=config.database_url,
        concurrency=concurrency,
        shutdown_timeout=shutdown_timeout,
        declare_topology=declare,
    )
    async with contextlib.AsyncExitStack() as stack:
        if metrics_port is not None:
            endpoint = worker_endpoint(
                config.database_url, metrics_port, metrics_host, health=worker.health
            )
            worker.on_outcome = (await stack.enter_async_context(endpoint)).observe
        await worker.run(install_signal_handlers=True)
