"""Keeps one ``rabbitretry run`` worker process alive, as systemd's ``Restart=always`` would.

When the worker dies (killed, crashed by a message, or unable to start while a service is
away) it is started again after a short pause. The drill kills it through :meth:`kill`.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections import Counter
from pathlib import Path

RESTART_PAUSE = 0.2  # seconds: systemd's RestartSec is 100 ms by default
FAILED_START_PAUSE = 1.0  # a worker that could not start (a service is away) waits longer
START_FAILED = 1  # the exit code of ``rabbitretry run`` on an error (not a kill or a crash)
KILL_TRIES = 5  # workers tried in turn until one dies of the SIGKILL itself

# Same interpreter and environment as the drill: the console script need not be on PATH.
CLI = (sys.executable, "-c", "from rabbitretry.cli import main; main()")


class Supervisor:
    def __init__(
        self, consumer: str, env: dict[str, str], log_path: Path, *, concurrency: int, cwd: Path
    ) -> None:
        self.command = (*CLI, "run", consumer, "--concurrency", str(concurrency))
        self.env = env
        self.log_path = log_path
        self.cwd = cwd
        self.exits: Counter[int] = Counter()
        """How often the worker exited with each return code (-9 is SIGKILL)."""
        self._process: asyncio.subprocess.Process | None = None
        self._started = asyncio.Event()  # set each time a worker process starts
        self._task: asyncio.Task[None] | None = None

    @property
    def starts(self) -> int:
        return sum(self.exits.values()) + (1 if self._process is not None else 0)

    def start(self) -> None:
        self._task = asyncio.create_task(self._keep_alive())

    async def _keep_alive(self) -> None:
        with self.log_path.open("ab") as log:
            while True:
                self._process = await asyncio.create_subprocess_exec(
                    *self.command, cwd=self.cwd, env=self.env, stdout=log, stderr=log
                )
                self._started.set()
                code = await self._process.wait()
                self._process = None
                self.exits[code] += 1
                await asyncio.sleep(FAILED_START_PAUSE if code == START_FAILED else RESTART_PAUSE)

    async def kill(self) -> int:
        """SIGKILL the running worker (waiting for one to be running); its pid.

        A worker that was already exiting on its own (a service away at its start) is not
        killed by the signal; the next one is, so every kill the drill asks for happens.
        """
        previous = None
        for _ in range(KILL_TRIES):
            while self._process is None or self._process is previous:
                self._started.clear()  # no await since the check: no start is missed
                await self._started.wait()
            process = previous = self._process
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGKILL)
            if await process.wait() == -signal.SIGKILL:
                return process.pid
        raise RuntimeError(f"no worker died of a SIGKILL in {KILL_TRIES} tries")

    async def stop(self) -> None:
        """Stop restarting, and SIGKILL the worker if one runs: nothing outlives the drill."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        process = self._process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
