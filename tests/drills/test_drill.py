"""The short fault drill: 1,000 messages through SIGKILLs, cut connections, a broker restart and
a database crash.

The full drill is ``make drill`` (5,000 messages). Set ``RABBITRETRY_DRILL_SEED`` to replay a
failed run; the seed is printed either way (pytest shows it with the failure). The broker
restart disconnects everyone on the broker: ``RABBITRETRY_DRILL_BROKER_RESTART=0`` skips it
when others share the broker. The database crash stops a private PostgreSQL server of the
drill's own, never the shared one; ``RABBITRETRY_DRILL_DATABASE_CRASH=0`` skips it (it is
skipped, with a note, where no private server can run: no PostgreSQL binaries here).
"""

from __future__ import annotations

import os
import random
import shutil
from urllib.parse import urlsplit

import pytest

from drills import private_postgres
from drills.drill import DATABASE_CRASH_ENV, DrillConfig, run_drill
from tests.drills.verdicts import assert_nothing_lost

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
    crash = os.environ.get(DATABASE_CRASH_ENV) != "0"
    if crash and (why := private_postgres.available()):
        print(f"drill: no database crash: {why}")
        crash = False
    config = DrillConfig(
        amqp_url=amqp_url,
        database_url=server_database_url,
        messages=1000,
        seed=seed,
        publish_seconds=30.0,
        concurrency=16,
        settle_timeout=150.0,
        restart_broker=restart,
        crash_database=crash,
    )
    print(f"drill seed {seed} (replay with RABBITRETRY_DRILL_SEED={seed})")
    result = await run_drill(config)
    assert_nothing_lost(result, seed)
    # The faults happened: three SIGKILLs, the crashers took their worker down, the database
    # crashed and came back.
    assert result.worker_exits.get(-9, 0) >= 3
    assert result.worker_exits.get(17, 0) >= 1
    assert len(result.database_outages) == (1 if crash else 0)
    # Every handler run was recorded (the figures compare them with the attempt log).
    assert result.verdict.handler_runs is not None and result.verdict.handler_runs > 0
