"""rabbitretry.testing.recover: a consumer's recover hook run as a worker runs it."""

from __future__ import annotations

import hashlib
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel

from rabbitretry import Consumer, Context, Death, Permanent, RetryPolicy, testing

pytestmark = pytest.mark.asyncio


class Order(BaseModel):
    order_id: int


class Seen(BaseModel):
    """What one run of the hook was handed."""

    msg: Order | None
    queue: str
    message_id: str
    idempotency_key: str
    attempt: int
    max_attempts: int
    death: Any


class ShipOrder(Consumer[Order]):
    """Its hook refunds the order through the outbox; order 0 makes the hook fail."""

    queue = "testing.ship"
    retry = RetryPolicy(max_attempts=2)
    recover_retry = RetryPolicy(max_attempts=4, initial_delay=3.0, jitter=0.0)
    runs: ClassVar[list[Seen]] = []
    lifecycle: ClassVar[list[str]] = []

    def __init__(self, outbox: testing.FakeOutbox | None = None) -> None:
        self.outbox = outbox or testing.FakeOutbox()

    async def setup(self) -> None:
        self.lifecycle.append("setup")

    async def teardown(self) -> None:
        self.lifecycle.append("teardown")

    async def handle(self, msg: Order, ctx: Context) -> None:
        raise Permanent("the WMS refused this order")

    async def on_dead(self, msg: Order | None, ctx: Context, death: Death) -> None:
        self.runs.append(
            Seen(
                msg=msg,
                queue=ctx.queue,
                message_id=ctx.message_id,
                idempotency_key=ctx.idempotency_key,
                attempt=ctx.attempt,
                max_attempts=ctx.max_attempts,
                death=death,
            )
        )
        if msg is not None and msg.order_id == 0:
            raise ConnectionError("the refund service is down")
        if msg is not None and msg.order_id < 0:
            raise Permanent("nothing to refund")
        async with ctx.transaction() as conn:
            await self.outbox.enqueue(
                conn,
                "",
                {"order_id": msg.order_id if msg else None},
                routing_key="refunds.requested",
                message_id=death.compensation_id("refund"),
            )


@pytest.fixture(autouse=True)
def _forget_runs() -> None:
    ShipOrder.runs.clear()
    ShipOrder.lifecycle.clear()


DEATH = Death("testing.ship", "order-7", "attempts-exhausted", "TimeoutError", "took 60 s", 2)


async def test_the_hook_is_run_as_the_run_of_its_recover_queue() -> None:
    consumer = ShipOrder()
    result = await testing.recover(consumer, {"order_id": 7}, death=DEATH, connection=object())
    assert result == testing.Result("succeeded")
    (seen,) = ShipOrder.runs
    assert seen.msg == Order(order_id=7)
    assert seen.death == DEATH
    assert (seen.queue, seen.message_id) == ("testing.ship.recover", "recover:order-7:0")
    assert seen.idempotency_key == "testing.ship.recover:recover:order-7:0"
    assert (seen.attempt, seen.max_attempts) == (1, 4)  # recover_retry's budget
    (refund,) = consumer.outbox.enqueued
    assert refund.message_id == "compensate:refund:order-7" and refund.json() == {"order_id": 7}
    assert ShipOrder.lifecycle == []  # an instance is used as it is


async def test_without_a_death_the_message_died_of_a_permanent_error() -> None:
    await testing.recover(ShipOrder, {"order_id": 7}, message_id="o-7", connection=object())
    (seen,) = ShipOrder.runs
    assert seen.death == Death("testing.ship", "o-7", "permanent-error", "Permanent", "", 1)
    assert seen.message_id == "recover:o-7:0"
    assert ShipOrder.lifecycle == ["setup", "teardown"]  # a class is set up and torn down
    await testing.recover(ShipOrder, {"order_id": 7}, connection=object())
    assert ShipOrder.runs[1].death.message_id == "test-message"


async def test_a_body_that_never_validated_gives_the_hook_no_message() -> None:
    result = await testing.recover(ShipOrder, b"not json", connection=object())
    assert result.outcome == "succeeded"
    (seen,) = ShipOrder.runs
    assert seen.msg is None
    assert (seen.death.reason, seen.death.error_type) == ("invalid-payload", "invalid-payload")
    assert seen.death.error_message.startswith("1 validation error(s): (body): Invalid JSON")
    await testing.recover(ShipOrder, {"order_id": "x"}, death=DEATH, connection=object())
    assert ShipOrder.runs[1].msg is None  # the same rule, whatever the death says


async def test_a_failing_hook_is_retried_under_recover_retry_then_dead() -> None:
    failing = {"order_id": 0}
    first = await testing.recover(ShipOrder, failing, death=DEATH, attempt=1)
    assert (first.outcome, first.delay) == ("retrying", 3.0)
    assert isinstance(first.error, ConnectionError)
    assert first.failure is not None and first.failure.message == "the refund service is down"
    last = await testing.recover(ShipOrder, failing, death=DEATH, attempt=4)
    assert (last.outcome, last.reason) == ("dead", "attempts-exhausted")
    refused = await testing.recover(ShipOrder, {"order_id": -1}, death=DEATH)
    assert (refused.outcome, refused.reason) == ("dead", "permanent-error")
    with pytest.raises(ValueError, match=r"between 1 and max_attempts \(4\)"):
        await testing.recover(ShipOrder, failing, death=DEATH, attempt=5)


async def test_a_replay_that_dies_again_is_a_run_of_its_own() -> None:
    await testing.recover(ShipOrder, {"order_id": 7}, death=DEATH, replays=2, connection=object())
    assert ShipOrder.runs[0].message_id == "recover:order-7:2"


async def test_the_run_is_told_what_the_ledger_would_tell_it() -> None:
    long_id = "o" * 201
    death = Death("testing.ship", long_id, "permanent-error", "Permanent", "e" * 3000, 1)
    await testing.recover(ShipOrder, {"order_id": 7}, death=death, connection=object())
    (seen,) = ShipOrder.runs
    # As the trigger names it (an AMQP message_id holds 255 bytes): md5(message_id).
    assert seen.message_id == f"recover:md5-{hashlib.md5(long_id.encode()).hexdigest()}:0"
    assert seen.death.message_id == long_id  # the header keeps it whole
    assert seen.death.error_message == "e" * 2000  # the header keeps 2000 characters


async def test_the_transaction_needs_a_connection_as_in_handle() -> None:
    with pytest.raises(testing.MissingConnection, match=r"testing\.recover\(\)"):
        await testing.recover(ShipOrder, {"order_id": 7}, death=DEATH)


async def test_mistakes_in_the_test_are_raised() -> None:
    class Plain(Consumer[Order]):
        queue = "testing.plain"

        async def handle(self, msg: Order, ctx: Context) -> None: ...

    with pytest.raises(TypeError, match=r"Plain has no recover hook: write `async def on_dead"):
        await testing.recover(Plain, {"order_id": 1})
    with pytest.raises(ValueError, match="pass death or message_id"):
        await testing.recover(ShipOrder, {"order_id": 1}, death=DEATH, message_id="order-7")
    other = Death("testing.other", "order-7", "permanent-error", "Permanent", "", 1)
    with pytest.raises(ValueError, match=r"death\.queue is 'testing\.other'"):
        await testing.recover(ShipOrder, {"order_id": 1}, death=other)
    assert ShipOrder.runs == [] and ShipOrder.lifecycle == []
