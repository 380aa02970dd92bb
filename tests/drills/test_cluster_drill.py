"""The short cluster drill: 1,000 messages on a quorum queue across the three local nodes of
``make cluster``, three workers (one per node), two reconcilers, two outbox relays; the node
leading the work queue is stopped and started again, one worker is SIGKILLed.

The full drill is ``make drill-cluster`` (5,000 messages). Skipped when the cluster is not up,
except under ``CI=true`` (CI starts it). ``RABBITRETRY_DRILL_SEED`` replays a failed run.
"""

from __future__ import annotations

import os
import random

import pytest

from drills.cluster import ClusterDrillConfig, run_cluster_drill
from drills.nodes import Node
from tests.drills.verdicts import assert_nothing_lost

pytestmark = [pytest.mark.asyncio, pytest.mark.slow, pytest.mark.timeout(300)]


async def test_short_cluster_drill_loses_nothing_and_duplicates_nothing(
    cluster: list[Node], server_database_url: str
) -> None:
    seed = int(os.environ.get("RABBITRETRY_DRILL_SEED") or random.randrange(1_000_000))
    config = ClusterDrillConfig(
        database_url=server_database_url,
        messages=1000,
        seed=seed,
        publish_seconds=40.0,
        concurrency=8,
        settle_timeout=120.0,
        node_down_seconds=10.0,
    )
    print(f"cluster drill seed {seed} (replay with RABBITRETRY_DRILL_SEED={seed})")
    result = await run_cluster_drill(config)
    assert_nothing_lost(result, seed)
    # The faults happened: a SIGKILL, the crashers took their workers down, the leading node
    # stopped and another took the lead.
    assert result.worker_exits.get(-9, 0) >= 1
    assert result.worker_exits.get(17, 0) >= 1
    assert len(result.leader_changes) == 1
