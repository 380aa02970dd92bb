"""``rabbitretry run`` and signals: SIGHUP stops like SIGTERM, a second Ctrl-C stops waiting,
and a signal during start-up ends the start-up."""

from __future__ import annotations

import signal

import asyncpg
import pytest

from tests.acceptance.cli import worker
from tests.integration.harness import publish

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


async def test_a_second_ctrl_c_interrupts_the_in_flight_attempts(
    amqp_url: str, database_url: str, pool: asyncpg.Pool, slow_queue: str
) -> None:
    async with worker(amqp_url, database_url, slow_queue, "--shutdown-timeout", "300") as run:
        await run.wait_for_line("consuming")
        await publish(amqp_url, slow_queue, {"n": 1}, message_id="m-1")
        await run.wait_for_line("handling m-1")

        run.process.send_signal(signal.SIGINT)
        stopping = await run.wait_for_line("stopping")
        assert "SIGINT, stopping (send it again to interrupt in-flight attempts)" in stopping
        await run.wait_for_line("waiting up to 300 s for 1 in-flight attempt(s)")
        assert run.process.returncode is None  # still waiting for the attempt

        run.process.send_signal(signal.SIGINT)
        assert await run.exit_code(timeout=30) == 0
    abandoned = [line for line in run.log if "SIGINT again" in line]
    assert len(abandoned) == 1, run.log
    assert abandoned[0].endswith(
        "SIGINT again, no longer waiting: 1 in-flight attempt(s) interrupted now, their "
        "deliveries requeued (not counted against their budget)"
    )
    outcome = await pool.fetchval(
        "SELECT outcome FROM rabbitretry.attempt_history WHERE queue = $1 AND message_id = 'm-1'",
        slow_queue,
    )
    assert outcome == "interrupted"
    # Requeued, due again at once, and the interrupted attempt not counted against the budget.
    row = await pool.fetchrow(
        "SELECT status, attempts_forgiven FROM rabbitretry.ledger"
        " WHERE queue = $1 AND message_id = 'm-1'",
        slow_queue,
    )
    assert (row["status"], row["attempts_forgiven"]) == ("retrying", 1)


async def test_sighup_stops_the_worker_like_sigterm(
    amqp_url: str, database_url: str, slow_queue: str
) -> None:
    async with worker(amqp_url, database_url, slow_queue) as run:
        consuming = await run.wait_for_line("consuming")
        assert consuming.endswith("(event loop: asyncio)")
        run.process.send_signal(signal.SIGHUP)
        assert await run.exit_code(timeout=30) == 0
    assert any("SIGHUP, stopping" in line for line in run.log), run.log
    assert any(line.endswith("stopped") for line in run.log), run.log


async def test_a_signal_during_start_up_ends_it(
    amqp_url: str, database_url: str, slow_queue: str
) -> None:
    async with worker(amqp_url, database_url, slow_queue, RR_SLOW_SETUP="1") as run:
        await run.wait_for_line("slow setup started")
        run.process.send_signal(signal.SIGTERM)
        assert await run.exit_code(timeout=30) == 0
    assert any("SIGTERM during start-up, giving up" in line for line in run.log), run.log
    assert any("stopped before it started consuming" in line for line in run.log), run.log
    assert not any("Traceback" in line for line in run.log), run.log


async def test_the_event_loop_is_chosen_by_rabbitretry_event_loop(
    amqp_url: str, database_url: str, slow_queue: str
) -> None:
    env = {"RABBITRETRY_EVENT_LOOP": "uvloop"}  # installed with the dev extras
    async with worker(amqp_url, database_url, slow_queue, **env) as run:
        consuming = await run.wait_for_line("consuming")
        assert consuming.endswith("(event loop: uvloop)")
        run.process.send_signal(signal.SIGTERM)
        assert await run.exit_code(timeout=30) == 0

    async with worker(amqp_url, database_url, slow_queue, RABBITRETRY_EVENT_LOOP="fast") as run:
        assert await run.exit_code(timeout=30) == 2
    assert run.log == ["error: RABBITRETRY_EVENT_LOOP='fast': use one of asyncio, uvloop"], run.log
