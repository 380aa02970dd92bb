"""Workers that die or are stopped mid-handler, in real subprocesses."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from rabbitretry import Topology
from tests.integration import crash_consumers
from tests.integration.conftest import BrokerCleanup
from tests.integration.harness import is_marked, publish, wait_for, wait_status

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
UNSTARTED_DEATHS_FORGIVEN = 4
CLI = [sys.executable, "-c", "from rabbitretry.cli import main; main()"]


class WorkerProcess:
    """``rabbitretry run`` in a child process, one per call to :meth:`start`."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env = env
        self.log = log  # every start's stderr, for a failing test to show
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, *extra: str) -> None:
        # A file rather than a pipe: nobody reads a pipe here, and a full one would block the
        # worker. The child keeps its own copy of the descriptor once ours is closed.
        with self.log.open("ab") as stderr:
            self.proc = subprocess.Popen(
                [*CLI, "run", "tests.integration.crash_consumers:Crashy", "--declare", *extra],
                cwd=ROOT,
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        self.starts += 1

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    async def exited(self, timeout: float = 30) -> int:
        assert self.proc is not None
        proc = self.proc
        return await asyncio.wait_for(asyncio.to_thread(proc.wait), timeout)


@pytest.fixture
def events(tmp_path: Path) -> Path:
    path = tmp_path / "events.log"
    path.touch()
    return path


@pytest.fixture
def worker_env(amqp_url: str, database_url: str, queue_name: str, events: Path) -> dict[str, str]:
    return {
        **os.environ,
        "RABBITRETRY_AMQP_URL": amqp_url,
        "RABBITRETRY_DATABASE_URL": database_url,
        "RR_TEST_QUEUE": queue_name,
        "RR_EVENTS": str(events),
        "RR_LEASE": "2",
    }


@pytest.fixture
async def worker(
    worker_env: dict[str, str], queue_name: str, broker_cleanup: BrokerCleanup, tmp_path: Path
) -> AsyncIterator[WorkerProcess]:
    process = WorkerProcess(worker_env, tmp_path / "worker.stderr")
    yield process
    process.kill()
    # The worker ran Crashy on this test's queue (RR_TEST_QUEUE): delete what it declared.
    declared = crash_consumers.Crashy.work_queue().model_copy(update={"name": queue_name})
    broker_cleanup.topology(Topology(queues=[declared]))


def event_lines(events: Path, kind: str) -> list[str]:
    return [line for line in events.read_text().splitlines() if line.startswith(kind + " ")]


async def started(events: Path, count: int) -> None:
    async def enough() -> bool:
        return len(event_lines(events, "start")) >= count

    enough.__name__ = f"{count} handler start(s)"
    await wait_for(enough, timeout=30)


async def attempts(pool: asyncpg.Pool, queue: str, key: str) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT attempt, outcome FROM rabbitretry.attempt_history"
        " WHERE queue = $1 AND message_id = $2 ORDER BY attempt",
        queue,
        key,
    )


async def test_sigkill_mid_handler_is_redelivered_and_counted(
    worker: WorkerProcess,
    worker_env: dict[str, str],
    pool: asyncpg.Pool,
    amqp_url: str,
    queue_name: str,
    events: Path,
) -> None:
    worker_env["RR_MODE"] = "hang-first"
    worker.start()
    await publish_when_ready(amqp_url, queue_name, pool, "k1")
    await started(events, 1)
    await wait_for(lambda: is_marked(pool, queue_name, "k1"), timeout=10)
    worker.kill()  # SIGKILL: no cleanup, no ack, no ledger update

    worker.start()
    await wait_status(pool, queue_name, "k1", "succeeded", timeout=30)
    assert [tuple(r) for r in await attempts(pool, queue_name, "k1")] == [
        (1, "crashed"),
        (2, "succeeded"),
    ]
    assert len(event_lines(events, "done")) == 1


async def test_handler_that_always_exits_dies_after_max_attempts(
    worker: WorkerProcess,
    worker_env: dict[str, str],
    pool: asyncpg.Pool,
    amqp_url: str,
    queue_name: str,
    events: Path,
) -> None:
    """A handler that kills its worker once it has run a while: every death counts."""
    worker_env["RR_MODE"] = "exit-marked"
    worker.start()
    await publish_when_ready(amqp_url, queue_name, pool, "k2")
    await restart_until_dead(worker, pool, queue_name, "k2", restarts=8)
    row = await pool.fetchrow(
        "SELECT attempts, reason FROM rabbitretry.ledger WHERE queue = $1 AND message_id = 'k2'",
        queue_name,
    )
    assert row is not None
    assert (row["attempts"], row["reason"]) == (3, "crashed")
    assert [r["outcome"] for r in await attempts(pool, queue_name, "k2")] == ["crashed"] * 3
    assert len(event_lines(events, "start")) == 3  # the handler never ran a fourth time


@pytest.mark.parametrize(
    ("mode", "handler_runs"),
    [("exit-validating", 0), ("exit-always", UNSTARTED_DEATHS_FORGIVEN + 3)],
)
async def test_a_message_that_kills_its_worker_before_the_start_mark_ends_dead(
    worker: WorkerProcess,
    worker_env: dict[str, str],
    pool: asyncpg.Pool,
    amqp_url: str,
    queue_name: str,
    events: Path,
    mode: str,
    handler_runs: int,
) -> None:
    """Deaths before the start mark (in the payload's validation, or in the handler's first
    moment) are forgiven, but only up to a bound: a message that kills every worker there
    would loop for ever otherwise."""
    worker_env.update(RR_MODE=mode, RR_LEASE="1")
    worker.start()
    await publish_when_ready(amqp_url, queue_name, pool, "k5")
    await restart_until_dead(worker, pool, queue_name, "k5", restarts=12)
    row = await pool.fetchrow(
        "SELECT reason, attempts - attempts_forgiven AS charged FROM rabbitretry.ledger"
        " WHERE queue = $1 AND message_id = 'k5'",
        queue_name,
    )
    assert row is not None and tuple(row) == ("crashed", 3)
    log = await pool.fetch(
        "SELECT outcome, error_type, error_message FROM rabbitretry.attempt_history"
        " WHERE queue = $1 AND message_id = 'k5' ORDER BY attempt",
        queue_name,
    )
    forgiven = [r for r in log if r["error_type"] == "NotStarted"]
    charged = [r for r in log if r["error_type"] != "NotStarted"]
    assert len(forgiven) == UNSTARTED_DEATHS_FORGIVEN
    assert [r["outcome"] for r in charged] == ["crashed"] * 3
    assert "before the attempt was marked started" in charged[0]["error_message"]
    assert len(event_lines(events, "start")) == handler_runs
    # Seven deaths; the eighth worker's claim finds the budget spent and the message dead.
    assert worker.starts == UNSTARTED_DEATHS_FORGIVEN + 3 + 1


async def test_sigterm_lets_the_attempt_finish(
    worker: WorkerProcess,
    worker_env: dict[str, str],
    pool: asyncpg.Pool,
    amqp_url: str,
    queue_name: str,
    events: Path,
) -> None:
    worker_env.update(RR_MODE="slow", RR_SLEEP="1.5")
    worker.start("--shutdown-timeout", "20")
    await publish_when_ready(amqp_url, queue_name, pool, "k3")
    await started(events, 1)
    assert worker.proc is not None
    worker.proc.send_signal(signal.SIGTERM)
    assert await worker.exited() == 0
    assert await status_is(pool, queue_name, "k3", "succeeded")
    assert [tuple(r) for r in await attempts(pool, queue_name, "k3")] == [(1, "succeeded")]


async def test_sigterm_past_the_timeout_requeues_without_counting(
    worker: WorkerProcess,
    worker_env: dict[str, str],
    pool: asyncpg.Pool,
    amqp_url: str,
    queue_name: str,
    events: Path,
) -> None:
    worker_env.update(RR_MODE="slow", RR_SLEEP="30")
    worker.start("--shutdown-timeout", "0.5")
    await publish_when_ready(amqp_url, queue_name, pool, "k4")
    await started(events, 1)
    assert worker.proc is not None
    worker.proc.send_signal(signal.SIGTERM)
    assert await worker.exited() == 0
    row = await pool.fetchrow(
        "SELECT status, attempts, attempts_forgiven FROM rabbitretry.ledger"
        " WHERE queue = $1 AND message_id = 'k4'",
        queue_name,
    )
    assert row is not None
    assert tuple(row) == ("retrying", 1, 1)  # requeued, and the attempt does not count
    assert [tuple(r) for r in await attempts(pool, queue_name, "k4")] == [(1, "interrupted")]

    worker_env["RR_SLEEP"] = "0"
    worker.start()
    await wait_status(pool, queue_name, "k4", "succeeded", timeout=30)
    outcomes = [r["outcome"] for r in await attempts(pool, queue_name, "k4")]
    assert outcomes == ["interrupted", "succeeded"]
    assert "dead" not in outcomes


async def publish_when_ready(amqp_url: str, queue: str, pool: asyncpg.Pool, key: str) -> None:
    """Publish once the worker has declared its queue (it runs with --declare)."""

    async def declared() -> bool:
        try:
            await publish(amqp_url, queue, {"n": 1}, message_id=key)
        except Exception:
            return False
        return True

    declared.__name__ = f"queue {queue} declared"
    await wait_for(declared, timeout=30, interval=0.3)


async def status_is(pool: asyncpg.Pool, queue: str, key: str, status: str) -> bool:
    value = await pool.fetchval(
        "SELECT status FROM rabbitretry.ledger WHERE queue = $1 AND message_id = $2", queue, key
    )
    return bool(value == status)


async def restart_until_dead(
    worker: WorkerProcess, pool: asyncpg.Pool, queue: str, key: str, restarts: int
) -> None:
    """Play supervisor: restart the worker each time ``key`` takes it down, at most
    ``restarts`` times. The ledger must end the loop on its own: ``key`` ends dead."""
    for _ in range(restarts):
        await wait_for(lambda: either_dead_or_exited(worker, pool, queue, key), timeout=30)
        if await status_is(pool, queue, key, "dead"):
            break
        worker.start()
    await wait_status(pool, queue, key, "dead", timeout=5)


async def either_dead_or_exited(
    worker: WorkerProcess, pool: asyncpg.Pool, queue: str, key: str
) -> bool:
    assert worker.proc is not None
    return worker.proc.poll() is not None or await status_is(pool, queue, key, "dead")


async def test_a_neighbour_ending_the_process_leaves_no_attempt_charged_without_its_run(
    worker: WorkerProcess,
    worker_env: dict[str, str],
    pool: asyncpg.Pool,
    amqp_url: str,
    queue_name: str,
    events: Path,
) -> None:
    """Handlers call os._exit while seven slots keep starting others: each attempt the ledger
    charges to a dead worker had its handler started (a mark is written only once its
    handler has run a while), and each exit left attempts in flight."""
    worker_env.update(RR_MODE="exit-amid", RR_LEASE="1")
    worker.start("--concurrency", "8")
    await publish_when_ready(amqp_url, queue_name, pool, "warm-up")
    every = NEIGHBOURS // KILLERS  # a killer after every so many neighbours
    for n in range(1, NEIGHBOURS + 1):
        await publish(amqp_url, queue_name, {"n": n}, message_id=f"n-{n}")
        if n % every == 0:
            await publish(amqp_url, queue_name, {"n": 0}, message_id=f"k-{n // every}")
    while worker.starts <= KILLERS:  # play supervisor for the killers' exits
        await wait_for(lambda: worker_exited(worker), timeout=60)
        worker.start("--concurrency", "8")

    async def all_succeeded() -> bool:
        succeeded = await pool.fetchval(
            "SELECT count(*) FROM rabbitretry.ledger WHERE queue = $1 AND status = 'succeeded'",
            queue_name,
        )
        return bool(succeeded == 1 + NEIGHBOURS + KILLERS)

    await wait_for(all_succeeded, timeout=60)
    ran = {tuple(line.split()[1:]) for line in event_lines(events, "start")}
    lapsed = await pool.fetch(
        "SELECT message_id, outcome, attempt - count(*) FILTER ("
        "    WHERE outcome = 'interrupted') OVER (PARTITION BY message_id ORDER BY attempt"
        "    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS budget_attempt"
        " FROM rabbitretry.attempt_history"
        " WHERE queue = $1 AND outcome IN ('crashed', 'interrupted')",
        queue_name,
    )
    assert len(lapsed) >= KILLERS  # each exit left its own attempt open, at least
    charged = [
        (r["message_id"], str(r["budget_attempt"])) for r in lapsed if r["outcome"] == "crashed"
    ]
    assert [pair for pair in charged if pair not in ran] == []


NEIGHBOURS = 800
KILLERS = 4


async def worker_exited(worker: WorkerProcess) -> bool:
    assert worker.proc is not None
    return worker.proc.poll() is not None
