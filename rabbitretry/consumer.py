"""``Consumer``: the class a user subclasses, and ``Context``: what a handler knows of its message.

::

    class AwardPoints(Consumer[OrderPaid]):
        queue = "points.award"
        retry = RetryPolicy(max_attempts=8, initial_delay=2.0)

        async def handle(self, msg: OrderPaid, ctx: Context) -> None:
            ...

The payload type comes from the generic parameter (any type pydantic can validate: a model,
a ``dict``, a ``TypedDict``). Everything else is a class attribute with a sane default.
"""

from __future__ import annotations

import contextlib
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar, get_args

from pydantic import TypeAdapter

from rabbitretry import urls
from rabbitretry.db import Connection
from rabbitretry.downstream import Downstream, DownstreamCalls
from rabbitretry.errors import ConfigurationError
from rabbitretry.retry import RetryPolicy
from rabbitretry.topology import names
from rabbitretry.topology.model import (
    Binding,
    DeliveryLimit,
    Exchange,
    QueueType,
    Topology,
    WorkQueue,
)

Payload = TypeVar("Payload")
KeepPayload = Literal["until-success", "always"]
"""Whether a succeeded message keeps its payload, headers and properties in the ledger."""

# RabbitMQ requeues a delivery that is not acked within consumer_timeout (30 minutes by
# default). An attempt must end well before that, or the broker hands the message to someone
# else while the handler still runs.
MAX_ATTEMPT_TIMEOUT = 25 * 60


class HandlerTransaction(Protocol):
    """What an attempt's transaction offers the handler and the code that runs it.

    The worker's :class:`~rabbitretry.delivery.transaction.AttemptTransaction`;
    ``rabbitretry.testing`` puts a stand-in here.
    """

    rolled_back_by: BaseException | None
    """The error that rolled the transaction back, if one did."""

    def scope(self) -> contextlib.AbstractAsyncContextManager[Connection]:
        """What ``ctx.transaction()`` returns."""
        ...

    async def close(self) -> None:
        """Roll back whatever is still open (after a failed try)."""
        ...


@dataclass(frozen=True)
class Context:
    """What a handler knows of the message it is handling."""

    queue: str
    message_id: str
    attempt: int
    """This attempt's number within the current budget, from 1 (the ledger's count)."""
    max_attempts: int
    redelivered: bool
    headers: Mapping[str, Any] = field(default_factory=dict)
    x_death: Sequence[Mapping[str, Any]] = ()
    """The broker's dead-letter history: a hint for logs, never used to decide anything."""
    handler_transaction: HandlerTransaction | None = field(default=None, repr=False, compare=False)
    downstream_calls: DownstreamCalls | None = field(default=None, repr=False, compare=False)

    def transaction(self) -> contextlib.AbstractAsyncContextManager[Connection]:
        """A connection in a transaction that commits with the ledger's success mark.

        ::

            async with ctx.transaction() as conn:
                await conn.execute("INSERT INTO points_flow ...")

        The transaction commits after ``handle()`` returns, together with the message's
        ``succeeded`` mark, so the effects happen exactly once. If the handler raises, they
        roll back and the attempt is retried.
        """
        if self.handler_transaction is None:
            raise RuntimeError(
                "this Context has no database: it was not made by a worker "
                "(in a unit test, use rabbitretry.testing.handle(..., connection=...))"
            )
        return self.handler_transaction.scope()

    def downstream(self, name: str) -> contextlib.AbstractAsyncContextManager[None]:
        """A block around a call to the downstream ``name`` (one of the consumer's
        ``downstreams``)::

            async with ctx.downstream("wms"):
                await wms_client.ship(order)

        Its ``unavailable_on`` errors leave the block as
        :class:`~rabbitretry.errors.DownstreamUnavailable` and count towards its breaker; while
        the breaker is open the block raises that at once, without running the call.
        """
        if self.downstream_calls is None:
            raise RuntimeError(
                "this Context has no downstreams: it was not made by a worker "
                "(in a unit test, use rabbitretry.testing.handle(...))"
            )
        return self.downstream_calls.call(name)

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    @property
    def idempotency_key(self) -> str:
        """Stable across attempts and replays: pass it to calls outside the database."""
        return f"{self.queue}:{self.message_id}"


@dataclass(frozen=True)
class Death:
    """What ended a message dead, as its recover hook (:meth:`Consumer.on_dead`) sees it."""

    queue: str
    message_id: str
    reason: str
    """``attempts-exhausted``, ``permanent-error``, ``invalid-payload``, ``crashed``..."""
    error_type: str
    error_message: str
    attempts: int
    """The attempts charged to the message when it died."""

    def compensation_id(self, kind: str) -> str:
        """The ``message_id`` of a compensating message of ``kind`` for this death, e.g.
        ``compensate:refund:order-42``: its own id, never taken for the original."""
        return f"compensate:{kind}:{self.message_id}"


class Consumer(Generic[Payload]):
    """Subclass, set ``queue``, write :meth:`handle`.

    Class attributes:

    ``queue``            the work queue to consume (required)
    ``queue_type``       ``"classic"`` or ``"quorum"``
    ``bindings``         exchanges routed into the queue, for the topology declarer
    ``delivery_limit``   quorum queues: the ``x-delivery-limit`` to declare (None: 1000, far
                         above RabbitMQ 4's default of 20, which requeues during an outage
                         would exhaust; ``"broker-default"``: none, for a queue declared
                         before rabbitretry set one). What the broker dead-letters past it is
                         recorded by the reconciler, reason ``dead-lettered-by-broker``
    ``retry``            the :class:`RetryPolicy`
    ``timeout``          seconds one attempt may run before it fails with ``TimeoutError``
    ``lease``            seconds a claim holds without renewal: a dead worker's message is
                         taken up again this long after it died (renewed every lease / 3)
    ``max_body_bytes``   larger bodies are dead-lettered unread, reason ``too-large``
    ``expires_after``    seconds after publication (or first delivery) when a message is no
                         longer worth handling: it is finished ``skipped``, reason ``expired``
                         (None: never)
    ``downstreams``      the :class:`~rabbitretry.downstream.Downstream` services the handler
                         calls in ``async with ctx.downstream(name)`` blocks: while one's
                         breaker is open, this consumer takes no deliveries and charges nothing
    ``database_url``     the PostgreSQL database of this queue's ledger (None: the worker's,
                         ``RABBITRETRY_DATABASE_URL``): queue groups can live on different
                         primaries, the key ``(queue, message_id)`` never spans two

    ``recover_retry``    the :class:`RetryPolicy` of the recover hook's runs (None: ``retry``)
    ``keep_payload``     ``"until-success"``: a message's payload, headers and properties are
                         kept while it may be retried, replayed or re-driven, and dropped
                         from the ledger when it succeeds (its key, status, attempts and
                         times stay); ``"always"``: kept with the succeeded row too, to be
                         read in the console until the row is pruned

    Override :meth:`should_skip` to skip messages by a business rule, and :meth:`on_dead` to
    run a recover hook for every message that ends dead.
    """

    queue: ClassVar[str]
    queue_type: ClassVar[QueueType] = "classic"
    bindings: ClassVar[Sequence[Binding]] = ()
    dead_queue: ClassVar[str | None] = None
    delivery_limit: ClassVar[DeliveryLimit] = None
    retry: ClassVar[RetryPolicy] = RetryPolicy()
    timeout: ClassVar[float] = 60.0
    lease: ClassVar[float] = 15.0
    max_body_bytes: ClassVar[int] = 1024 * 1024
    expires_after: ClassVar[float | None] = None
    database_url: ClassVar[str | None] = None
    downstreams: ClassVar[Sequence[Downstream]] = ()
    recover_retry: ClassVar[RetryPolicy | None] = None
    keep_payload: ClassVar[KeepPayload] = "until-success"

    payload_adapter: ClassVar[TypeAdapter[Any]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        payload_type = _payload_type(cls)
        if payload_type is not None:
            cls.payload_adapter = TypeAdapter(payload_type)
        if "queue" not in _class_attrs(cls):
            return  # an intermediate base class: checked when a subclass names its queue
        _check(cls)

    async def setup(self) -> None:
        """Called once before the first message, e.g. to open clients. Optional."""

    async def teardown(self) -> None:
        """Called once at shutdown. Optional."""

    async def should_skip(self, msg: Payload, ctx: Context) -> str | None:
        """A reason to skip this message instead of handling it (None: handle it). Optional.

        Called before every attempt, after validation. A skipped message is finished with
        status ``skipped`` and the reason; :meth:`handle` is never called for it.
        """
        return None

    async def handle(self, msg: Payload, ctx: Context) -> None:
        raise NotImplementedError(f"{type(self).__name__}.handle() is not written")

    async def on_dead(self, msg: Payload | None, ctx: Context, death: Death) -> None:
        """The recover hook: runs once a message of this queue ends dead. Optional.

        Its run is stored with the dead row, in the same transaction, and then taken like a
        message of its own (queue ``<queue>.recover``): at least once, retried with backoff
        under ``recover_retry``, its ``ctx.transaction()`` committed exactly once, and again
        if a replayed message dies again. ``msg`` is None when the body never validated
        (``death.reason`` is then ``invalid-payload``). Publish compensating messages through
        the outbox in ``ctx.transaction()``, under ``death.compensation_id(kind)``.
        """

    @classmethod
    def has_recover_hook(cls) -> bool:
        return cls.on_dead is not Consumer.on_dead

    @classmethod
    def recover_queue(cls) -> WorkQueue:
        """The work queue of this consumer's recover hook runs (when it has one)."""
        return WorkQueue(
            name=names.recover_queue(cls.queue),
            type=cls.queue_type,
            delivery_limit=cls.delivery_limit,
        )

    @classmethod
    def work_queue(cls) -> WorkQueue:
        """This consumer's queue as topology data (work queue and dead letters)."""
        return WorkQueue(
            name=cls.queue,
            type=cls.queue_type,
            dead_queue=cls.dead_queue,
            delivery_limit=cls.delivery_limit,
            bindings=list(cls.bindings),
        )

    @classmethod
    def parse(cls, body: bytes) -> Payload:
        """The body validated into the payload type (raises ``pydantic.ValidationError``)."""
        return typing.cast(Payload, cls.payload_adapter.validate_json(body))


def topology_of(consumers: Sequence[type[Consumer[Any]]]) -> Topology:
    """The topology these consumers need, derived from their class attributes."""
    exchanges = dict.fromkeys(b.exchange for c in consumers for b in c.bindings)
    return Topology(
        exchanges=[Exchange(name=name) for name in exchanges],
        queues=[consumer.work_queue() for consumer in consumers]
        + [consumer.recover_queue() for consumer in consumers if consumer.has_recover_hook()],
    )


def _class_attrs(cls: type) -> set[str]:
    return {name for klass in cls.__mro__ if klass is not Consumer for name in vars(klass)}


def _payload_type(cls: type) -> Any:
    for base in getattr(cls, "__orig_bases__", ()):
        origin = typing.get_origin(base)
        if isinstance(origin, type) and issubclass(origin, Consumer):
            (payload_type,) = typing.get_args(base)
            if not isinstance(payload_type, TypeVar):
                return payload_type
    return None


def _check(cls: type[Consumer[Any]]) -> None:
    name = cls.__qualname__
    if not isinstance(cls.queue, str) or not cls.queue:
        raise ConfigurationError(f"{name}.queue must be a non-empty queue name")
    if not hasattr(cls, "payload_adapter"):
        raise ConfigurationError(
            f"{name} does not say its payload type: write `class {name}(Consumer[MyModel])`"
        )
    if not isinstance(cls.retry, RetryPolicy):
        raise ConfigurationError(f"{name}.retry must be a RetryPolicy")
    if cls.recover_retry is not None and not isinstance(cls.recover_retry, RetryPolicy):
        raise ConfigurationError(f"{name}.recover_retry must be a RetryPolicy or None")
    if not 0 < cls.timeout <= MAX_ATTEMPT_TIMEOUT:
        raise ConfigurationError(
            f"{name}.timeout must be between 0 and {MAX_ATTEMPT_TIMEOUT} s, below RabbitMQ's "
            "consumer_timeout (30 min by default)"
        )
    if cls.expires_after is not None and cls.expires_after <= 0:
        raise ConfigurationError(f"{name}.expires_after must be a positive number of seconds")
    if cls.database_url is not None:
        urls.check_database_url(cls.database_url, f"{name}.database_url")
    _check_downstreams(name, cls.downstreams)
    if cls.keep_payload not in get_args(KeepPayload):
        raise ConfigurationError(
            f'{name}.keep_payload must be "until-success" or "always", not {cls.keep_payload!r}'
        )
    if cls.lease < 1:
        raise ConfigurationError(f"{name}.lease must be at least 1 second")
    if cls.handle is Consumer.handle:
        raise ConfigurationError(f"{name} must define `async def handle(self, msg, ctx)`")


def _check_downstreams(name: str, downstreams: Sequence[Downstream]) -> None:
    if isinstance(downstreams, str) or not all(isinstance(d, Downstream) for d in downstreams):
        raise ConfigurationError(
            f"{name}.downstreams must be a sequence of Downstream, e.g. (Downstream('wms'),)"
        )
    names = [d.name for d in downstreams]
    if len(set(names)) != len(names):
        raise ConfigurationError(f"{name}.downstreams names a downstream twice: {names}")
