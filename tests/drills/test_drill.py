"""The short fault drill: 1,000 messages through SIGKILLs, cut connections and a broker restart.

The full drill is ``make drill`` (5,000 messages). Set ``RABBITRETRY_DRILL_SEED`` to replay a
failed run; the seed is printed either way (pytest shows it with the failure). The broker
restart disconnects everyone on the broker: ``RABBITRETRY_DRILL_BROKER_RESTART=0`` skips it
when others share the broker.
"""

from __future__ import annotations

import os
import random
import shutil
from urllib.parse import urlsplit

import pytest

from drills.drill import DrillConfig, run_drill

pytestmark = [pytest.mark.asyncio, pytest.mark.slow, pytest.mark.timeout(300)]


def _broker_is_local(amqp_url: str) -> bool:
    return urlsplit(amqp_url).hostname in ("127.0.0.1", "localhost", "::1")


async def test_short_drill_loses_nothing_and_duplicates_nothing(
    amqp_url: str, server_database_url: str
) -> None:
    seed = int(os.environ.get("RABBITRETRY_DRILL_SEED") or random.randrange(1_000_000))
    # stop_app needs rabbitmqctl on the broker's machine; a broker in a container is not ours.
    restart = (
        os.environ.get("RABBITRETRY_DRILL_BROKER_RESTART") != "0"
        and shutil.which("rabbitmqctl") is not None
        and _broker_is_local(amqp_url)
    )
    config = DrillConfig(
        amqp_url=amqp_url,
        database_url=server_database_url,
        messages=1000,
        seed=seed,
        publish_seconds=30.0,
        settle_timeout=150.0,
        restart_broker=restart,
    )
    print(f"drill seed {seed} (replay with RABBITRETRY_DRILL_SEED={seed})")
    result = await run_drill(config)
    print(result.details())
    print(result.summary())

    verdict = result.verdict
    assert verdict.ok, "\n".join(
        [f"seed {seed}; kept: {result.worker_log}, database {result.database}", *verdict.explain()]
    )
    plan = result.plan
    assert verdict.succeeded == len(plan.messages) - verdict.dead
    assert verdict.dead == len(plan.of_kind("poison")) + len(plan.of_kind("crasher"))
    # The faults happened: three SIGKILLs, and the crashers took their worker down.
    assert result.worker_exits.get(-9, 0) >= 3
    assert result.worker_exits.get(17, 0) >= 1
