"""``rabbitretry run --processes``: the pause before a restart and each process's options."""

from __future__ import annotations

from rabbitretry import logs
from rabbitretry.cli.supervisor import restart_pause
from rabbitretry.cli.worker_process import RunOptions


def test_the_pause_before_a_restart_doubles_up_to_a_minute() -> None:
    assert [restart_pause(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]


def test_each_process_serves_metrics_on_a_port_of_its_own() -> None:
    options = RunOptions(("examples.points:AwardPoints",), metrics_port=9100)
    assert [options.for_process(i).metrics_port for i in range(3)] == [9100, 9101, 9102]


def test_no_port_and_any_free_port_stay_as_given() -> None:
    assert RunOptions(("m:C",)).for_process(2).metrics_port is None
    assert RunOptions(("m:C",), metrics_port=0).for_process(2).metrics_port == 0


def test_the_command_lines_log_choice_goes_to_every_process() -> None:
    logs.choose(logs.Level.warning, logs.Format.json)
    try:
        chosen = RunOptions(("m:C",)).for_process(1).logs
    finally:
        logs.choose()
    assert chosen == (logs.Level.warning, logs.Format.json)
