"""Run ``rabbitretry`` in a subprocess against given services."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-c", "from rabbitretry.cli import main; main()"]


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str


def env_for(amqp_url: str, database_url: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "RABBITRETRY_AMQP_URL": amqp_url,
        "RABBITRETRY_DATABASE_URL": database_url,
        "COLUMNS": "200",
        **extra,
    }


async def rabbitretry(env: dict[str, str], *args: str, timeout: float = 60) -> Result:
    """Run the CLI without blocking the event loop (a test's HTTP receiver keeps serving)."""
    proc = await asyncio.create_subprocess_exec(
        *CLI,
        *args,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return Result(proc.returncode, stdout.decode(), stderr.decode())


class Worker:
    """A ``rabbitretry run`` subprocess and what it has logged so far."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.log: list[str] = []

    async def wait_for_line(self, text: str, timeout: float = 60) -> str:
        """The first line (logged so far or next) that contains ``text``."""
        return (await self.wait_for_lines(text, 1, timeout))[0]

    async def wait_for_lines(self, text: str, count: int, timeout: float = 60) -> list[str]:
        """The first ``count`` lines (logged so far or next) that contain ``text``."""
        async with asyncio.timeout(timeout):
            found = [line for line in self.log if text in line]
            assert self.process.stderr is not None
            while len(found) < count and (raw := await self.process.stderr.readline()):
                line = raw.decode().rstrip("\n")
                self.log.append(line)
                if text in line:
                    found.append(line)
        if len(found) < count:
            raise AssertionError(
                f"the worker exited with {len(found)} of {count} lines with {text!r}:\n"
                + "\n".join(self.log)
            )
        return found[:count]

    async def exit_code(self, timeout: float) -> int:
        assert self.process.stderr is not None
        async with asyncio.timeout(timeout):
            rest = await self.process.stderr.read()
            self.log += rest.decode().splitlines()
            return await self.process.wait()


@asynccontextmanager
async def worker(
    amqp_url: str, database_url: str, queue: str, *args: str, group: bool = False, **env: str
) -> AsyncIterator[Worker]:
    """``rabbitretry run tests.acceptance.slow:Slow --declare ARGS`` on ``queue``; with
    ``group``, in a process group of its own (for a Ctrl-C that reaches every process)."""
    process = await asyncio.create_subprocess_exec(
        *CLI,
        "run",
        "tests.acceptance.slow:Slow",
        "--declare",
        *args,
        cwd=ROOT,
        env={
            **os.environ,
            "RABBITRETRY_AMQP_URL": amqp_url,
            "RABBITRETRY_DATABASE_URL": database_url,
            "RR_SLOW_QUEUE": queue,
            **env,
        },
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=group,
    )
    try:
        yield Worker(process)
    finally:
        if group:  # the worker processes a supervisor started too
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        elif process.returncode is None:
            process.kill()
        await process.wait()
