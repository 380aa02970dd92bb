"""Run ``rabbitretry`` in a subprocess against given services."""

from __future__ import annotations

import asyncio
import os
import sys
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
