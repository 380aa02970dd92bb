"""One worker process: what ``rabbitretry run`` runs, alone or as one of a supervisor's.

Under a supervisor (``--processes``), the process and the supervisor share a pipe: the
process says ``ready`` once it consumes, and takes ``stop`` and ``abandon`` from it, which do
what a first and a second stop signal do. A stop signal the process gets itself only stops
it, however often it comes: the same stop often arrives twice, from the supervisor and
straight (Ctrl-C reaches the terminal's whole process group, systemd signals every process of
the unit), and only the supervisor knows whether a second signal was sent. A pipe that
closes means the supervisor is gone: the process stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection

import typer

from rabbitretry import logs
from rabbitretry.cli.common import configure_logging, load_consumer, run_async, settings
from rabbitretry.delivery.worker import STOP_SIGNALS, Worker
from rabbitretry.monitoring.metrics import worker_endpoint

READY, STOP, ABANDON = b"ready", b"stop", b"abandon"


@dataclass(frozen=True)
class RunOptions:
    """What one worker process runs: ``rabbitretry run``'s options but ``--processes``."""

    consumers: tuple[str, ...]
    concurrency: int = 1
    declare: bool = False
    shutdown_timeout: float = 30.0
    verbose: bool = False
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    database: str | None = None
    logs: tuple[logs.Level | None, logs.Format] = (None, logs.Format.text)

    def for_process(self, index: int) -> RunOptions:
        """Process ``index``'s options: the metrics port counts up from the one given, and
        the command line's log choice goes along."""
        port = self.metrics_port + index if self.metrics_port else self.metrics_port
        return replace(self, metrics_port=port, logs=logs.chosen())


async def serve(options: RunOptions, pipe: Connection | None = None) -> None:
    """Run one worker until it is stopped: by a signal, or by its supervisor through ``pipe``."""
    configure_logging(options.verbose)
    config = settings()
    ledger_database = config.database(options.database)
    worker = Worker(
        consumers=[load_consumer(target) for target in options.consumers],
        amqp_url=config.amqp_url,
        database_url=ledger_database,
        concurrency=options.concurrency,
        shutdown_timeout=options.shutdown_timeout,
        declare_topology=options.declare,
    )
    async with contextlib.AsyncExitStack() as stack:
        if pipe is not None:
            stack.enter_context(_obeying(pipe, worker))
        if options.metrics_port is not None:
            used = {label: url or ledger_database for url, label in worker.ledger_databases.items()}
            databases = used if len(used) > 1 else ledger_database
            endpoint = worker_endpoint(
                databases, options.metrics_port, options.metrics_host, health=worker.health
            )
            worker.on_outcome = (await stack.enter_async_context(endpoint)).observe
        # Under a supervisor, a second stop signal may be the same stop seen twice; the
        # supervisor counts them, and says when to interrupt.
        try:
            await worker.run(install_signal_handlers=True, signals_escalate=pipe is None)
        finally:
            if pipe is not None:  # a late signal must not turn a clean exit into a traceback
                signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


serve_here = run_async(serve)


@contextlib.contextmanager
def _obeying(pipe: Connection, worker: Worker) -> Iterator[None]:
    """Say ``ready`` on ``pipe`` once ``worker`` consumes; do what the supervisor says."""

    def on_command() -> None:
        try:
            command = pipe.recv_bytes()
        except (EOFError, OSError):
            loop.remove_reader(pipe.fileno())
            worker.signals_escalate = True  # nobody else counts them now
            worker.shut_down("its supervisor is gone")
            return
        if command == STOP:
            worker.shut_down("stop asked by the supervisor")
        elif command == ABANDON:
            worker.interrupt("asked again by the supervisor")

    def ready() -> None:
        with contextlib.suppress(OSError):  # a supervisor gone is seen as the pipe closing
            pipe.send_bytes(READY)

    loop = asyncio.get_running_loop()
    worker.on_started = ready
    loop.add_reader(pipe.fileno(), on_command)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(pipe.fileno())


def child_main(options: RunOptions, pipe: Connection) -> None:
    """A supervised worker process's entry point. It starts with the stop signals blocked
    (the supervisor starts it so): one that comes before the worker's handlers are in waits
    for them instead of killing the process half-started."""
    logs.choose(*options.logs)
    try:
        serve_here(options, pipe)
    except typer.Exit as done:
        sys.exit(done.exit_code)
