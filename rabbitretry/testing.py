"""Unit-test a consumer with no broker and no database: the decisions a worker would make.

::

    from rabbitretry import testing

    async def test_a_suspended_user_is_dead_lettered() -> None:
        result = await testing.handle(AwardPoints, {"order_id": "o-1", "user_id": 13, "points": 5})
        assert result.outcome == "dead"
        assert result.reason == "permanent-error"

:func:`handle` takes one message through the same steps as a worker, minus the ledger: the
size limit, validation into the payload type, ``expires_after`` and ``should_skip``, the
handler under the consumer's ``timeout`` with its in-process ``immediate_retries``, and the
retry policy's decision. The library's own code makes each decision, so a test cannot pass
while a worker would decide otherwise.

:func:`recover` runs a consumer's recover hook (``on_dead``) for a dead message, as a worker
runs it from ``<queue>.recover``.

``ctx.transaction()`` yields the ``connection`` you pass: a real asyncpg connection (each try
runs in a savepoint, committed when the handler succeeds and rolled back when it fails, as a
worker's transaction would be; open your own transaction around the test and roll it back
afterwards) or any fake object. :class:`FakeOutbox` and :class:`FakePublisher` record what a
handler publishes.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from pydantic import BaseModel

from rabbitretry.consumer import Consumer, Context, Death, HandlerTransaction
from rabbitretry.db import Connection, Pool
from rabbitretry.delivery.attempt import oversize, run_attempt
from rabbitretry.delivery.outcome import Decided
from rabbitretry.delivery.recovery import recovery_consumer
from rabbitretry.delivery.recovery_runs import requested_death, run_headers, run_message_id
from rabbitretry.delivery.transaction import AttemptTransaction
from rabbitretry.downstream import Unbroken
from rabbitretry.errors import RabbitRetryError, TransactionRolledBack
from rabbitretry.ledger.failures import Failure, rejection
from rabbitretry.outbox import Outbox
from rabbitretry.publisher import Publisher, encode, new_message_id, require_message_id

__all__ = [
    "FakeOutbox",
    "FakePublisher",
    "MissingConnection",
    "Result",
    "Sent",
    "handle",
    "recover",
]

Payload = TypeVar("Payload")
Body = BaseModel | Mapping[str, Any] | list[Any] | str | bytes


class MissingConnection(RabbitRetryError, RuntimeError):
    """The handler used ``ctx.transaction()`` but the test passed no ``connection=``."""


@dataclass(frozen=True)
class Result:
    """What a worker would do with the message after this attempt."""

    outcome: Decided
    """``succeeded``, ``retrying``, ``dead`` or ``skipped``: the ledger status it would reach."""
    reason: str | None = None
    """Why dead (``invalid-payload``, ``too-large``, ``permanent-error``,
    ``attempts-exhausted``) or skipped (``expired``, or the reason ``should_skip`` gave)."""
    delay: float | None = None
    """For a retry: seconds until the next attempt (the ledger's ``next_retry_at``)."""
    error: BaseException | None = None
    """The exception that failed the attempt (a ``ValidationError`` for an invalid payload)."""
    failure: Failure | None = None
    """The error as the ledger would keep it: type, message, traceback, fingerprint."""


async def handle(
    consumer: type[Consumer[Payload]] | Consumer[Payload],
    body: Body,
    *,
    message_id: str = "test-message",
    attempt: int = 1,
    headers: Mapping[str, Any] | None = None,
    connection: Any = None,
    published_at: datetime | None = None,
    now: datetime | None = None,
    rng: random.Random | None = None,
) -> Result:
    """Take one delivery of ``body`` through ``consumer`` as attempt number ``attempt``.

    ``consumer`` is a class (instantiated, with ``setup()`` before and ``teardown()`` after) or
    an instance you have set up yourself (used as it is). ``body`` is a pydantic model or a
    JSON value (encoded as a publisher would), or the raw body as ``str`` or ``bytes``.
    ``published_at`` is the message's timestamp, against which ``expires_after`` is checked
    at ``now`` (default: the current time). Retry delays are jittered with ``rng`` (default:
    a ``random.Random(0)``, so that they are the same on every run).

    Raises :class:`MissingConnection` if the handler used ``ctx.transaction()`` without a
    ``connection``; any other exception of the handler is part of the :class:`Result`.
    """
    consumer_type = _type_of(consumer)
    ctx = _context(consumer_type, message_id, attempt, headers)
    now = now or datetime.now(UTC)
    steps = _Attempt(ctx, connection, published_at, now, rng or random.Random(0))
    async with _instance(consumer) as instance:
        return await steps.run(instance, _encoded(body))


async def recover(
    consumer: type[Consumer[Payload]] | Consumer[Payload],
    body: Body,
    *,
    death: Death | None = None,
    message_id: str | None = None,
    attempt: int = 1,
    replays: int = 0,
    connection: Any = None,
    rng: random.Random | None = None,
) -> Result:
    """Take one run of ``consumer``'s recover hook (``on_dead``) for the dead message ``body``
    as run number ``attempt``, the way a worker takes it from ``<queue>.recover``.

    The run goes through the worker's own recover consumer: ``msg`` is None when ``body`` does
    not validate, the run is retried under ``recover_retry`` (else ``retry``), and its
    ``ctx`` is the run's (queue ``<queue>.recover``, ``message_id``
    ``recover:<message_id>:<replays>``). ``death`` is what killed the message; without one it
    is a ``permanent-error`` of ``message_id`` (default ``"test-message"``) at its first
    attempt, or ``invalid-payload`` when ``body`` does not validate. ``consumer``, ``body``,
    ``connection`` and ``rng`` are as for :func:`handle`, and so is the :class:`Result`.

    Raises ``TypeError`` if the consumer has no ``on_dead``, ``ValueError`` for an
    ``attempt`` outside ``recover_retry``, or a ``death`` of another queue, or both ``death``
    and ``message_id``, and :class:`MissingConnection` as :func:`handle` does.
    """
    encoded = _encoded(body)
    death = requested_death(_type_of(consumer), encoded, death, message_id)
    async with _instance(consumer) as owner:
        runner = recovery_consumer(owner)
        ctx = _context(
            runner, run_message_id(death.message_id, replays), attempt, run_headers(death)
        )
        steps = _Attempt(ctx, connection, None, datetime.now(UTC), rng or random.Random(0))
        return await steps.run(runner(), encoded)


def _type_of(consumer: type[Consumer[Any]] | Consumer[Any]) -> type[Consumer[Any]]:
    return type(consumer) if isinstance(consumer, Consumer) else consumer


def _context(
    consumer_type: type[Consumer[Any]],
    message_id: str,
    attempt: int,
    headers: Mapping[str, Any] | None,
) -> Context:
    max_attempts = consumer_type.retry.max_attempts
    if not 1 <= attempt <= max_attempts:
        raise ValueError(f"attempt must be between 1 and max_attempts ({max_attempts})")
    return Context(
        queue=consumer_type.queue,
        message_id=message_id,
        attempt=attempt,
        max_attempts=max_attempts,
        redelivered=False,
        headers=dict(headers or {}),
        downstream_calls=Unbroken(consumer_type.downstreams, consumer_type.__name__),
    )


@contextlib.asynccontextmanager
async def _instance(consumer: type[Consumer[Any]] | Consumer[Any]) -> AsyncIterator[Consumer[Any]]:
    """The instance to run: the test's own as it is, or a new one set up and torn down."""
    if isinstance(consumer, Consumer):
        yield consumer
        return
    instance = consumer()
    await instance.setup()
    try:
        yield instance
    finally:
        await instance.teardown()


@dataclass
class _Attempt:
    """One attempt through the worker's attempt core, minus the ledger."""

    ctx: Context
    connection: Any
    born: datetime | None
    now: datetime
    rng: random.Random

    async def run(self, consumer: Consumer[Any], body: bytes) -> Result:
        too_large = oversize(type(consumer), body)
        if too_large is not None:
            failure = rejection(self.ctx.queue, "too-large", too_large)
            return Result("dead", "too-large", failure=failure)
        result = await run_attempt(
            consumer,
            body,
            self.ctx,
            born=self.born,
            now=self.now,
            new_transaction=self._new_transaction,
            rng=self.rng,
        )
        error = result.error
        missing = (
            error if isinstance(error, MissingConnection) else getattr(error, "__cause__", None)
        )
        if isinstance(missing, MissingConnection):
            raise missing  # a mistake in the test, not an outcome of the handler
        transaction = result.transaction
        if isinstance(transaction, AttemptTransaction) and transaction.open:
            await transaction.commit_with(_nothing_to_mark)
        return Result(result.outcome, result.reason, result.delay, result.error, result.failure)

    def _new_transaction(self) -> HandlerTransaction:
        if isinstance(self.connection, Connection):
            # The worker's own transaction class, lent the test's connection instead of a
            # pool: inside the test's transaction its transaction is a savepoint.
            return AttemptTransaction(cast(Pool, _Lender(self.connection)))
        return _FakeTransaction(self.connection)


async def _nothing_to_mark(conn: Connection) -> bool:
    return True  # no ledger in a test: the handler's success alone commits its transaction


class _Lender:
    """Lends the test's connection where a pool is expected; the test keeps owning it."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    async def acquire(self) -> Connection:
        return self._connection

    async def release(self, connection: Connection) -> None:
        pass


class _FakeTransaction:
    """``ctx.transaction()`` over a fake connection (or none): yields it, cannot roll back.

    An error raised through it still counts as a rollback, so a handler that swallows it
    fails the attempt as it would in a worker.
    """

    def __init__(self, connection: Any) -> None:
        self._connection = connection
        self.rolled_back_by: BaseException | None = None

    @contextlib.asynccontextmanager
    async def scope(self) -> AsyncIterator[Any]:
        if self._connection is None:
            error = MissingConnection(
                "the handler called ctx.transaction(), and there is no database in a test: "
                "pass connection= to testing.handle() (or testing.recover()), either a real "
                "asyncpg connection "
                "inside your test's own transaction, or a fake object to record the calls"
            )
            self.rolled_back_by = error
            raise error
        if self.rolled_back_by is not None:
            raise TransactionRolledBack(
                f"this attempt's transaction already rolled back ({self.rolled_back_by!r})"
            )
        try:
            yield self._connection
        except BaseException as error:
            self.rolled_back_by = error
            raise

    async def close(self) -> None:
        pass


def _encoded(body: Body) -> bytes:
    if isinstance(body, str):
        return body.encode()
    return encode(body)[0]


# --- recording what a handler publishes ------------------------------------------------------


@dataclass(frozen=True)
class Sent:
    """A message a handler enqueued or published."""

    exchange: str
    routing_key: str
    message_id: str
    body: bytes
    content_type: str
    headers: Mapping[str, Any] = field(default_factory=dict)
    ordering_key: str | None = None

    def json(self) -> Any:
        """The body decoded from JSON."""
        return json.loads(self.body)


class FakeOutbox(Outbox):
    """An :class:`Outbox` that records rows in ``enqueued`` instead of writing them.

    It records every call, also those of a try that then failed (whose row a worker's
    transaction would have rolled back). To test that, use the real ``Outbox`` with a real
    ``connection=`` and read the ``rabbitretry.outbox`` table.
    """

    def __init__(self) -> None:
        self.enqueued: list[Sent] = []

    async def enqueue(
        self,
        conn: Connection,
        exchange: str,
        payload: BaseModel | Mapping[str, Any] | list[Any] | bytes,
        *,
        routing_key: str = "",
        message_id: str | None = None,
        headers: Mapping[str, Any] | None = None,
        ordering_key: str | None = None,
    ) -> str:
        body, content_type = encode(payload)
        message_id = message_id or new_message_id()
        self.enqueued.append(
            Sent(
                exchange,
                routing_key,
                message_id,
                body,
                content_type,
                dict(headers or {}),
                ordering_key,
            )
        )
        return message_id


class FakePublisher(Publisher):
    """A :class:`Publisher` that records messages in ``published`` instead of sending them.

    Like the real one, it raises :class:`~rabbitretry.MissingMessageId` for a
    publish without a ``message_id``.
    """

    def __init__(self) -> None:
        super().__init__("amqp://fake-publisher/")
        self.published: list[Sent] = []

    async def connect(self) -> FakePublisher:
        return self

    async def close(self) -> None:
        pass

    async def publish(
        self,
        exchange: str,
        payload: BaseModel | Mapping[str, Any] | list[Any] | bytes,
        *,
        routing_key: str = "",
        message_id: str | None = None,
        headers: Mapping[str, Any] | None = None,
        content_type: str | None = None,
    ) -> str:
        message_id = require_message_id(message_id)  # as the real Publisher
        body, default_type = encode(payload)
        self.published.append(
            Sent(
                exchange,
                routing_key,
                message_id,
                body,
                content_type or default_type,
                dict(headers or {}),
            )
        )
        return message_id
