"""rabbitretry.testing: a consumer's decisions without a broker or a database."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel, Field, ValidationError

from rabbitretry import (
    ConfigurationError,
    Consumer,
    Context,
    MissingMessageId,
    Permanent,
    Publisher,
    Retry,
    RetryPolicy,
    testing,
)
from rabbitretry.delivery.attempt import validation_summary
from rabbitretry.errors import TransactionRolledBack
from rabbitretry.ledger.failures import describe, fingerprint

pytestmark = pytest.mark.asyncio


class OrderPaid(BaseModel):
    order_id: str
    points: int = Field(gt=0)


class Flaky(Exception):
    pass


class Award(Consumer[OrderPaid]):
    """Fails as the message asks: the order id says how."""

    queue = "testing.award"
    retry = RetryPolicy(
        max_attempts=3, initial_delay=2.0, multiplier=2.0, max_delay=60.0, jitter=0.2
    )
    handled: ClassVar[list[tuple[str, int]]] = []

    async def handle(self, msg: OrderPaid, ctx: Context) -> None:
        if msg.order_id == "flaky":
            raise Flaky(f"order {msg.order_id}: service unavailable")
        if msg.order_id == "refused":
            raise Permanent("the account is closed")
        if msg.order_id == "later":
            raise Retry("not yet", delay=42.0)
        if msg.order_id == "next-year":
            raise Retry("not yet", delay=365 * 86400)
        self.handled.append((msg.order_id, ctx.attempt))


@pytest.fixture(autouse=True)
def _forget_handled() -> None:
    Award.handled.clear()


PAID = {"order_id": "o-1", "points": 10}


# --- outcomes --------------------------------------------------------------------------------


async def test_a_handler_that_returns_succeeds() -> None:
    result = await testing.handle(Award, PAID, message_id="m-1", attempt=2)
    assert result == testing.Result("succeeded")
    assert Award.handled == [("o-1", 2)]


@pytest.mark.parametrize(
    "body",
    [
        OrderPaid(order_id="o-1", points=10),
        {"order_id": "o-1", "points": 10},
        '{"order_id": "o-1", "points": 10}',
        b'{"order_id": "o-1", "points": 10}',
    ],
)
async def test_a_body_may_be_a_model_a_json_value_text_or_bytes(body: Any) -> None:
    assert (await testing.handle(Award, body)).outcome == "succeeded"
    assert Award.handled == [("o-1", 1)]


async def test_a_retryable_error_retries_after_the_policys_delay() -> None:
    result = await testing.handle(Award, {"order_id": "flaky", "points": 1}, attempt=2)
    assert result.outcome == "retrying"
    assert isinstance(result.error, Flaky)
    # Attempt 2 waits 2 * 2 s before the third, jittered by ±20 %.
    assert result.delay is not None and 3.2 <= result.delay <= 4.8
    assert result.failure is not None
    assert result.failure.type == "Flaky"
    assert result.failure.message == "order flaky: service unavailable"
    assert result.failure == describe("testing.award", result.error)


async def test_retry_delays_are_reproducible_and_follow_the_rng() -> None:
    flaky = {"order_id": "flaky", "points": 1}
    first = await testing.handle(Award, flaky)
    again = await testing.handle(Award, flaky)
    assert first.delay == again.delay
    seeded = await testing.handle(Award, flaky, rng=random.Random(7))
    assert seeded.delay == Award.retry.delay_after(1, random.Random(7))
    assert seeded.delay != first.delay


async def test_retry_with_a_delay_uses_that_delay() -> None:
    result = await testing.handle(Award, {"order_id": "later", "points": 1})
    assert (result.outcome, result.delay) == ("retrying", 42.0)


async def test_a_retry_delay_past_max_delay_waits_max_delay_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    result = await testing.handle(Award, {"order_id": "next-year", "points": 1})
    assert (result.outcome, result.delay) == ("retrying", 60.0)
    assert "a retry was asked for in 31536000 s; it waits 60.0 s, the policy's bound" in caplog.text


async def test_permanent_is_dead_at_once() -> None:
    result = await testing.handle(Award, {"order_id": "refused", "points": 1}, attempt=1)
    assert (result.outcome, result.reason, result.delay) == ("dead", "permanent-error", None)
    assert isinstance(result.error, Permanent)
    assert result.failure is not None and result.failure.message == "the account is closed"


async def test_a_retryable_error_at_the_last_attempt_is_dead_exhausted() -> None:
    result = await testing.handle(Award, {"order_id": "flaky", "points": 1}, attempt=3)
    assert (result.outcome, result.reason) == ("dead", "attempts-exhausted")
    assert isinstance(result.error, Flaky)


async def test_attempts_beyond_the_budget_are_refused() -> None:
    with pytest.raises(ValueError, match="between 1 and max_attempts"):
        await testing.handle(Award, PAID, attempt=4)


@pytest.mark.parametrize(
    "body",
    [b"not json", {"order_id": "o-1"}, {"order_id": "o-1", "points": 0}],
)
async def test_an_invalid_payload_is_dead_with_the_workers_summary(body: Any) -> None:
    result = await testing.handle(Award, body)
    assert (result.outcome, result.reason) == ("dead", "invalid-payload")
    assert isinstance(result.error, ValidationError)
    assert result.failure is not None
    assert result.failure.type == "invalid-payload"
    assert result.failure.message == validation_summary(result.error)
    assert result.failure.fingerprint == fingerprint(
        "testing.award", "invalid-payload", result.failure.message
    )
    assert Award.handled == []


async def test_a_body_over_the_size_limit_is_dead_unread() -> None:
    class Small(Award):
        queue = "testing.small"
        max_body_bytes = 10

    result = await testing.handle(Small, PAID)
    assert (result.outcome, result.reason) == ("dead", "too-large")
    assert Award.handled == []


async def test_a_handler_over_its_timeout_fails_the_attempt() -> None:
    class Stuck(Consumer[OrderPaid]):
        queue = "testing.stuck"
        timeout = 0.01

        async def handle(self, msg: OrderPaid, ctx: Context) -> None:
            await asyncio.Event().wait()  # never set: only the timeout ends this

    result = await testing.handle(Stuck, PAID)
    assert result.outcome == "retrying"
    assert isinstance(result.error, TimeoutError)


async def test_immediate_retries_rerun_the_handler_in_process() -> None:
    tries: list[int] = []

    class Blip(Consumer[OrderPaid]):
        queue = "testing.blip"
        retry = RetryPolicy(immediate_retries=2, immediate_delay=0)

        async def handle(self, msg: OrderPaid, ctx: Context) -> None:
            tries.append(ctx.attempt)
            if len(tries) < 3:
                raise ConnectionError("blip")

    assert (await testing.handle(Blip, PAID)).outcome == "succeeded"
    assert tries == [1, 1, 1]  # three tries, one attempt


async def test_immediate_retries_that_all_fail_end_the_attempt() -> None:
    calls: list[int] = []

    class Down(Consumer[OrderPaid]):
        queue = "testing.down"
        retry = RetryPolicy(immediate_retries=2, immediate_delay=0)

        async def handle(self, msg: OrderPaid, ctx: Context) -> None:
            calls.append(ctx.attempt)
            raise ConnectionError("down")

    result = await testing.handle(Down, PAID)
    assert result.outcome == "retrying"
    assert calls == [1, 1, 1]


# --- business validity -----------------------------------------------------------------------


class Welcome(Consumer[OrderPaid]):
    queue = "testing.welcome"
    expires_after = 3600.0
    handled: ClassVar[int] = 0

    async def should_skip(self, msg: OrderPaid, ctx: Context) -> str | None:
        return "order cancelled" if msg.order_id == "cancelled" else None

    async def handle(self, msg: OrderPaid, ctx: Context) -> None:
        type(self).handled += 1


async def test_should_skip_skips_with_its_reason() -> None:
    Welcome.handled = 0
    result = await testing.handle(Welcome, {"order_id": "cancelled", "points": 1})
    assert (result.outcome, result.reason) == ("skipped", "order cancelled")
    assert Welcome.handled == 0


async def test_expires_after_is_checked_against_the_publication_time() -> None:
    Welcome.handled = 0
    published = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    late = await testing.handle(
        Welcome, PAID, published_at=published, now=published + timedelta(hours=2)
    )
    assert (late.outcome, late.reason) == ("skipped", "expired")
    assert Welcome.handled == 0
    in_time = await testing.handle(
        Welcome, PAID, published_at=published, now=published + timedelta(minutes=59)
    )
    assert in_time.outcome == "succeeded"
    assert Welcome.handled == 1


async def test_an_error_in_should_skip_fails_the_attempt() -> None:
    class Broken(Welcome):
        queue = "testing.broken"

        async def should_skip(self, msg: OrderPaid, ctx: Context) -> str | None:
            raise LookupError("order service down")

    result = await testing.handle(Broken, PAID)
    assert result.outcome == "retrying"
    assert isinstance(result.error, LookupError)


# --- setup, teardown and instances -----------------------------------------------------------


async def test_a_class_is_set_up_and_torn_down_around_the_message() -> None:
    events: list[str] = []

    class Lifecycle(Consumer[OrderPaid]):
        queue = "testing.lifecycle"

        async def setup(self) -> None:
            events.append("setup")

        async def teardown(self) -> None:
            events.append("teardown")

        async def handle(self, msg: OrderPaid, ctx: Context) -> None:
            events.append("handle")
            raise Permanent("no")

    assert (await testing.handle(Lifecycle, PAID)).outcome == "dead"
    assert events == ["setup", "handle", "teardown"]


async def test_an_instance_is_used_as_it_is() -> None:
    class Client(Consumer[OrderPaid]):
        queue = "testing.client"

        def __init__(self, client: list[str]) -> None:
            self.client = client

        async def setup(self) -> None:
            raise AssertionError("an instance passed in is already set up")

        async def handle(self, msg: OrderPaid, ctx: Context) -> None:
            self.client.append(f"{ctx.queue}/{ctx.message_id}: {msg.order_id}")

    consumer = Client([])
    result = await testing.handle(consumer, PAID, message_id="m-9", headers={"h": 1})
    assert result.outcome == "succeeded"
    assert consumer.client == ["testing.client/m-9: o-1"]


# --- ctx.transaction() -----------------------------------------------------------------------


class FakeConnection:
    def __init__(self) -> None:
        self.statements: list[tuple[str, tuple[Any, ...]]] = []

    async def execute(self, sql: str, *args: Any) -> str:
        self.statements.append((sql, args))
        return "INSERT 0 1"


class Ledger(Consumer[OrderPaid]):
    queue = "testing.ledger"

    async def handle(self, msg: OrderPaid, ctx: Context) -> None:
        async with ctx.transaction() as conn:
            await conn.execute("INSERT INTO flow VALUES ($1, $2)", ctx.idempotency_key, msg.points)


async def test_the_transaction_yields_the_connection_passed() -> None:
    conn = FakeConnection()
    result = await testing.handle(Ledger, PAID, message_id="m-1", connection=conn)
    assert result.outcome == "succeeded"
    assert conn.statements == [("INSERT INTO flow VALUES ($1, $2)", ("testing.ledger:m-1", 10))]


async def test_the_transaction_without_a_connection_says_what_to_pass() -> None:
    with pytest.raises(testing.MissingConnection, match=r"pass connection= to testing\.handle"):
        await testing.handle(Ledger, PAID)


async def test_a_missing_connection_is_reported_even_if_the_handler_swallows_it() -> None:
    class Swallow(Consumer[OrderPaid]):
        queue = "testing.swallow"

        async def handle(self, msg: OrderPaid, ctx: Context) -> None:
            try:
                async with ctx.transaction():
                    pass
            except Exception:
                pass

    with pytest.raises(testing.MissingConnection):
        await testing.handle(Swallow, PAID)


async def test_a_swallowed_rollback_fails_the_attempt_as_in_a_worker() -> None:
    class Swallow(Consumer[OrderPaid]):
        queue = "testing.swallow-rollback"

        async def handle(self, msg: OrderPaid, ctx: Context) -> None:
            try:
                async with ctx.transaction() as conn:
                    await conn.execute("INSERT ...")
                    raise KeyError("duplicate")
            except KeyError:
                pass

    result = await testing.handle(Swallow, PAID, connection=FakeConnection())
    assert result.outcome == "retrying"
    assert isinstance(result.error, TransactionRolledBack)


# --- fakes for publishing --------------------------------------------------------------------


async def test_fake_outbox_and_publisher_record_what_a_handler_sends() -> None:
    class Relay(Consumer[OrderPaid]):
        queue = "testing.relay"

        def __init__(self) -> None:
            self.outbox = testing.FakeOutbox()
            self.publisher = testing.FakePublisher()

        async def handle(self, msg: OrderPaid, ctx: Context) -> None:
            async with ctx.transaction() as conn:
                await self.outbox.enqueue(
                    conn, "shop", msg, routing_key="points", message_id=ctx.idempotency_key
                )
            await self.publisher.publish(
                "", {"order": msg.order_id}, routing_key="audit", message_id=ctx.idempotency_key
            )

    consumer = Relay()
    result = await testing.handle(consumer, PAID, message_id="m-1", connection=FakeConnection())
    assert result.outcome == "succeeded"
    (row,) = consumer.outbox.enqueued
    assert (row.exchange, row.routing_key, row.message_id) == (
        "shop",
        "points",
        "testing.relay:m-1",
    )
    assert row.json() == {"order_id": "o-1", "points": 10}
    (sent,) = consumer.publisher.published
    assert (sent.exchange, sent.routing_key, sent.content_type) == ("", "audit", "application/json")
    assert sent.json() == {"order": "o-1"}
    assert sent.message_id == "testing.relay:m-1"


@pytest.mark.parametrize("message_id", [None, ""])
async def test_fake_publisher_refuses_a_message_without_an_id_as_the_real_one_does(
    message_id: str | None,
) -> None:
    fake = testing.FakePublisher()
    with pytest.raises(MissingMessageId, match="publish\\(\\) needs a message_id") as raised:
        await fake.publish("shop", {"order": "o-1"}, message_id=message_id)
    assert fake.published == []
    assert isinstance(raised.value, ConfigurationError)
    assert isinstance(raised.value, ValueError)


async def test_a_real_publisher_refuses_a_message_without_an_id_before_it_sends() -> None:
    """Checked first: not even a connection is needed to find the mistake."""
    with pytest.raises(MissingMessageId, match="random id would make every copy look new"):
        await Publisher("amqp://guest:guest@127.0.0.1:5672/").publish("shop", {"order": "o-1"})
