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
        self._running = asyncio.Event()
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
                self._running.set()
                code = await self._process.wait()
                self._running.clear()
                self._process = None
                self.exits[code] += 1
                await asyncio.sleep(FAILED_START_PAUSE if code == START_FAILED else RESTART_PAUSE)

    async def kill(self) -> int:
        """SIGKILL the running worker (waiting for one to be running); its pid."""
        await self._running.wait()
        process = self._process
        assert process is not None
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGKILL)
        return process.pid

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
