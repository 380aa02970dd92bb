"""Hostile messages and unexpected errors: every delivery ends settled, none stalls its queue.

Each case publishes one bad message and then healthy ones behind it on a worker at concurrency
1: the bad one must reach a terminal ledger state with its reason, and the healthy ones must
succeed (a delivery left unacked, or requeued forever, would hold them back).
"""

from __future__ import annotations

import asyncio
import logging
from decimal import Decimal
from typing import Any

import asyncpg
import pytest
from pydantic import BaseModel, field_validator

from rabbitretry import Consumer, Context, RetryPolicy, amqp
from rabbitretry.consumer import topology_of
from rabbitretry.delivery.pipeline import Pipeline
from rabbitretry.ledger import AttemptLedger, Key, snapshot_of
from rabbitretry.operations.replay import replay, replay_targets, sender
from rabbitretry.topology import declare
from tests.integration.harness import (
    publish,
    publish_without_id,
    queue_depth,
    running_worker,
    wait_for,
    wait_status,
)
from tests.integration.test_pipeline import Job, attempt_rows, entry, make_consumer

pytestmark = pytest.mark.asyncio

FAST = RetryPolicy(max_attempts=2, initial_delay=0.2, max_delay=1.0, jitter=0.0)


async def healthy_messages_succeed(
    amqp_url: str, pool: asyncpg.Pool, queue: str, count: int = 3, timeout: float = 20.0
) -> None:
    for n in range(count):
        await publish(amqp_url, queue, {"n": n}, message_id=f"healthy-{n}")
    for n in range(count):
        await wait_status(pool, queue, f"healthy-{n}", "succeeded", timeout=timeout)


async def nothing_left_on(amqp_url: str, queue: str) -> None:
    async def empty() -> bool:
        return await queue_depth(amqp_url, queue) == 0

    await wait_for(empty, timeout=10)


async def dead_rows(pool: asyncpg.Pool, queue: str, reason: str) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT * FROM rabbitretry.ledger WHERE queue = $1 AND reason = $2 ORDER BY first_seen",
        queue,
        reason,
    )


async def _ok(msg: Job, ctx: Context) -> None:
    pass


async def publish_raw(amqp_url: str, queue: str, body: bytes, **properties: Any) -> None:
    import aio_pika

    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        await channel.default_exchange.publish(
            aio_pika.Message(body, **properties), routing_key=queue
        )
    finally:
        await connection.close()


@pytest.mark.parametrize(
    "properties",
    [
        {"headers": {"x-note": "a\x00b"}},
        {"headers": {"x-outer": {"inner": ["ok", "a\x00b"]}}},
        {"headers": {"x-note\x00": "a key with a NUL"}},
        {"headers": {"x-bytes": bytearray(b"\x00\xff"), "x-decimal": Decimal("1.50")}},
        {"correlation_id": "c\x00id"},
        {"type": "t\x00ype"},
    ],
    ids=["header", "nested-header", "header-name", "bytes-and-decimal", "correlation-id", "type"],
)
async def test_headers_and_properties_the_database_refuses_are_stored_escaped(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    properties: dict[str, Any],
) -> None:
    """Such a message is handled as any other; its snapshot keeps every value, marked."""
    seen: list[dict[str, Any]] = []

    async def handler(msg: Job, ctx: Context) -> None:
        seen.append(dict(ctx.headers))

    consumer = make_consumer(queue_name, handler, policy=FAST)
    consumer.keep_payload = "always"  # the snapshot is read from the succeeded row
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url):
        await publish_raw(amqp_url, queue_name, b'{"n": 1}', message_id="odd", **properties)
        await wait_status(pool, queue_name, "odd", "succeeded", timeout=20)
        await healthy_messages_succeed(amqp_url, pool, queue_name)
        await nothing_left_on(amqp_url, queue_name)
    row = await entry(pool, queue_name, "odd")
    snapshot = snapshot_of(row)
    assert snapshot.headers == properties.get("headers", {}) == seen[0]
    for name in ("correlation_id", "type"):
        if name in properties:
            assert snapshot.properties[name] == properties[name]


@pytest.mark.parametrize("body", [b'{"n": 1}', b'{"n": 1}' + b" " * 2000], ids=["ok", "too-large"])
async def test_a_message_id_the_database_refuses_is_dead_as_unstorable(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    body: bytes,
) -> None:
    consumer = make_consumer(queue_name, _ok, policy=FAST, max_body_bytes=1000)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url):
        await publish_raw(amqp_url, queue_name, body, message_id="m\x00id")
        await healthy_messages_succeed(amqp_url, pool, queue_name)
        (row,) = await wait_for(lambda: dead_rows(pool, queue_name, "unstorable"))
        await nothing_left_on(amqp_url, queue_name)
    assert row["message_id"] == "unstorable-id:m\\x00id"
    assert "cannot be converted to text" in row["error_message"] or "0x00" in row["error_message"]
    assert bytes(row["payload"]) == body


async def test_a_failure_message_with_a_nul_is_stored(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    async def handler(msg: Job, ctx: Context) -> None:
        raise ValueError("bad \x00 byte and a lone \ud800 surrogate")

    consumer = make_consumer(queue_name, handler, policy=FAST)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url):
        await publish(amqp_url, queue_name, {"n": 1}, message_id="nul-error")
        await wait_status(pool, queue_name, "nul-error", "dead", timeout=20)
        await nothing_left_on(amqp_url, queue_name)
    row = await entry(pool, queue_name, "nul-error")
    assert row["error_type"] == "ValueError" and "\\x00" in row["error_message"]


class Picky(BaseModel):
    n: int

    @field_validator("n")
    @classmethod
    def explode(cls, value: int) -> int:
        if value == 13:
            raise KeyError("a validator's bug")  # not a ValueError: pydantic lets it through
        return value


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ itself fails")


class NotAnException(BaseException):
    pass


def _recurse(depth: int = 0) -> int:
    return _recurse(depth + 1) + 1


async def _raise_unprintable(msg: Any, ctx: Context) -> None:
    raise Unprintable()


async def _raise_recursion(msg: Any, ctx: Context) -> None:
    _recurse()


async def _raise_base_exception(msg: Any, ctx: Context) -> None:
    raise NotAnException("a handler raised a BaseException")


@pytest.mark.parametrize(
    ("handler", "error_type"),
    [
        (_raise_unprintable, "Unprintable"),
        (_raise_recursion, "RecursionError"),
        (_raise_base_exception, "NotAnException"),
    ],
    ids=["unprintable", "recursion", "base-exception"],
)
async def test_handler_errors_of_every_kind_end_dead_after_their_attempts(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    handler: Any,
    error_type: str,
) -> None:
    async def dispatch(msg: Job, ctx: Context) -> None:
        if msg.n == 13:
            await handler(msg, ctx)

    consumer = make_consumer(queue_name, dispatch, policy=FAST)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url) as worker:
        await publish(amqp_url, queue_name, {"n": 13}, message_id="bad")
        await wait_status(pool, queue_name, "bad", "dead", timeout=20)
        await healthy_messages_succeed(amqp_url, pool, queue_name)
        await nothing_left_on(amqp_url, queue_name)
        assert worker.started
    row = await entry(pool, queue_name, "bad")
    assert (row["reason"], row["attempts"], row["error_type"]) == (
        "attempts-exhausted",
        2,
        error_type,
    )


async def test_a_validator_that_raises_keyerror_is_a_failed_attempt(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    class PickyConsumer(Consumer[Picky]):
        queue = queue_name
        retry = FAST

        async def handle(self, msg: Picky, ctx: Context) -> None:
            pass

    cleanup.append(PickyConsumer)
    async with running_worker([PickyConsumer], amqp_url, database_url):
        await publish(amqp_url, queue_name, {"n": 13}, message_id="bad")
        await wait_status(pool, queue_name, "bad", "dead", timeout=20)
        await healthy_messages_succeed(amqp_url, pool, queue_name)
        await nothing_left_on(amqp_url, queue_name)
    row = await entry(pool, queue_name, "bad")
    assert (row["error_type"], row["attempts"]) == ("KeyError", 2)


async def test_should_skip_that_raises_is_a_failed_attempt(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    class Skipper(Consumer[Job]):
        queue = queue_name
        retry = FAST

        async def should_skip(self, msg: Job, ctx: Context) -> str | None:
            if msg.n == 13:
                raise Unprintable()
            return None

        async def handle(self, msg: Job, ctx: Context) -> None:
            pass

    cleanup.append(Skipper)
    async with running_worker([Skipper], amqp_url, database_url):
        await publish(amqp_url, queue_name, {"n": 13}, message_id="bad")
        await wait_status(pool, queue_name, "bad", "dead", timeout=20)
        await healthy_messages_succeed(amqp_url, pool, queue_name)
    assert (await entry(pool, queue_name, "bad"))["error_type"] == "Unprintable"


@pytest.mark.parametrize(
    ("broken_class", "broken_method"),
    [(AttemptLedger, "schedule_retry"), (Pipeline, "_born")],
    ids=["after-the-handler", "before-the-handler"],
)
async def test_a_bug_in_our_code_requeues_and_the_crash_guard_ends_it(
    broken_class: type,
    broken_method: str,
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An exception in our own code after the claim, after the handler ran or before it
    started: requeued, counted, dead when exhausted."""

    real = getattr(broken_class, broken_method)

    async def broken(self: object, *args: Any, **kwargs: Any) -> Any:
        if any(isinstance(arg, Key) and arg.message_id == "bad" for arg in args):
            raise ZeroDivisionError("a bug in our code")
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(broken_class, broken_method, broken)

    async def handler(msg: Job, ctx: Context) -> None:
        if msg.n == 13:
            raise ConnectionError("downstream away")

    consumer = make_consumer(queue_name, handler, policy=FAST, lease=1.0)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url):
        await publish(amqp_url, queue_name, {"n": 13}, message_id="bad")
        await wait_status(pool, queue_name, "bad", "dead", timeout=30)
        await healthy_messages_succeed(amqp_url, pool, queue_name)
        await nothing_left_on(amqp_url, queue_name)
    row = await entry(pool, queue_name, "bad")
    assert row["reason"] in ("crashed", "attempts-exhausted")


async def test_each_delivery_without_an_id_gets_its_own_dead_letter(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    consumer = make_consumer(queue_name, _ok)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url):
        await publish_without_id(amqp_url, queue_name, b'{"n": 1}')
        await publish_without_id(amqp_url, queue_name, b'{"n": 1}')

        async def both_recorded() -> bool:
            return len(await dead_rows(pool, queue_name, "missing-message-id")) == 2

        await wait_for(both_recorded)
        await nothing_left_on(amqp_url, queue_name)
    rows = await dead_rows(pool, queue_name, "missing-message-id")
    assert len({r["message_id"] for r in rows}) == 2
    assert all(bytes(r["payload"]) == b'{"n": 1}' for r in rows)


async def test_a_delivery_without_an_id_stays_one_dead_letter_whatever_its_copy_meets(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    """Its dead copy is refused (the dead-letter queue was deleted under the worker): the
    ledger's row is the dead letter, so the delivery is acked, not requeued (a delivery that
    does come back, its copy cut off by a broker blip, finds its record by its content's
    hash); one dead letter, and replaying every such letter then runs the handler once."""
    runs: list[str] = []

    async def handler(msg: Job, ctx: Context) -> None:
        runs.append(ctx.message_id)

    consumer = make_consumer(queue_name, handler)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url) as worker:
        connection = await amqp.connect(amqp_url)
        try:
            channel = await connection.channel()
            await channel.queue_delete(f"{queue_name}.dead")
            await publish_without_id(amqp_url, queue_name, b'{"n": 1}')

            async def settled() -> bool:
                return bool(worker.outcomes)

            await wait_for(settled, timeout=20)
            assert await queue_depth(amqp_url, queue_name) == 0
            assert [o.result for o in worker.outcomes] == ["dead"]
            await declare(connection, topology_of([consumer]))
        finally:
            await connection.close()
        (row,) = await dead_rows(pool, queue_name, "missing-message-id")
        key = Key(queue_name, row["message_id"])
        async with sender(amqp_url) as send:
            targets = await replay_targets(pool, queue=queue_name)
            assert (await replay(pool, send, targets, actor="test")).replayed == 1
        await wait_status(pool, queue_name, key.message_id, "succeeded")
    assert runs == [key.message_id]


async def test_a_success_mark_that_matches_no_row_is_never_acked(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    """A claim lost in a database crash: the final write finds no row, so the copy is requeued."""
    runs: list[int] = []

    async def handler(msg: Job, ctx: Context) -> None:
        runs.append(ctx.attempt)
        if len(runs) == 1:  # the crash takes the claim with it
            await pool.execute(
                "DELETE FROM rabbitretry.ledger WHERE queue = $1 AND message_id = $2",
                ctx.queue,
                ctx.message_id,
            )

    consumer = make_consumer(queue_name, handler)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url):
        await publish(amqp_url, queue_name, {"n": 1}, message_id="lost-claim")
        await wait_status(pool, queue_name, "lost-claim", "succeeded", timeout=20)
        await nothing_left_on(amqp_url, queue_name)
    assert runs == [1, 1]
    assert [r["outcome"] for r in await attempt_rows(pool, queue_name, "lost-claim")] == [
        "succeeded"
    ]


@pytest.mark.parametrize("outcome", ["retry", "dead"])
async def test_a_failure_mark_that_matches_no_row_is_never_acked(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    outcome: str,
) -> None:
    runs: list[int] = []

    async def handler(msg: Job, ctx: Context) -> None:
        runs.append(ctx.attempt)
        if len(runs) == 1:
            await pool.execute(
                "DELETE FROM rabbitretry.ledger WHERE queue = $1 AND message_id = $2",
                ctx.queue,
                ctx.message_id,
            )
            raise ConnectionError("fails") if outcome == "retry" else ValueError("fails")

    policy = RetryPolicy(max_attempts=3, initial_delay=0.2, jitter=0.0, permanent_on=(ValueError,))
    consumer = make_consumer(queue_name, handler, policy=policy)
    cleanup.append(consumer)
    async with running_worker([consumer], amqp_url, database_url):
        await publish(amqp_url, queue_name, {"n": 1}, message_id="lost-claim")
        await wait_status(pool, queue_name, "lost-claim", "succeeded", timeout=20)
        await nothing_left_on(amqp_url, queue_name)
    assert len(runs) == 2


async def test_a_shutdown_during_should_skip_charges_no_attempt(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
) -> None:
    entered = asyncio.Event()

    class SlowSkip(Consumer[Job]):
        queue = queue_name

        async def should_skip(self, msg: Job, ctx: Context) -> str | None:
            entered.set()
            await asyncio.sleep(30)
            return None

        async def handle(self, msg: Job, ctx: Context) -> None:
            pass

    cleanup.append(SlowSkip)
    async with running_worker([SlowSkip], amqp_url, database_url, shutdown_timeout=0.2):
        await publish(amqp_url, queue_name, {"n": 1}, message_id="m")
        await asyncio.wait_for(entered.wait(), 15)
    row = await entry(pool, queue_name, "m")
    assert (row["status"], row["attempts"], row["attempts_forgiven"]) == ("retrying", 1, 1)
    assert [r["outcome"] for r in await attempt_rows(pool, queue_name, "m")] == ["interrupted"]


async def test_an_outage_is_logged_once_and_the_worker_resumes_by_itself(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    queue_name: str,
    cleanup: list[type[Consumer[Any]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    from urllib.parse import urlsplit

    from tests.proxy import Proxy

    parts = urlsplit(database_url)
    proxy = await Proxy(parts.hostname or "127.0.0.1", parts.port or 5432).start()
    consumer = make_consumer(queue_name, _ok)
    cleanup.append(consumer)
    caplog.set_level(logging.INFO, logger="rabbitretry")
    try:
        async with running_worker([consumer], amqp_url, proxy.url_for(database_url)):
            await proxy.cut(refuse=True)
            await publish(amqp_url, queue_name, {"n": 1}, message_id="during-outage")
            await asyncio.sleep(5)  # the outage lasts a while; the log must not repeat
            proxy.restore()
            await wait_status(pool, queue_name, "during-outage", "succeeded", timeout=60)
            await nothing_left_on(amqp_url, queue_name)
    finally:
        await proxy.close()
    unreachable = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(unreachable) == 1, [r.getMessage() for r in unreachable]
    assert any("reachable again" in r.getMessage() for r in caplog.records)
