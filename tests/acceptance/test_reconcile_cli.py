"""``rabbitretry reconcile`` and ``rabbitretry job run`` as a user calls them."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

Cli = Callable[..., subprocess.CompletedProcess[str]]


def test_reconcile_once_prints_its_report(cli: Cli) -> None:
    done = cli("reconcile", "--once")
    assert done.returncode == 0, done.stderr
    assert "overdue retries re-driven" in done.stdout
    assert "expired leases re-driven" in done.stdout


def test_reconcile_says_how_to_call_it(cli: Cli) -> None:
    unsure = cli("reconcile")
    assert unsure.returncode == 2
    assert unsure.stderr.strip() == "error: say --once, or --interval SECONDS to keep running"


def test_reconcile_refuses_a_target_it_cannot_use(cli: Cli) -> None:
    wrong = cli("reconcile", "--once", "rabbitretry.consumer:Context")
    assert wrong.returncode == 2
    assert "neither a Consumer class nor a Reconciliation" in wrong.stderr
    assert "Traceback" not in wrong.stderr


def test_job_run_refuses_what_is_not_a_job(cli: Cli) -> None:
    wrong = cli("job", "run", "rabbitretry.consumer:Context")
    assert wrong.returncode == 2
    assert "is not a job" in wrong.stderr
