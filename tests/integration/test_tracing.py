"""A message's whole life in one trace: Publisher, outbox, attempts, retries, dead letter, replay.

Spans are captured with the SDK's in-memory exporter (``tests.otel``) against the real broker
and database.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import aio_pika
import asyncpg
import pytest
from opentelemetry import baggage
from opentelemetry import context as otel_context
from opentelemetry.trace import SpanKind, StatusCode
from pydantic import BaseModel

from rabbitretry import Consumer, Context, Permanent, RetryPolicy, operations
from rabbitretry.ledger import Key
from rabbitretry.outbox import Outbox
from rabbitretry.publisher import Publisher
from rabbitretry.reconcile.reconciler import Reconciler
from rabbitretry.topology import delays
from tests.integration.dead_harness import Switch, orders_consumer
from tests.integration.harness import running_worker, wait_for, wait_status
from tests.integration.test_outbox import running_relay
from tests.otel import Spans, capturing, parent_id, span_id, trace_id

pytestmark = pytest.mark.asyncio


class Job(BaseModel):
    n: int


@pytest.fixture
def spans() -> Iterator[Spans]:
    with capturing() as captured:
        yield captured


def job_consumer(queue: str, fail_first: int = 0) -> type[Consumer[Job]]:
    """A consumer whose first ``fail_first`` attempts raise, then succeed."""

    class Jobs(Consumer[Job]):
        async def handle(self, msg: Job, ctx: Context) -> None:
            if ctx.attempt <= fail_first:
                raise TimeoutError(f"attempt {ctx.attempt} timed out")

    Jobs.queue = queue
    Jobs.retry = RetryPolicy(max_attempts=3, initial_delay=1.0, jitter=0.0)
    return Jobs


async def test_a_published_message_is_processed_in_the_publishers_trace(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    spans: Spans,
) -> None:
    consumer = job_consumer(queue_name)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url):
        async with Publisher(amqp_url) as publisher:
            with spans.tracer.start_as_current_span("checkout"):
                await publisher.publish("", {"n": 1}, routing_key=queue_name, message_id="m-1")
        await wait_status(pool, queue_name, "m-1", "succeeded")
        (process,) = await spans.wait_named(f"process {queue_name}")

    (checkout,) = spans.named("checkout")
    (publish,) = spans.named(f"publish {queue_name}")
    assert publish.kind is SpanKind.PRODUCER and parent_id(publish) == span_id(checkout)
    assert process.kind is SpanKind.CONSUMER and parent_id(process) == span_id(publish)
    assert trace_id(process) == trace_id(checkout)
    assert publish.attributes is not None and process.attributes is not None
    assert publish.attributes["messaging.destination.name"] == "amq.default"
    assert publish.attributes["messaging.rabbitmq.destination.routing_key"] == queue_name
    body_size = process.attributes["messaging.message.body.size"]
    assert publish.attributes["messaging.message.body.size"] == body_size == len(b'{"n":1}')
    assert {
        key: process.attributes.get(key)
        for key in (
            "messaging.system",
            "messaging.operation.type",
            "messaging.destination.name",
            "messaging.message.id",
            "rabbitretry.attempt",
            "rabbitretry.max_attempts",
            "rabbitretry.outcome",
        )
    } == {
        "messaging.system": "rabbitmq",
        "messaging.operation.type": "process",
        "messaging.destination.name": queue_name,
        "messaging.message.id": "m-1",
        "rabbitretry.attempt": 1,
        "rabbitretry.max_attempts": 3,
        "rabbitretry.outcome": "succeeded",
    }
    assert process.status.status_code is StatusCode.UNSET


async def test_a_retried_message_keeps_every_attempt_in_one_trace(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    spans: Spans,
) -> None:
    consumer = job_consumer(queue_name, fail_first=1)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url):
        async with Publisher(amqp_url) as publisher:
            await publisher.publish("", {"n": 1}, routing_key=queue_name, message_id="m-2")
        await wait_status(pool, queue_name, "m-2", "succeeded", timeout=30)
        first, second = await spans.wait_named(f"process {queue_name}", 2)

    (publish,) = spans.named(f"publish {queue_name}")
    # The retry copy carries the headers the message arrived with: both attempts are children
    # of the publish, side by side in its trace.
    assert parent_id(first) == parent_id(second) == span_id(publish)
    assert trace_id(first) == trace_id(second) == trace_id(publish)
    assert first.attributes is not None and second.attributes is not None
    assert first.attributes["rabbitretry.outcome"] == "retrying"
    assert first.attributes["rabbitretry.attempt"] == 1
    assert first.attributes["error.type"] == "TimeoutError"
    assert first.status.status_code is StatusCode.ERROR
    (event,) = [e for e in first.events if e.name == "exception"]
    assert event.attributes is not None
    assert event.attributes["exception.message"] == "attempt 1 timed out"
    assert second.attributes["rabbitretry.outcome"] == "succeeded"
    assert second.attributes["rabbitretry.attempt"] == 2
    assert second.status.status_code is StatusCode.UNSET


async def test_a_replay_links_to_the_original_and_starts_the_next_attempts_trace(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    spans: Spans,
) -> None:
    class Broken(Switch):
        broken = True

    consumer = orders_consumer(queue_name, Broken)
    consumer.keep_payload = "always"  # the snapshot is read from the succeeded row below
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url):
        async with Publisher(amqp_url) as publisher:
            with spans.tracer.start_as_current_span("order"):
                await publisher.publish("", {"order": 7}, routing_key=queue_name, message_id="o-7")
        await wait_status(pool, queue_name, "o-7", "dead")
        (died,) = await spans.wait_named(f"process {queue_name}")
        dead_copy = await _get_one(amqp_url, consumer.work_queue().dead_queue_name)

        Broken.broken = False
        async with operations.sender(amqp_url) as sender:
            report = await operations.replay(
                pool, sender, [Key(queue_name, "o-7")], actor="test:operator"
            )
        assert report.replayed == 1
        await wait_status(pool, queue_name, "o-7", "succeeded")
        _, after = await spans.wait_named(f"process {queue_name}", 2)

    (order,) = spans.named("order")
    (publish,) = spans.named(f"publish {queue_name}")
    (replay,) = spans.named(f"replay {queue_name}")
    assert died.attributes is not None and died.attributes["rabbitretry.outcome"] == "dead"
    assert died.status.status_code is StatusCode.ERROR
    assert trace_id(died) == trace_id(order)
    # The dead letter's copy still carries the original context.
    assert dead_copy.headers is not None
    assert f"{trace_id(order):032x}" in str(dead_copy.headers["traceparent"])

    # The replay is a trace of its own, linked to the message's original context ...
    assert replay.kind is SpanKind.PRODUCER and replay.parent is None
    assert trace_id(replay) != trace_id(order)
    (link,) = replay.links
    assert link.context.trace_id == trace_id(order)
    assert link.context.span_id == span_id(publish)
    assert replay.attributes is not None
    assert replay.attributes["rabbitretry.replay.actor"] == "test:operator"
    # ... and the attempt after it belongs to that trace.
    assert parent_id(after) == span_id(replay) and trace_id(after) == trace_id(replay)
    assert after.attributes is not None
    assert after.attributes["rabbitretry.outcome"] == "succeeded"
    # The ledger's snapshot keeps the replay's context, for the copies published from it.
    stored = await pool.fetchval(
        "SELECT headers ->> 'traceparent' FROM rabbitretry.ledger"
        " WHERE queue = $1 AND message_id = 'o-7'",
        queue_name,
    )
    assert stored.startswith(f"00-{trace_id(replay):032x}-{span_id(replay):016x}-")


def scripted_consumer(queue: str, script: list[str], seen: list[dict[str, object]]) -> Any:
    """A consumer whose attempts do what ``script`` says, in turn (``dead``, ``retry``, ``ok``),
    and note the baggage current in the handler."""

    class Scripted(Consumer[Job]):
        async def handle(self, msg: Job, ctx: Context) -> None:
            seen.append(dict(baggage.get_all()))
            step = script.pop(0)
            if step == "dead":
                raise Permanent("not yet")
            if step == "retry":
                raise TimeoutError("downstream slow")

    Scripted.queue = queue
    Scripted.retry = RetryPolicy(max_attempts=3, initial_delay=1.0, jitter=0.0)
    return Scripted


async def test_after_a_replay_the_retry_and_the_redrive_stay_in_the_replays_trace(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    spans: Spans,
) -> None:
    """Dead, replayed, retried, its retry copy lost and re-driven by the reconciler: every
    attempt after the replay is in the replay's trace, and sees the producer's baggage."""
    seen: list[dict[str, object]] = []
    consumer = scripted_consumer(queue_name, ["dead", "retry", "ok"], seen)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url):
        token = otel_context.attach(baggage.set_baggage("tenant", "t1"))
        try:
            async with Publisher(amqp_url) as publisher:
                await publisher.publish("", {"n": 1}, routing_key=queue_name, message_id="t-1")
        finally:
            otel_context.detach(token)
        await wait_status(pool, queue_name, "t-1", "dead")
        # The broker will lose the retry's delay copy, at the end of the delay chain.
        await _unbind_from_the_delay_chain(amqp_url, queue_name)

        async with operations.sender(amqp_url) as sender:
            report = await operations.replay(pool, sender, [Key(queue_name, "t-1")], actor="op")
        assert report.replayed == 1

        async def overdue() -> bool:
            return bool(
                await pool.fetchval(
                    "SELECT status = 'retrying' AND next_retry_at < now() - interval '1 second'"
                    " FROM rabbitretry.ledger WHERE queue = $1 AND message_id = 't-1'",
                    queue_name,
                )
            )

        await wait_for(overdue)
        reconciler = Reconciler(pool, amqp_url, grace=1.0)
        try:
            assert (await reconciler.run_once()).retries_redriven == 1
        finally:
            await reconciler.close()
        await wait_status(pool, queue_name, "t-1", "succeeded")
        died, retried, redriven = await spans.wait_named(f"process {queue_name}", 3)

    (publish,) = spans.named(f"publish {queue_name}")
    (replay,) = spans.named(f"replay {queue_name}")
    assert [span.attributes["rabbitretry.outcome"] for span in (died, retried, redriven)] == [
        "dead",
        "retrying",
        "succeeded",
    ]
    assert trace_id(died) == trace_id(publish) != trace_id(replay)
    # Both attempts after the replay are its children: the retry (a copy of the replayed
    # copy) and the re-drive (published from the ledger's snapshot).
    assert parent_id(retried) == parent_id(redriven) == span_id(replay)
    assert trace_id(retried) == trace_id(redriven) == trace_id(replay)
    # The producer's baggage reaches the handler on every attempt, the replay's included.
    assert seen == [{"tenant": "t1"}] * 3


async def _unbind_from_the_delay_chain(amqp_url: str, queue: str) -> None:
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        work = await channel.declare_queue(queue, passive=True)
        await work.unbind(delays.DELIVER_EXCHANGE, routing_key=delays.deliver_key(queue))
    finally:
        await connection.close()


async def test_an_outbox_message_is_processed_in_the_enqueuers_trace(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    spans: Spans,
) -> None:
    consumer = job_consumer(queue_name)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url):
        with spans.tracer.start_as_current_span("pay"):
            async with pool.acquire() as conn, conn.transaction():
                await Outbox().enqueue(
                    conn, "", {"n": 3}, routing_key=queue_name, message_id="paid-3"
                )
        async with running_relay(pool, amqp_url):
            await wait_status(pool, queue_name, "paid-3", "succeeded")
            (process,) = await spans.wait_named(f"process {queue_name}")

    (pay,) = spans.named("pay")
    (create,) = spans.named(f"create {queue_name}")
    assert parent_id(create) == span_id(pay)
    assert create.attributes is not None
    assert create.attributes["messaging.operation.type"] == "create"
    assert parent_id(process) == span_id(create) and trace_id(process) == trace_id(pay)


async def _get_one(amqp_url: str, queue: str) -> aio_pika.abc.AbstractIncomingMessage:
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        message = await declared.get(timeout=5, fail=True)
        assert message is not None
        await message.ack()
        return message
    finally:
        await connection.close()
