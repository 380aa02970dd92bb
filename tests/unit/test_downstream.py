"""Downstream declarations: what a consumer may declare, and how a block's errors are read."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from rabbitretry import (
    ConfigurationError,
    Consumer,
    Context,
    Downstream,
    DownstreamUnavailable,
    RetryPolicy,
    testing,
)
from rabbitretry.downstream import Unbroken, attributed, declared


class WmsDown(Exception):
    pass


WMS = Downstream("wms", unavailable_on=(WmsDown, ConnectionError))


@pytest.mark.parametrize(
    ("settings", "complaint"),
    [
        ({"name": ""}, "needs a name"),
        ({"name": "wms\n"}, "printable"),
        ({"name": "w" * 201}, "at most 200"),
        ({"name": "wms", "unavailable_on": (ValueError, "HTTP 500")}, "tuple of exception"),
        ({"name": "wms", "unavailable_on": [ValueError]}, "tuple of exception"),
        ({"name": "wms", "failure_threshold": 0}, "failure_threshold"),
        ({"name": "wms", "failure_window": 0}, "failure_window"),
        ({"name": "wms", "first_pause": 0}, "first_pause"),
        ({"name": "wms", "first_pause": 30, "max_pause": 15}, "at most max_pause"),
    ],
)
def test_a_declaration_that_cannot_work_is_refused_with_what_to_do(
    settings: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(ConfigurationError, match=complaint):
        Downstream(**settings)


async def test_a_declared_error_leaves_the_block_as_unavailable_with_its_cause() -> None:
    with pytest.raises(DownstreamUnavailable) as raised:
        async with attributed(WMS):
            raise WmsDown("HTTP 500")
    assert raised.value.downstream == "wms"
    assert isinstance(raised.value.__cause__, WmsDown)
    assert "wms is unavailable: WmsDown: HTTP 500" in str(raised.value)
    assert raised.value.call_made


async def test_other_errors_and_successes_pass_through_untouched() -> None:
    with pytest.raises(ValueError, match="malformed"):
        async with attributed(WMS):
            raise ValueError("malformed order")
    async with attributed(WMS):
        pass


def test_an_undeclared_name_is_a_configuration_error_naming_it() -> None:
    with pytest.raises(ConfigurationError, match="no downstream named 'crm'"):
        declared([WMS], "crm", "ShipOrder")
    with pytest.raises(ConfigurationError, match="no downstream named 'crm'"):
        Unbroken([WMS], "ShipOrder").call("crm")


class Order(BaseModel):
    order_id: int


def test_a_consumer_declares_downstreams_as_a_sequence_of_distinct_downstreams() -> None:
    with pytest.raises(ConfigurationError, match="sequence of Downstream"):

        class Strings(Consumer[Order]):
            queue = "orders.ship"
            downstreams = ("wms",)  # type: ignore[assignment]

            async def handle(self, msg: Order, ctx: Context) -> None: ...

    with pytest.raises(ConfigurationError, match="twice"):

        class Twice(Consumer[Order]):
            queue = "orders.ship"
            downstreams = (WMS, Downstream("wms"))

            async def handle(self, msg: Order, ctx: Context) -> None: ...


class ShipOrder(Consumer[Order]):
    queue = "orders.ship"
    retry = RetryPolicy(max_attempts=3, initial_delay=1.0, jitter=0.0)
    downstreams = (WMS,)
    wms_down = False

    async def handle(self, msg: Order, ctx: Context) -> None:
        async with ctx.downstream("wms"):
            if self.wms_down:
                raise ConnectionError("connection refused")


async def test_in_a_unit_test_the_block_attributes_errors_and_the_policy_retries_them() -> None:
    assert (await testing.handle(ShipOrder, {"order_id": 1})).outcome == "succeeded"
    ShipOrder.wms_down = True
    try:
        result = await testing.handle(ShipOrder, {"order_id": 1}, attempt=3)
        early = await testing.handle(ShipOrder, {"order_id": 1})
    finally:
        ShipOrder.wms_down = False
    assert isinstance(result.error, DownstreamUnavailable)
    # No breaker in a unit test: the policy decides, as it would below the threshold.
    assert (result.outcome, result.reason) == ("dead", "attempts-exhausted")
    assert early.outcome == "retrying"


def test_a_context_not_made_by_a_worker_says_so() -> None:
    ctx = Context(queue="q", message_id="m", attempt=1, max_attempts=1, redelivered=False)
    with pytest.raises(RuntimeError, match="not made by a worker"):
        ctx.downstream("wms")
