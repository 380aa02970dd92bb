"""``rabbitretry run``: start a worker, or several worker processes under a supervisor."""

from __future__ import annotations

from typing import Annotated

import typer

from rabbitretry.cli import supervisor
from rabbitretry.cli.common import fail, flowing
from rabbitretry.cli.worker_process import RunOptions, serve_here


def run(
    consumers: Annotated[
        list[str],
        typer.Argument(help="Consumer classes as MODULE:CLASS, e.g. examples.points:AwardPoints"),
    ],
    concurrency: Annotated[
        int,
        typer.Option(
            "--concurrency",
            "-c",
            min=1,
            max=256,
            help="Consumers per queue in each process (each prefetches 1).",
        ),
    ] = 1,
    processes: Annotated[
        int,
        typer.Option(
            "--processes",
            "-p",
            min=1,
            max=64,
            help="Worker processes, each with --concurrency consumers per queue; one per core "
            "uses the machine. More than 1 runs them under a supervisor that restarts one "
            "that dies.",
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
            help="Serve Prometheus metrics (/metrics) and health (/healthz) on this port; "
            "with --processes N, process i on this port + i.",
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

    One process uses one core: on a bigger machine, --processes 4 --concurrency 8 runs four worker
    processes of 8 consumers per queue each. The first SIGTERM or Ctrl-C stops them all
    gracefully, a second interrupts their in-flight attempts; a process that dies is started
    again, and one that fails its first start stops them all.
    """
    options = RunOptions(
        tuple(consumers),
        concurrency,
        declare,
        shutdown_timeout,
        verbose,
        metrics_port,
        metrics_host,
        database,
    )
    if metrics_port and metrics_port + processes - 1 > 65535:
        fail(
            f"--metrics-port {metrics_port} with --processes {processes} needs ports up to "
            f"{metrics_port + processes - 1}: choose a port at most {65536 - processes}",
            2,
        )
    if processes == 1:
        serve_here(options)
    else:
        supervisor.supervise(options, processes)


run.__doc__ = flowing(run.__doc__)
