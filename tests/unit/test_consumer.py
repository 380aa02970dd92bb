"""Consumer classes: payload type, checks at class creation, derived topology; Context."""

from __future__ import annotations

from typing import Any, TypeVar

import pytest
from pydantic import BaseModel, ValidationError
from typing_extensions import TypedDict

from rabbitretry.consumer import MAX_ATTEMPT_TIMEOUT, Consumer, Context
from rabbitretry.errors import ConfigurationError
from rabbitretry.retry import RetryPolicy
from rabbitretry.topology.model import Binding, WorkQueue


class OrderPaid(BaseModel):
    order_id: int
    amount: float


class Point(TypedDict):
    x: int
    y: int


class AwardPoints(Consumer[OrderPaid]):
    queue = "points.award"

    async def handle(self, msg: OrderPaid, ctx: Context) -> None:
        pass


# --- payload type ----------------------------------------------------------------------------


def test_the_payload_type_comes_from_the_generic_parameter() -> None:
    assert AwardPoints.payload_adapter.validate_python({"order_id": 1, "amount": 2}) == OrderPaid(
        order_id=1, amount=2.0
    )


def test_parse_validates_json_into_the_payload_type() -> None:
    msg = AwardPoints.parse(b'{"order_id": 7, "amount": 9.5}')
    assert isinstance(msg, OrderPaid)
    assert msg == OrderPaid(order_id=7, amount=9.5)


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"",
        b'{"order_id": 7}',  # amount missing
        b'{"order_id": "seven", "amount": 1}',
        b"[1, 2]",
        b'{"order_id": 7, "amount": 1',  # truncated
    ],
)
def test_parse_refuses_invalid_bodies(body: bytes) -> None:
    with pytest.raises(ValidationError):
        AwardPoints.parse(body)


def test_any_type_pydantic_validates_can_be_the_payload() -> None:
    class Counts(Consumer[dict[str, int]]):
        queue = "counts"

        async def handle(self, msg: dict[str, int], ctx: Context) -> None:
            pass

    class Points(Consumer[Point]):
        queue = "points"

        async def handle(self, msg: Point, ctx: Context) -> None:
            pass

    assert Counts.parse(b'{"a": 1, "b": "2"}') == {"a": 1, "b": 2}
    with pytest.raises(ValidationError):
        Counts.parse(b'{"a": "x"}')
    assert Points.parse(b'{"x": 1, "y": 2}') == {"x": 1, "y": 2}
    with pytest.raises(ValidationError):
        Points.parse(b'{"x": 1}')


def test_each_consumer_has_its_own_payload_type() -> None:
    class Other(Consumer[list[int]]):
        queue = "other"

        async def handle(self, msg: list[int], ctx: Context) -> None:
            pass

    assert Other.parse(b"[1, 2]") == [1, 2]
    with pytest.raises(ValidationError):
        AwardPoints.parse(b"[1, 2]")


def test_a_subclass_inherits_the_payload_type() -> None:
    class Base(Consumer[OrderPaid]):  # no queue: not checked yet
        async def handle(self, msg: OrderPaid, ctx: Context) -> None:
            pass

    class Concrete(Base):
        queue = "concrete"

    assert isinstance(Concrete.parse(b'{"order_id": 1, "amount": 0}'), OrderPaid)


def test_a_generic_base_gets_its_payload_type_from_the_subclass() -> None:
    T = TypeVar("T")

    class Base(Consumer[T]):
        async def handle(self, msg: T, ctx: Context) -> None:
            pass

    class Concrete(Base[OrderPaid]):
        queue = "concrete"

    assert isinstance(Concrete.parse(b'{"order_id": 1, "amount": 0}'), OrderPaid)


# --- checks at class creation ----------------------------------------------------------------


def test_a_missing_payload_type_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match=r"payload type.*Consumer\[MyModel\]"):

        class NoPayload(Consumer):  # type: ignore[type-arg]
            queue = "no.payload"

            async def handle(self, msg: Any, ctx: Context) -> None:
                pass


def test_a_typevar_payload_with_a_queue_is_a_configuration_error() -> None:
    T = TypeVar("T")
    with pytest.raises(ConfigurationError, match="payload type"):

        class Unbound(Consumer[T]):
            queue = "unbound"

            async def handle(self, msg: T, ctx: Context) -> None:
                pass


def test_a_missing_handle_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match=r"NoHandle must define `async def handle"):

        class NoHandle(Consumer[OrderPaid]):
            queue = "no.handle"


@pytest.mark.parametrize("bad_queue", ["", 42])
def test_a_bad_queue_name_is_a_configuration_error(bad_queue: Any) -> None:
    with pytest.raises(ConfigurationError, match="queue must be a non-empty queue name"):

        class BadQueue(Consumer[OrderPaid]):
            queue = bad_queue

            async def handle(self, msg: OrderPaid, ctx: Context) -> None:
                pass


@pytest.mark.parametrize("seconds", [MAX_ATTEMPT_TIMEOUT + 0.5, MAX_ATTEMPT_TIMEOUT + 60, 3600])
def test_a_timeout_over_25_minutes_is_a_configuration_error(seconds: float) -> None:
    assert MAX_ATTEMPT_TIMEOUT == 25 * 60
    with pytest.raises(ConfigurationError, match="timeout must be between 0 and 1500 s"):

        class Slow(Consumer[OrderPaid]):
            queue = "slow"
            timeout = seconds

            async def handle(self, msg: OrderPaid, ctx: Context) -> None:
                pass


@pytest.mark.parametrize("seconds", [0, -1.0])
def test_a_timeout_that_is_not_positive_is_a_configuration_error(seconds: float) -> None:
    with pytest.raises(ConfigurationError, match="timeout"):

        class Instant(Consumer[OrderPaid]):
            queue = "instant"
            timeout = seconds

            async def handle(self, msg: OrderPaid, ctx: Context) -> None:
                pass


def test_a_timeout_of_exactly_25_minutes_is_accepted() -> None:
    class Patient(Consumer[OrderPaid]):
        queue = "patient"
        timeout = 25 * 60

        async def handle(self, msg: OrderPaid, ctx: Context) -> None:
            pass

    assert Patient.timeout == MAX_ATTEMPT_TIMEOUT


@pytest.mark.parametrize("seconds", [0.999, 0.5, 0, -3])
def test_a_lease_under_one_second_is_a_configuration_error(seconds: float) -> None:
    with pytest.raises(ConfigurationError, match="lease must be at least 1 second"):

        class Short(Consumer[OrderPaid]):
            queue = "short"
            lease = seconds

            async def handle(self, msg: OrderPaid, ctx: Context) -> None:
                pass


def test_a_lease_of_one_second_is_accepted() -> None:
    class Tight(Consumer[OrderPaid]):
        queue = "tight"
        lease = 1

        async def handle(self, msg: OrderPaid, ctx: Context) -> None:
            pass

    assert Tight.lease == 1


def test_a_retry_that_is_not_a_policy_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="retry must be a RetryPolicy"):

        class Sloppy(Consumer[OrderPaid]):
            queue = "sloppy"
            retry = {"max_attempts": 3}  # type: ignore[assignment]

            async def handle(self, msg: OrderPaid, ctx: Context) -> None:
                pass


def test_keep_payload_is_until_success_unless_always() -> None:
    class Keeping(Consumer[OrderPaid]):
        queue = "keeping"
        keep_payload = "always"

        async def handle(self, msg: OrderPaid, ctx: Context) -> None:
            pass

    assert Consumer.keep_payload == "until-success" and Keeping.keep_payload == "always"
    with pytest.raises(ConfigurationError, match=r'keep_payload must be "until-success" or'):

        class Sloppy(Consumer[OrderPaid]):
            queue = "sloppy"
            keep_payload = "forever"  # type: ignore[assignment]

            async def handle(self, msg: OrderPaid, ctx: Context) -> None:
                pass


def test_a_class_without_a_queue_is_not_checked() -> None:
    class Abstract(Consumer[OrderPaid]):
        timeout = 10_000  # would be refused on a concrete consumer

    with pytest.raises(ConfigurationError, match="timeout"):

        class Concrete(Abstract):
            queue = "concrete"

            async def handle(self, msg: OrderPaid, ctx: Context) -> None:
                pass


# --- work_queue ------------------------------------------------------------------------------


def test_work_queue_with_defaults() -> None:
    assert AwardPoints.work_queue() == WorkQueue(
        name="points.award", type="classic", dead_queue=None, bindings=[]
    )


def test_work_queue_carries_the_class_settings() -> None:
    binding = Binding(exchange="orders", routing_key="order.paid")

    class Tuned(Consumer[OrderPaid]):
        queue = "points.tuned"
        queue_type = "quorum"
        dead_queue = "points.graveyard"
        bindings = (binding,)
        retry = RetryPolicy(max_attempts=8, initial_delay=2.0, max_delay=120.0)

        async def handle(self, msg: OrderPaid, ctx: Context) -> None:
            pass

    queue = Tuned.work_queue()
    assert queue.name == "points.tuned"
    assert queue.type == "quorum"
    assert queue.dead_queue == "points.graveyard"
    assert queue.bindings == [binding]


# --- Context ---------------------------------------------------------------------------------


def context(attempt: int, max_attempts: int, queue: str = "points.award") -> Context:
    return Context(
        queue=queue,
        message_id="m-123",
        attempt=attempt,
        max_attempts=max_attempts,
        redelivered=False,
    )


def test_the_idempotency_key_is_queue_and_message_id() -> None:
    assert context(1, 5).idempotency_key == "points.award:m-123"


def test_the_idempotency_key_is_stable_across_attempts_and_differs_across_queues() -> None:
    assert context(1, 5).idempotency_key == context(4, 5).idempotency_key
    assert context(1, 5).idempotency_key != context(1, 5, queue="points.other").idempotency_key


@pytest.mark.parametrize(
    ("attempt", "max_attempts", "last"),
    [(1, 5, False), (4, 5, False), (5, 5, True), (6, 5, True), (1, 1, True)],
)
def test_is_last_attempt(attempt: int, max_attempts: int, last: bool) -> None:
    assert context(attempt, max_attempts).is_last_attempt is last


def test_context_defaults() -> None:
    ctx = context(1, 5)
    assert dict(ctx.headers) == {}
    assert tuple(ctx.x_death) == ()
