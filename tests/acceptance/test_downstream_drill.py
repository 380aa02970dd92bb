"""The short WMS outage drill (``python -m drills --downstream``; docs/drills.md): 200 orders at
50/s through ``rabbitretry run`` workers, a stub WMS answering 500 for 6 s, the breaker's default
settings (first probe after 1 s). The full drill is ``make drill-downstream`` (1,500 orders, a
60 s outage).

Each run holds the goal of the issue's table: nothing lost, nothing twice, nothing dead, at most
one attempt charged per order that met the outage, the WMS left alone (at most 2 requests a
second after the first 5 s of the outage), the backlog shipped within 30 s of the WMS coming
back, and one "down" and one "recovered" alert.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from drills.downstream import WmsDrillConfig, WmsDrillResult, run_wms_drill
from drills.downstream_verdict import MAX_RATE_AFTER, MAX_RECOVERY

pytestmark = [pytest.mark.asyncio, pytest.mark.slow, pytest.mark.timeout(120)]


def short(amqp_url: str, database_url: str, **changes: Any) -> WmsDrillConfig:
    config = WmsDrillConfig(
        amqp_url=amqp_url,
        database_url=database_url,
        orders=200,
        rate=50.0,
        outage=6.0,
        outage_at=1.0,
        settle_timeout=60.0,
    )
    return dataclasses.replace(config, **changes)


def shown(result: WmsDrillResult) -> str:
    return "\n".join(result.report())


def assert_rode_out_the_outage(result: WmsDrillResult) -> None:
    v = result.verdict
    assert not v.lost and not v.duplicates, shown(result)
    assert v.dead == 0 and v.succeeded == v.orders, shown(result)
    assert v.met > 0 and v.charged_max <= 1, shown(result)
    assert v.peak_after <= MAX_RATE_AFTER, shown(result)
    assert v.recovery is not None and v.recovery <= MAX_RECOVERY, shown(result)
    assert v.downstream_alerts == ["open", "closed"] and v.dead_alerts == 0, shown(result)
    assert v.opened == 1 and v.breaker_state == "closed", shown(result)
    assert result.worker_exits == {}, shown(result)  # nothing died before the drill's stop
    assert result.ok, shown(result)


async def test_a_short_outage_costs_nothing_with_the_breaker(
    amqp_url: str, server_database_url: str
) -> None:
    result = await run_wms_drill(short(amqp_url, server_database_url))
    print(shown(result))
    assert_rode_out_the_outage(result)
    # The breaker tripped at once: a handful of requests met the outage, not one per attempt.
    assert result.verdict.requests_during <= 30, shown(result)


async def test_two_workers_trip_the_breaker_once_and_probe_one_at_a_time(
    amqp_url: str, server_database_url: str
) -> None:
    result = await run_wms_drill(short(amqp_url, server_database_url, workers=2))
    print(shown(result))
    assert_rode_out_the_outage(result)
    assert result.verdict.most_in_flight_probes <= 1, shown(result)


async def test_a_wms_that_never_recovers_kills_nothing_and_does_not_loop(
    amqp_url: str, server_database_url: str
) -> None:
    result = await run_wms_drill(
        short(amqp_url, server_database_url, orders=100, outage=15.0, never_recovers=True)
    )
    print(shown(result))
    v = result.verdict
    assert not v.lost and not v.duplicates and v.dead == 0, shown(result)
    assert v.breaker_state in ("open", "half-open") and v.opened == 1, shown(result)
    # No loop: after the trip only the probes run (1, 2, 4, 8 s apart), none charged.
    assert v.failed_probes >= 2 and v.attempts_after <= v.failed_probes + 1, shown(result)
    assert v.charged_max == 0, shown(result)
    unfinished = v.orders - v.succeeded
    assert unfinished >= 40 and v.waiting is not None and v.waiting >= unfinished, shown(result)
    assert v.downstream_alerts == ["open"] and v.dead_alerts == 0, shown(result)
    assert result.ok, shown(result)
