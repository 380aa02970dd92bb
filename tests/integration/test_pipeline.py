"""One delivery through the worker against the real broker and ledger."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from pydantic import BaseModel

from rabbitretry import Consumer, Context, Permanent, RetryPolicy
from tests.integration.harness import (
    publish,
    publish_without_id,
    queue_depth,
    running_worker,
    wait_for,
    wait_status,
)
from tests.proxy import Proxy

pytestmark = pytest.mark.asyncio


class Job(BaseModel):
    n: int


def make_consumer(
    queue: str,
    handler: Any,
    *,
    queue_type: str = "classic",
    policy: RetryPolicy | None = None,
    **attributes: Any,
) -> type[Consumer[Job]]:
    class TestConsumer(Consumer[Job]):
        async def handle(self, msg: Job, ctx: Context) -> None:
            await handler(msg, ctx)

    TestConsumer.queue = queue
    TestConsumer.queue_type = queue_type  # type: ignore[assignment]
    TestConsumer.retry = policy or RetryPolicy(max_attempts=3, initial_delay=1.0, jitter=0.0)
    for name, value in attributes.items():
        setattr(TestConsumer, name, value)
    return TestConsumer


@pytest.fixture(params=["classic", "quorum"])
def queue_type(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def attempt_rows(pool: asyncpg.Pool, queue: str, message_id: str) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT * FROM rabbitretry.attempt_history WHERE queue = $1 AND message_id = $2"
        " ORDER BY attempt",
        queue,
        message_id,
    )


async def entry(pool: asyncpg.Pool, queue: str, message_id: str) -> asyncpg.Record:
    row = await pool.fetchrow(
        "SELECT * FROM rabbitretry.ledger WHERE queue = $1 AND message_id = $2", queue, message_id
    )
    assert row is not None
    return row


async def test_success_is_recorded_and_acked(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    queue_type: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    seen: list[int] = []

    async def handler(msg: Job, ctx: Context) -> None:
        seen.append(msg.n)

    consumer = make_consumer(queue_name, handler, queue_type=queue_type)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url) as worker:
        await publish(amqp_url, queue_name, {"n": 7}, message_id="m-1")
        await wait_status(pool, queue_name, "m-1", "succeeded")
        await wait_for(lambda: _async(len(worker.outcomes) == 1))
    assert seen == [7]
    row = await entry(pool, queue_name, "m-1")
    assert row["attempts"] == 1 and row["finished_at"] is not None
    rows = await attempt_rows(pool, queue_name, "m-1")
    assert [r["outcome"] for r in rows] == ["succeeded"]
    assert await queue_depth(amqp_url, queue_name) == 0  # acked, not waiting for redelivery


async def test_transient_failure_retried_at_the_scheduled_times(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    queue_type: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    async def handler(msg: Job, ctx: Context) -> None:
        if ctx.attempt < 3:
            raise ConnectionError(f"downstream unavailable (attempt {ctx.attempt})")

    policy = RetryPolicy(max_attempts=5, initial_delay=1.0, multiplier=2.0, jitter=0.0)
    consumer = make_consumer(queue_name, handler, queue_type=queue_type, policy=policy)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url) as worker:
        await publish(amqp_url, queue_name, {"n": 1}, message_id="flaky")
        await wait_status(pool, queue_name, "flaky", "succeeded", timeout=20)

    # The delay chain holds each copy until it is due: it passes the worker once. A quorum
    # chain dead-letters at-least-once, so a copy may come twice there; the ledger absorbs the
    # second (parked or dropped, the handler not run), and nothing else may differ.
    results = [o.result for o in worker.outcomes]
    handled = [r for r in results if r not in ("parked", "dropped")]
    assert handled == ["retrying", "retrying", "succeeded"], results
    assert queue_type == "quorum" or handled == results, results
    rows = await attempt_rows(pool, queue_name, "flaky")
    assert [r["outcome"] for r in rows] == ["retry", "retry", "succeeded"]
    for failed, scheduled_delay, following in zip(rows, (1.0, 2.0), rows[1:], strict=False):
        planned = (failed["retry_at"] - failed["finished_at"]).total_seconds()
        assert planned == pytest.approx(scheduled_delay, abs=0.05)
        lateness = (following["started_at"] - failed["retry_at"]).total_seconds()
        assert 0 <= lateness <= max(1.0, 0.05 * scheduled_delay), lateness


async def test_poison_dies_after_exactly_max_attempts(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    calls = 0

    async def handler(msg: Job, ctx: Context) -> None:
        nonlocal calls
        calls += 1
        raise TimeoutError("the points service did not answer")

    policy = RetryPolicy(max_attempts=3, initial_delay=1.0, multiplier=1.0, jitter=0.0)
    consumer = make_consumer(queue_name, handler, policy=policy)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url):
        await publish(amqp_url, queue_name, {"n": 1}, message_id="poison")
        await wait_status(pool, queue_name, "poison", "dead", timeout=20)
        await wait_for(lambda: _queue_has(amqp_url, f"{queue_name}.dead", 1))

    row = await entry(pool, queue_name, "poison")
    rows = await attempt_rows(pool, queue_name, "poison")
    assert calls == 3
    assert row["attempts"] == 3 == len(rows)
    assert row["reason"] == "attempts-exhausted"
    assert row["error_type"] == "TimeoutError"
    assert "did not answer" in row["error_message"]
    assert "Traceback" in row["error_traceback"]
    assert [r["outcome"] for r in rows] == ["retry", "retry", "dead"]


async def test_permanent_dies_after_one_attempt(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    async def handler(msg: Job, ctx: Context) -> None:
        raise Permanent("user 42 does not exist")

    consumer = make_consumer(queue_name, handler)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url):
        await publish(amqp_url, queue_name, {"n": 1}, message_id="perm")
        await wait_status(pool, queue_name, "perm", "dead")
    row = await entry(pool, queue_name, "perm")
    assert row["attempts"] == 1 and row["reason"] == "permanent-error"
    assert len(await attempt_rows(pool, queue_name, "perm")) == 1


async def test_duplicate_deliveries_have_one_effect(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    effects: list[str] = []

    async def handler(msg: Job, ctx: Context) -> None:
        effects.append(ctx.message_id)
        await asyncio.sleep(0.05)

    consumer = make_consumer(queue_name, handler)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url, concurrency=4) as worker:
        await publish(amqp_url, queue_name, {"n": 1}, message_id="dup", times=20)

        async def all_settled() -> bool:
            return (
                len(worker.outcomes) >= 20
                and not any(o.result == "parked" for o in worker.outcomes[-1:])
                and await queue_depth(amqp_url, queue_name) == 0
            )

        await wait_status(pool, queue_name, "dup", "succeeded")
        await wait_for(all_settled, timeout=40)
    assert effects == ["dup"]
    assert len(await attempt_rows(pool, queue_name, "dup")) == 1


async def test_invalid_payload_and_missing_id_are_dead_with_reasons(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    async def handler(msg: Job, ctx: Context) -> None:
        raise AssertionError("the handler must not see invalid input")

    consumer = make_consumer(queue_name, handler)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url):
        await publish(amqp_url, queue_name, b"{not json", message_id="bad-json")
        await publish(amqp_url, queue_name, {"n": "seven"}, message_id="bad-model")
        await publish_without_id(amqp_url, queue_name, b'{"n": 1}')
        await wait_status(pool, queue_name, "bad-json", "dead")
        await wait_status(pool, queue_name, "bad-model", "dead")

        async def missing_recorded() -> Any:
            return await pool.fetchrow(
                "SELECT * FROM rabbitretry.ledger"
                " WHERE queue = $1 AND reason = 'missing-message-id'",
                queue_name,
            )

        missing = await wait_for(missing_recorded)
    assert (await entry(pool, queue_name, "bad-json"))["reason"] == "invalid-payload"
    bad_model = await entry(pool, queue_name, "bad-model")
    assert bad_model["reason"] == "invalid-payload"
    assert "n:" in bad_model["error_message"] and "integer" in bad_model["error_message"]
    assert missing["attempts"] == 0 and missing["message_id"].startswith("missing-id:")
    assert bytes(missing["payload"]) == b'{"n": 1}'


async def _async(value: bool) -> bool:
    return value


async def _queue_has(amqp_url: str, queue: str, count: int) -> bool:
    return await queue_depth(amqp_url, queue) >= count


async def test_too_large_body_is_dead_unread(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    async def handler(msg: Job, ctx: Context) -> None:
        raise AssertionError("a too-large body must not reach the handler")

    consumer = make_consumer(queue_name, handler, max_body_bytes=64)
    cleanup.append(consumer)
    body = b'{"n": 1, "padding": "' + b"x" * 100 + b'"}'
    async with running_worker([consumer], amqp_url, database_url):
        await publish(amqp_url, queue_name, body, message_id="big")
        await wait_status(pool, queue_name, "big", "dead")
    row = await entry(pool, queue_name, "big")
    assert (row["reason"], row["attempts"]) == ("too-large", 0)
    assert "over the limit of 64 bytes" in row["error_message"]
    assert bytes(row["payload"]) == body  # kept whole: nothing is lost


async def test_attempt_timeout_fails_the_attempt(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    async def handler(msg: Job, ctx: Context) -> None:
        await asyncio.sleep(30)

    policy = RetryPolicy(max_attempts=2, initial_delay=1.0, jitter=0.0)
    consumer = make_consumer(queue_name, handler, policy=policy, timeout=0.3)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url):
        await publish(amqp_url, queue_name, {"n": 1}, message_id="slow")
        await wait_status(pool, queue_name, "slow", "dead", timeout=20)
    row = await entry(pool, queue_name, "slow")
    assert (row["error_type"], row["attempts"]) == ("TimeoutError", 2)


async def test_immediate_retries_stay_within_one_attempt(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    calls = 0

    async def handler(msg: Job, ctx: Context) -> None:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionError("blip")

    policy = RetryPolicy(max_attempts=2, immediate_retries=2, immediate_delay=0.01)
    consumer = make_consumer(queue_name, handler, policy=policy)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url):
        await publish(amqp_url, queue_name, {"n": 1}, message_id="blip")
        await wait_status(pool, queue_name, "blip", "succeeded")
    assert calls == 3
    assert (await entry(pool, queue_name, "blip"))["attempts"] == 1


async def test_lease_is_renewed_while_a_long_handler_runs(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    started = asyncio.Event()
    runs = 0

    async def handler(msg: Job, ctx: Context) -> None:
        nonlocal runs
        runs += 1
        started.set()
        await asyncio.sleep(4)  # well past the 1.5 s lease: only renewal keeps the claim

    consumer = make_consumer(queue_name, handler, lease=1.5)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url, concurrency=2) as worker:
        await publish(amqp_url, queue_name, {"n": 1}, message_id="long")
        await asyncio.wait_for(started.wait(), 10)
        await publish(amqp_url, queue_name, {"n": 1}, message_id="long")  # a duplicate copy
        await wait_status(pool, queue_name, "long", "succeeded", timeout=20)

        async def duplicate_dropped() -> bool:
            return any(o.result == "dropped" for o in worker.outcomes)

        await wait_for(duplicate_dropped, timeout=10)
    assert runs == 1
    assert any(o.result == "parked" for o in worker.outcomes)  # the copy waited for the lease
    assert (await entry(pool, queue_name, "long"))["attempts"] == 1


async def test_connection_loss_mid_handler_loses_nothing_and_runs_once(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    broker_proxy: Proxy,
) -> None:
    proxy = broker_proxy
    release = asyncio.Event()
    runs = 0

    async def handler(msg: Job, ctx: Context) -> None:
        nonlocal runs
        runs += 1
        await release.wait()

    consumer = make_consumer(queue_name, handler)
    cleanup.append(consumer)
    async with running_worker([consumer], proxy.url_for(amqp_url), database_url) as worker:
        await publish(amqp_url, queue_name, {"n": 1}, message_id="cut")
        await wait_for(lambda: _async(runs == 1))
        await proxy.cut()  # the broker requeues the unacked delivery
        release.set()  # the handler finishes; its ack cannot reach the old channel
        await wait_status(pool, queue_name, "cut", "succeeded")

        async def redelivery_dropped() -> bool:
            return any(o.result == "dropped" for o in worker.outcomes)

        await wait_for(redelivery_dropped, timeout=30)
        await wait_for(lambda: _queue_is_empty(amqp_url, queue_name), timeout=10)
    assert runs == 1
    assert len(await attempt_rows(pool, queue_name, "cut")) == 1


async def _queue_is_empty(amqp_url: str, queue: str) -> bool:
    return await queue_depth(amqp_url, queue) == 0
