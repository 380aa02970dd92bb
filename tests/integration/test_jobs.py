"""Scheduled jobs against the real database: overlap lock, failures, resumable checkpoints."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import asyncpg

from rabbitretry.monitoring import heartbeat
from rabbitretry.scheduled_jobs import JobContext, job, run_job
from tests.integration import job_fixtures
from tests.integration.harness import wait_for

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-c", "from rabbitretry.cli import main; main()"]


def start_job(target: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, "job", "run", target],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def finished(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    stdout, stderr = await asyncio.wait_for(asyncio.to_thread(proc.communicate), 60)
    return proc.returncode, stdout, stderr


async def test_a_job_started_twice_runs_once_and_the_second_start_exits_0(
    database_url: str, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    started, release = tmp_path / "started", tmp_path / "release"
    env = {
        **os.environ,
        "RABBITRETRY_DATABASE_URL": database_url,
        "RR_JOB_STARTED": str(started),
        "RR_JOB_RELEASE": str(release),
    }
    first = start_job("tests.integration.job_fixtures:blocking", env)
    try:

        async def first_is_running() -> bool:
            assert first.poll() is None, first.communicate()
            return started.exists()

        await wait_for(first_is_running, timeout=30)
        started.unlink()

        code, stdout, stderr = await finished(
            start_job("tests.integration.job_fixtures:blocking", env)
        )
        assert code == 0, stderr
        assert "already running" in stdout
        assert not started.exists()  # the second start never ran the job

        release.touch()
        code, stdout, stderr = await finished(first)
        assert code == 0, stderr
        assert "job blocking done: ran 1" in stdout
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
    (beat,) = await heartbeat.read_all(pool)
    assert (beat.name, beat.ok, beat.counts) == ("blocking", True, {"ran": 1})


async def test_the_lock_is_free_again_after_a_run(pool: asyncpg.Pool) -> None:
    first = await run_job(pool, job_fixtures.crashing)
    second = await run_job(pool, job_fixtures.crashing)
    assert (first.status, second.status) == ("failed", "failed")  # both ran: no stale lock


async def test_a_crashing_job_is_recorded_as_failed(pool: asyncpg.Pool) -> None:
    outcome = await run_job(pool, job_fixtures.crashing)
    assert outcome.status == "failed"
    assert outcome.error == "RuntimeError: the report service is down"
    (beat,) = await heartbeat.read_all(pool)
    assert beat.name == "crashing" and beat.failing
    assert beat.error == "RuntimeError: the report service is down"
    assert beat.expected_every == 60


async def test_a_crashing_job_exits_1_from_the_command_line(database_url: str) -> None:
    env = {**os.environ, "RABBITRETRY_DATABASE_URL": database_url}
    code, _, stderr = await finished(start_job("tests.integration.job_fixtures:crashing", env))
    assert code == 1
    assert "job crashing failed: RuntimeError: the report service is down" in stderr
    assert "Traceback" not in stderr.split("error:")[-1]


async def test_a_job_resumes_from_its_checkpoint_after_a_crash(pool: asyncpg.Pool) -> None:
    processed: list[int] = []
    crashes_left = [1]  # the first run dies at item 3

    @job(every=60)
    async def numbered(ctx: JobContext) -> dict[str, int]:
        for item in range(ctx.checkpoint or 1, 6):
            if item == 3 and crashes_left:
                crashes_left.pop()
                raise ConnectionError("lost the downstream mid-run")
            processed.append(item)
            await ctx.save(item + 1)
        await ctx.clear()
        return {"processed": len(processed)}

    assert (await run_job(pool, numbered)).status == "failed"
    assert processed == [1, 2]
    assert (
        await pool.fetchval(
            "SELECT checkpoint FROM rabbitretry.job_checkpoint WHERE name = 'numbered'"
        )
        == "3"
    )

    assert (await run_job(pool, numbered)).status == "ran"
    assert processed == [1, 2, 3, 4, 5]  # resumed at 3: nothing done twice, nothing skipped
    assert await pool.fetchval("SELECT count(*) FROM rabbitretry.job_checkpoint") == 0
