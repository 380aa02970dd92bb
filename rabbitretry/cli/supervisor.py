"""``rabbitretry run --processes N``: N worker processes, kept running, stopped together.

One worker process uses one core (its event loop); a machine with more runs more processes,
each with its own connections and consumers on the same queues and ledger. The supervisor
starts them, passes its stop signals on (the first stops them gracefully, the second
interrupts their in-flight attempts, the third kills them), and starts a process again when
it dies, after a pause that doubles while it keeps dying soon after its start. It imports the
consumers itself first, so that a mistake there is said once. A process that fails its first
start fails them all: that is a mistake in the setup (a ledger not migrated, a database that
refuses the connection), the same for every process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import time
from multiprocessing import resource_tracker
from multiprocessing.process import BaseProcess

import typer

from rabbitretry.cli.common import configure_logging, load_consumer, run_async
from rabbitretry.cli.worker_process import ABANDON, READY, STOP, RunOptions, child_main
from rabbitretry.delivery.worker import STOP_SIGNALS

log = logging.getLogger("rabbitretry.supervisor")

HEALTHY_AFTER = 60.0  # seconds a process must live for its next death to count as the first
FIRST_PAUSE = 1.0
LONGEST_PAUSE = 60.0
STUCK_AFTER = 30.0  # seconds past --shutdown-timeout after which a stopping process is killed


def restart_pause(deaths_in_a_row: int) -> float:
    """Seconds to wait before starting a process that died ``deaths_in_a_row`` times, each
    soon after its start: 1, 2, 4, ... up to a minute."""
    return min(LONGEST_PAUSE, FIRST_PAUSE * 2.0 ** max(0, deaths_in_a_row - 1))


class Child:
    """One worker process and its end of the pipe."""

    def __init__(self, options: RunOptions, index: int) -> None:
        self.pipe, theirs = multiprocessing.Pipe()
        # spawn, not fork: a process of its own, with none of the supervisor's state.
        context = multiprocessing.get_context("spawn")
        self.process: BaseProcess = context.Process(
            target=child_main,
            args=(options.for_process(index), theirs),
            name=f"rabbitretry-worker-{index}",
        )
        # The process inherits this mask through fork and exec: a stop signal that reaches it
        # before its worker's handlers are in waits for them (the worker unblocks it). The
        # resource tracker first: starting it unblocks SIGINT and SIGTERM again.
        resource_tracker.ensure_running()
        held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            self.process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            theirs.close()
        self.started_at = time.monotonic()
        self.ready = False

    async def exit_code(self) -> int:
        """Wait for the process to end, noting its ``ready`` on the way; its exit code (128 +
        the number of the signal that killed it, as a shell says it)."""
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()

        def on_end() -> None:
            if not ended.done():  # readable until the reader is removed
                ended.set_result(None)

        watched = _exit_watch(self.process)
        loop.add_reader(watched, on_end)
        loop.add_reader(self.pipe.fileno(), self._on_message)
        try:
            await ended
        finally:
            loop.remove_reader(watched)
            loop.remove_reader(self.pipe.fileno())
            if watched != self.process.sentinel:
                os.close(watched)
        with contextlib.suppress(EOFError, OSError):  # a ready said just before the end
            while self.pipe.poll():
                said = self.pipe.recv_bytes()
                self.ready = self.ready or said == READY
        self.process.join()
        self.pipe.close()
        code = self.process.exitcode
        if code is None:
            return 1
        return 128 - code if code < 0 else code

    def _on_message(self) -> None:
        try:
            if self.pipe.recv_bytes() == READY:
                self.ready = True
        except (EOFError, OSError):
            asyncio.get_running_loop().remove_reader(self.pipe.fileno())

    def tell(self, command: bytes) -> None:
        with contextlib.suppress(OSError):  # it is already gone
            self.pipe.send_bytes(command)

    def lived(self) -> float:
        return time.monotonic() - self.started_at


class Supervisor:
    def __init__(self, options: RunOptions, count: int) -> None:
        self.options = options
        self.count = count
        self.children: dict[int, Child] = {}
        self.signals = 0
        self.stopping = asyncio.Event()

    async def run(self) -> int:
        for target in self.options.consumers:  # a mistake said once, not once per process
            load_consumer(target)
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self._on_signal, sig)
        log.info(
            "starting %d worker processes, concurrency %d each",
            self.count,
            self.options.concurrency,
        )
        try:
            codes = await asyncio.gather(*(self._keep(i) for i in range(self.count)))
        finally:
            for sig in STOP_SIGNALS:
                loop.remove_signal_handler(sig)
            for child in self.children.values():  # only if the supervisor itself failed
                child.process.kill()
        failed = [code for code in codes if code != 0]
        log.info("all worker processes stopped")
        return failed[0] if failed else 0

    async def _keep(self, index: int) -> int:
        """Keep process ``index`` running until the stop; its last exit code."""
        deaths = 0
        first = True
        while not self.stopping.is_set():
            try:
                child = self.children[index] = Child(self.options, index)
            except OSError as error:  # out of processes, memory or file descriptors
                log.error("worker process %d could not be started: %s", index, error)
                deaths, first = deaths + 1, False
                await self._pause(restart_pause(deaths))
                continue
            code = await child.exit_code()
            del self.children[index]
            if self.stopping.is_set():
                return code
            if first and code != 0 and not child.ready:
                log.error(
                    "worker process %d failed to start (%s): stopping the others",
                    index,
                    _ending(code),
                )
                self._stop_all()
                return code
            first = False
            lived = child.lived()
            deaths = 1 if lived >= HEALTHY_AFTER else deaths + 1
            pause = restart_pause(deaths)
            log.log(
                logging.WARNING if code == 0 else logging.ERROR,
                "worker process %d (pid %s) %s (%s) after %.0f s; starting it again in %.0f s",
                index,
                child.process.pid,
                "ended" if code == 0 else "died",
                _ending(code),
                lived,
                pause,
            )
            await self._pause(pause)
        return 0

    async def _pause(self, seconds: float) -> None:
        """Wait ``seconds``, or less if the stop comes."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)

    def _on_signal(self, sig: signal.Signals) -> None:
        self.signals += 1
        if self.signals == 1:
            log.info(
                "%s: stopping %d worker processes (send it again to interrupt their in-flight "
                "attempts)",
                sig.name,
                len(self.children),
            )
            self._stop_all()
        elif self.signals == 2:
            log.warning("%s again: worker processes interrupt their in-flight attempts", sig.name)
            for child in self.children.values():
                child.tell(ABANDON)
        else:
            self._kill(f"{sig.name} a third time")

    def _stop_all(self) -> None:
        self.stopping.set()
        for child in self.children.values():
            child.tell(STOP)
        # A worker process that outlives its own shutdown bound is stuck: end it.
        grace = self.options.shutdown_timeout + STUCK_AFTER
        asyncio.get_running_loop().call_later(grace, self._kill, f"still running {grace:.0f} s on")

    def _kill(self, why: str) -> None:
        if self.children:
            log.warning("%s: killing %d worker processes", why, len(self.children))
        for child in self.children.values():
            child.process.kill()


def _exit_watch(process: BaseProcess) -> int:
    """A file descriptor that turns readable when ``process`` ends: a pidfd where Linux has
    them, else multiprocessing's sentinel, a pipe that a grandchild holding a copy of it (a
    handler's ``os.system("... &")``) would keep open after the process ended."""
    assert process.pid is not None
    try:
        return os.pidfd_open(process.pid)
    except (AttributeError, OSError):
        return process.sentinel


def _ending(code: int) -> str:
    if code > 128:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(code - 128).name}"
    return f"exit code {code}"


async def _supervise(options: RunOptions, count: int) -> int:
    return await Supervisor(options, count).run()


def supervise(options: RunOptions, count: int) -> None:
    """Run ``count`` worker processes until stopped; exit with the first failure's code."""
    configure_logging(options.verbose)
    code = run_async(_supervise)(options, count)
    if code:
        raise typer.Exit(code)
