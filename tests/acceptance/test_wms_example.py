"""``python -m examples.wms`` (docs/downstreams.md's example) runs and its verdict holds: a
10 s outage of the WMS loses nothing, kills nothing, costs the WMS a handful of requests,
and the backlog catches up by itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.acceptance.cli_runner import ROOT
from tests.acceptance.test_readme import scratch_vhost

pytestmark = pytest.mark.slow


def figure(pattern: str, shown: str) -> float:
    found = re.search(pattern, shown)
    assert found is not None, f"{pattern!r} is not in the output:\n{shown}"
    return float(found[1])


@pytest.mark.timeout(150)
def test_the_wms_example_rides_out_the_outage(amqp_url: str, database_url: str) -> None:
    # A vhost of its own: the example's queue name is fixed, and another run may share the broker.
    with scratch_vhost(amqp_url) as vhost_url:
        done = subprocess.run(
            [sys.executable, "-m", "examples.wms"],
            env={
                **os.environ,
                "RABBITRETRY_AMQP_URL": vhost_url,
                "RABBITRETRY_DATABASE_URL": database_url,
            },
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=140,
        )
    shown = done.stdout + done.stderr
    assert done.returncode == 0, shown
    assert "orders: 300, shipped: 300, dead: 0, lost: 0" in shown, shown
    # Plain retries sent about 4.8 requests per order that met the outage (250 orders here);
    # with the breaker: the failures that trip it, then one probe per pause (1, 2, 4, 8 s).
    assert figure(r"requests to the WMS during the outage: (\d+)", shown) <= 40, shown
    # The next probe comes at most max_pause (15 s) after the WMS is back, then the backlog drains.
    assert figure(r"caught up: ([\d.]+) s after", shown) < 30, shown
    assert "attempts charged beyond the first: 0" in shown, shown  # the trip forgave them
    assert "breaker: closed; alerts: open, closed" in shown, shown
