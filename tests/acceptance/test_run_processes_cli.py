"""``rabbitretry run --processes N``: worker processes that share the work, are started again
when they die, stop together on one signal, and all fail when their first start fails."""

from __future__ import annotations

import os
import re
import signal

import asyncpg
import pytest

from tests.acceptance.cli import Worker, worker
from tests.integration.harness import publish

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


async def consuming_pids(run: Worker, count: int) -> list[int]:
    """The pids of the first ``count`` worker processes to say they consume."""
    lines = await run.wait_for_lines(" consuming ", count)
    return [int(re.search(r"worker \S+:(\d+) consuming", line)[1]) for line in lines]  # type: ignore[index]


async def statuses(pool: asyncpg.Pool, queue: str) -> dict[str, str]:
    rows = await pool.fetch(
        "SELECT message_id, status FROM rabbitretry.ledger WHERE queue = $1", queue
    )
    return {row["message_id"]: row["status"] for row in rows}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_worker_processes_share_a_queue_and_stop_together(
    amqp_url: str, database_url: str, pool: asyncpg.Pool, slow_queue: str
) -> None:
    async with worker(
        amqp_url, database_url, slow_queue, "-p", "2", group=True, RR_SLOW_SECONDS="1"
    ) as run:
        pids = await consuming_pids(run, 2)
        assert len(set(pids)) == 2 and run.process.pid not in pids
        # Two deliveries at once, each handler a second long: each process (one consumer
        # each, prefetch 1) holds one of them.
        for n in range(2):
            await publish(amqp_url, slow_queue, {"n": n}, message_id=f"m-{n}")
        await run.wait_for_lines("handling m-", 2)
        workers = await pool.fetch(
            "SELECT worker FROM rabbitretry.ledger WHERE queue = $1", slow_queue
        )
        assert {row["worker"].split(":")[1] for row in workers} == {str(pid) for pid in pids}

        run.process.send_signal(signal.SIGTERM)
        assert await run.exit_code(timeout=30) == 0
    assert await statuses(pool, slow_queue) == {"m-0": "succeeded", "m-1": "succeeded"}
    assert any("SIGTERM: stopping 2 worker processes" in line for line in run.log), run.log
    assert run.log[-1].endswith("all worker processes stopped"), run.log
    assert not any(alive(pid) for pid in pids)


async def test_one_ctrl_c_to_the_terminal_lets_in_flight_attempts_finish(
    amqp_url: str, database_url: str, pool: asyncpg.Pool, slow_queue: str
) -> None:
    """Ctrl-C signals every process of the terminal's group (systemd, every process of the
    unit): a worker process gets the stop twice, from its supervisor and straight, in either
    order, and that is one stop. Here the straight copy comes last, the order in which a
    worker process would take it for a second Ctrl-C."""
    async with worker(
        amqp_url, database_url, slow_queue, "-p", "2", group=True, RR_SLOW_SECONDS="2"
    ) as run:
        pids = await consuming_pids(run, 2)
        await publish(amqp_url, slow_queue, {"n": 1}, message_id="m-1")
        await run.wait_for_line("handling m-1")

        run.process.send_signal(signal.SIGINT)
        await run.wait_for_lines("stop asked by the supervisor", 2)
        for pid in pids:
            os.kill(pid, signal.SIGINT)
        assert await run.exit_code(timeout=30) == 0
    assert await statuses(pool, slow_queue) == {"m-1": "succeeded"}
    assert not any("no longer waiting" in line for line in run.log), run.log


async def test_a_second_ctrl_c_interrupts_the_in_flight_attempts_of_every_process(
    amqp_url: str, database_url: str, pool: asyncpg.Pool, slow_queue: str
) -> None:
    args = ("-p", "2", "--shutdown-timeout", "300")
    async with worker(amqp_url, database_url, slow_queue, *args, group=True) as run:
        await consuming_pids(run, 2)
        await publish(amqp_url, slow_queue, {"n": 1}, message_id="m-1")
        await run.wait_for_line("handling m-1")

        os.killpg(run.process.pid, signal.SIGINT)
        await run.wait_for_line("waiting up to 300 s for 1 in-flight attempt(s)")
        assert run.process.returncode is None  # still waiting for the attempt
        os.killpg(run.process.pid, signal.SIGINT)
        assert await run.exit_code(timeout=30) == 0
    assert any("SIGINT again: worker processes interrupt" in line for line in run.log), run.log
    outcome = await pool.fetchval(
        "SELECT outcome FROM rabbitretry.attempt_history WHERE queue = $1 AND message_id = 'm-1'",
        slow_queue,
    )
    assert outcome == "interrupted"


async def test_a_worker_process_that_dies_is_started_again(
    amqp_url: str, database_url: str, pool: asyncpg.Pool, slow_queue: str
) -> None:
    async with worker(
        amqp_url, database_url, slow_queue, "-p", "2", group=True, RR_SLOW_SECONDS="0"
    ) as run:
        first, second = await consuming_pids(run, 2)
        os.kill(first, signal.SIGKILL)
        died = await run.wait_for_line("died")
        assert re.search(
            rf"worker process \d \(pid {first}\) died \(killed by SIGKILL\) after \d+ s; "
            r"starting it again in 1 s",
            died,
        ), died
        *_, replacement = await consuming_pids(run, 3)
        assert replacement not in (first, second)

        await publish(amqp_url, slow_queue, {"n": 1}, message_id="m-1")
        await run.wait_for_line("handling m-1")
        run.process.send_signal(signal.SIGTERM)
        assert await run.exit_code(timeout=30) == 0
    assert await statuses(pool, slow_queue) == {"m-1": "succeeded"}


async def test_a_failed_first_start_stops_every_process(
    amqp_url: str, database_url: str, slow_queue: str
) -> None:
    # A ledger nobody migrated: the same mistake for every process.
    admin = await asyncpg.connect(database_url)
    try:
        await admin.execute("DROP SCHEMA rabbitretry CASCADE")
    finally:
        await admin.close()
    async with worker(amqp_url, database_url, slow_queue, "-p", "3", group=True) as run:
        assert await run.exit_code(timeout=60) == 1
    assert any("the ledger schema is not up to date" in line for line in run.log), run.log
    assert any("failed to start (exit code 1): stopping the others" in line for line in run.log)
    assert not any("Traceback" in line for line in run.log), run.log
    assert not any("starting it again" in line for line in run.log), run.log


async def test_worker_processes_whose_supervisor_is_killed_stop_by_themselves(
    amqp_url: str, database_url: str, slow_queue: str
) -> None:
    async with worker(amqp_url, database_url, slow_queue, "-p", "2", group=True) as run:
        pids = await consuming_pids(run, 2)
        run.process.kill()
        # The worker processes hold the same stderr: it ends when the last of them exits.
        assert await run.exit_code(timeout=30) == -signal.SIGKILL
    gone = [line for line in run.log if "its supervisor is gone, stopping" in line]
    assert len(gone) == 2, run.log
    assert sum(line.endswith(f"{pid} stopped") for line in run.log for pid in pids) == 2


async def test_a_stop_during_the_worker_processes_start_ends_it_cleanly(
    amqp_url: str, database_url: str, slow_queue: str
) -> None:
    """Ctrl-C reaches worker processes still importing their consumer: the signal waits for
    their handlers instead of killing them with a traceback."""
    async with worker(
        amqp_url, database_url, slow_queue, "-p", "2", group=True, RR_SLOW_IMPORT="1"
    ) as run:
        await run.wait_for_lines("slow import started", 3)  # the supervisor's check, then each
        os.killpg(run.process.pid, signal.SIGINT)
        assert await run.exit_code(timeout=30) == 0
    assert not any("Traceback" in line or "KeyboardInterrupt" in line for line in run.log)
    assert run.log[-1].endswith("all worker processes stopped"), run.log


async def test_a_worker_process_stopped_on_its_own_is_started_again(
    amqp_url: str, database_url: str, slow_queue: str
) -> None:
    async with worker(amqp_url, database_url, slow_queue, "-p", "2", group=True) as run:
        first, _ = await consuming_pids(run, 2)
        os.kill(first, signal.SIGTERM)
        ended = await run.wait_for_line(f"(pid {first}) ended")
        assert "ended (exit code 0)" in ended and "starting it again in 1 s" in ended, ended
        await consuming_pids(run, 3)
        run.process.send_signal(signal.SIGTERM)
        assert await run.exit_code(timeout=30) == 0
