"""``make demo-payments`` (``python -m examples.payments``) runs and tells the story it promises."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.acceptance.cli_runner import ROOT
from tests.acceptance.test_readme import scratch_vhost

pytestmark = pytest.mark.slow


def test_the_payments_demo_runs_each_case_to_its_end(amqp_url: str, database_url: str) -> None:
    # A vhost of its own: the demo's queue name is fixed, and another run may share the broker.
    with scratch_vhost(amqp_url) as vhost_url:
        done = subprocess.run(
            [sys.executable, "-m", "examples.payments"],
            env={
                **os.environ,
                "RABBITRETRY_AMQP_URL": vhost_url,
                "RABBITRETRY_DATABASE_URL": database_url,
                "COLUMNS": "250",
            },
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=180,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    shown = done.stdout
    for line in (
        "A paid: 200 stored",
        "A paid again (its retry): 200 duplicate",
        "D paid, forged signature: 401 the signature does not match",
        "pending → refunded is not possible yet",
        "refunding → paid: not-allowed",
        "7 events on the statement, 6 handled, 1 missing",
        "1 re-published; 0 handled but not on it",
    ):
        assert line in shown, shown
    assert shown.count(": moved") == 5, shown  # A 1, B 2, C 2; E moves after the histories
    assert shown.rstrip().endswith("is now paid"), shown
