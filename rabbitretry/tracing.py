"""Tracing with OpenTelemetry when the ``otel`` extra is installed, and nothing otherwise.

This is the only module that imports ``opentelemetry``, and it does so once, at import time:
without the package every hook below returns a shared do-nothing object (no span, no header
touched, no allocation worth the name). With it, rabbitretry uses the global tracer provider
and propagator that the application configured (or the one given to
:func:`set_tracer_provider`), so no tracing happens until an SDK is set up.

How a message's trace context travels (W3C ``traceparent``/``tracestate`` headers, or whatever
propagator the application installed):

- :class:`~rabbitretry.publisher.Publisher` opens a PRODUCER span ``publish <destination>``
  (a child of the caller's current span) and injects it into the message's headers;
  :class:`~rabbitretry.outbox.Outbox` does the same with a ``create <destination>`` span when
  the row is enqueued, inside the caller's transaction, so the relay, which publishes the
  row's headers unchanged, sends the caller's context.
- The worker opens one CONSUMER span ``process <queue>`` per delivery, whose parent is the
  context in the delivery's headers. Retry copies, parked copies and dead letters are
  republished with the headers the message arrived with, so every attempt of a message is a
  child of the same producer span: one trace, with the attempts side by side.
- A replay (:func:`rabbitretry.operations.dead_letter.replay_one`) opens a PRODUCER span
  ``replay <queue>`` in the operator's current context (a new trace when there is none) with
  a *link* to the original message's context. The replayed copy, and the ledger's snapshot,
  carry the replay's context with the original's baggage (never the operator's): the attempts
  after a replay, a reconciler's re-drive included, belong to the replay's trace, which
  points back to the original one, and the handler still sees the producer's baggage.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol

from rabbitretry.message.storable import storable_text

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from rabbitretry.amqp import IncomingMessage

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.context import Context
    from opentelemetry.propagators.textmap import Getter
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
except ImportError:  # the ``otel`` extra is not installed: every hook is a no-op
    ENABLED = False
else:
    ENABLED = True

    class _HeaderGetter(Getter[Mapping[str, Any]]):
        """Reads AMQP headers, whose values may arrive as bytes."""

        def get(self, carrier: Mapping[str, Any], key: str) -> list[str] | None:
            value = carrier.get(key)
            if value is None:
                return None
            if isinstance(value, bytes | bytearray):
                value = bytes(value).decode("utf-8", "replace")
            return [str(value)]

        def keys(self, carrier: Mapping[str, Any]) -> list[str]:
            return [str(key) for key in carrier]

    _GETTER = _HeaderGetter()


SYSTEM = "rabbitmq"
TRACER_NAME = "rabbitretry"

Headers = Mapping[str, Any] | None
Stamp = Callable[[dict[str, Any]], dict[str, Any]]

_provider: TracerProvider | None = None
_tracer_cache: Any = None


def set_tracer_provider(provider: TracerProvider | None) -> None:
    """Use ``provider`` for rabbitretry's spans instead of the global one (None: global again).

    For tests and for applications that keep several providers; most applications configure
    the global provider and never call this.
    """
    global _provider, _tracer_cache
    _provider, _tracer_cache = provider, None


def _tracer() -> Any:
    global _tracer_cache
    if _tracer_cache is None:
        version = importlib.metadata.version("rabbitretry")
        _tracer_cache = trace.get_tracer(TRACER_NAME, version, tracer_provider=_provider)
    return _tracer_cache


# --- producers: Publisher, Outbox ------------------------------------------------------------


def publish_span(
    exchange: str,
    routing_key: str,
    message_id: str,
    headers: Headers,
    *,
    body_size: int | None = None,
) -> contextlib.AbstractContextManager[Headers]:
    """A ``publish`` span around one publish; yields the headers to send (with its context).

    A ``traceparent`` the caller put in ``headers`` (forwarding another message's context) is
    the span's parent; otherwise the caller's current span is. ``body_size``: the body's bytes.
    """
    if not ENABLED:
        return contextlib.nullcontext(headers)
    return _producer("publish", "send", exchange, routing_key, message_id, headers, body_size)


def enqueue_span(
    exchange: str,
    routing_key: str,
    message_id: str,
    headers: Headers,
    *,
    body_size: int | None = None,
) -> contextlib.AbstractContextManager[Headers]:
    """A ``create`` span around an outbox enqueue; yields the headers to store in the row."""
    if not ENABLED:
        return contextlib.nullcontext(headers)
    return _producer("create", "create", exchange, routing_key, message_id, headers, body_size)


@contextlib.contextmanager
def _producer(
    operation: str,
    operation_type: str,
    exchange: str,
    routing_key: str,
    message_id: str,
    headers: Headers,
    body_size: int | None,
) -> Iterator[Headers]:
    parent = propagate.extract(headers or {}, context=otel_context.get_current(), getter=_GETTER)
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.name": operation,
        "messaging.operation.type": operation_type,
        "messaging.destination.name": exchange or "amq.default",
        "messaging.message.id": storable_text(message_id),
    }
    if body_size is not None:
        attributes["messaging.message.body.size"] = body_size
    if routing_key:
        attributes["messaging.rabbitmq.destination.routing_key"] = routing_key
    with _tracer().start_as_current_span(
        f"{operation} {exchange or routing_key or 'amq.default'}",
        context=parent,
        kind=SpanKind.PRODUCER,
        attributes=attributes,
    ) as span:
        yield _stamped(dict(headers or {}), trace.set_span_in_context(span, parent))


def _stamped(headers: dict[str, Any], context: Context) -> dict[str, Any]:
    """``headers`` carrying ``context``: the propagator's old fields are replaced, not merged
    (a stale ``tracestate`` must not travel with a new ``traceparent``)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=context)
    if not carrier:  # nothing to propagate (no SDK, no span): leave what the message carried
        return headers
    for field in propagate.get_global_textmap().fields:
        headers.pop(field, None)
    headers.update(carrier)
    return headers


# --- the worker: one span per delivery --------------------------------------------------------


class Settled(Protocol):
    """What the span needs of a delivery's outcome (a ``delivery.outcome.Outcome``)."""

    @property
    def result(self) -> str: ...
    @property
    def attempt(self) -> int: ...


class Failed(Protocol):
    """What the span needs of a failure (:class:`rabbitretry.ledger.failures.Failure`)."""

    @property
    def type(self) -> str: ...


class Attempted(Protocol):
    """What the span needs of an attempt's result (a ``delivery.attempt.AttemptResult``)."""

    @property
    def reason(self) -> str | None: ...
    @property
    def failure(self) -> Failed | None: ...
    @property
    def error(self) -> BaseException | None: ...


class DeliverySpan:
    """The worker's handle on a delivery's span: the pipeline reports what became of it."""

    __slots__ = ("_span",)

    def __init__(self, span: Any = None) -> None:
        self._span = span

    def outcome(self, outcome: Settled) -> None:
        span = self._span
        if span is None or not span.is_recording():
            return
        span.set_attribute("rabbitretry.outcome", outcome.result)
        if outcome.attempt:
            span.set_attribute("rabbitretry.ledger_attempt", outcome.attempt)
        if outcome.result in ("retrying", "dead"):
            span.set_status(Status(StatusCode.ERROR, outcome.result))

    def attempt(self, attempt: int, max_attempts: int, result: Attempted) -> None:
        span = self._span
        if span is None or not span.is_recording():
            return
        span.set_attribute("rabbitretry.attempt", attempt)
        span.set_attribute("rabbitretry.max_attempts", max_attempts)
        if result.reason:
            span.set_attribute("rabbitretry.reason", result.reason)
        if result.failure is not None:
            span.set_attribute("error.type", result.failure.type)
        if result.error is not None:
            span.record_exception(result.error)


_NO_SPAN = DeliverySpan()
_NO_DELIVERY: contextlib.nullcontext[DeliverySpan] = contextlib.nullcontext(_NO_SPAN)
_current: ContextVar[DeliverySpan] = ContextVar("rabbitretry_delivery_span", default=_NO_SPAN)


def delivery_span(
    queue: str, message: IncomingMessage
) -> contextlib.AbstractContextManager[DeliverySpan]:
    """The CONSUMER span ``process <queue>`` around one delivery, current while it runs (the
    handler's own spans are its children); its parent is the context in the headers."""
    if not (ENABLED and _configured()):
        return _NO_DELIVERY
    return _delivery(queue, message)


def _configured() -> bool:
    """Whether a tracer provider is set up: with the API alone every span is a no-op, and
    building one per delivery for nothing would cost the worker's hot path."""
    if _provider is not None:
        return True
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def record_attempt(attempt: int, max_attempts: int, result: Attempted) -> None:
    """Note what the attempt decided on the current delivery's span (the failure, if any)."""
    if ENABLED:
        _current.get().attempt(attempt, max_attempts, result)


@contextlib.contextmanager
def _delivery(queue: str, message: IncomingMessage) -> Iterator[DeliverySpan]:
    parent = propagate.extract(message.headers or {}, context=Context(), getter=_GETTER)
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.destination.name": queue,
        "messaging.message.body.size": len(message.body),
    }
    # What a producer sent may hold lone surrogates, which an exporter could not encode.
    if message.message_id:
        attributes["messaging.message.id"] = storable_text(message.message_id)
    if message.correlation_id:
        attributes["messaging.message.conversation_id"] = storable_text(message.correlation_id)
    if message.routing_key:
        attributes["messaging.rabbitmq.destination.routing_key"] = storable_text(
            message.routing_key
        )
    if message.delivery_tag is not None:
        attributes["messaging.rabbitmq.message.delivery_tag"] = message.delivery_tag
    span = _tracer().start_span(
        f"process {queue}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
    )
    handle = DeliverySpan(span)
    token = otel_context.attach(trace.set_span_in_context(span, parent))
    current = _current.set(handle)
    try:
        yield handle
    except asyncio.CancelledError:
        span.set_attribute("rabbitretry.outcome", "interrupted")
        raise
    except BaseException as error:
        span.set_attribute("rabbitretry.outcome", "requeued")
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__qualname__}"))
        raise
    finally:
        _current.reset(current)
        otel_context.detach(token)
        span.end()


# --- dead-letter replay -----------------------------------------------------------------------


def _identity(headers: dict[str, Any]) -> dict[str, Any]:
    return headers


_NO_REPLAY: contextlib.nullcontext[Stamp] = contextlib.nullcontext(_identity)


def replay_span(
    queue: str,
    message_id: str,
    original_headers: Headers,
    *,
    actor: str,
    edited: bool,
    body_size: int | None = None,
) -> contextlib.AbstractContextManager[Stamp]:
    """A PRODUCER span ``replay <queue>`` linked to the original message's context.

    Yields a function that puts the replay's context into headers (the copy's, and the
    ledger's snapshot, so that every later copy continues the replay's trace). Only the span
    changes: what else the original carried (the producer's baggage) travels on, and the
    operator's own baggage is not added, since the handler reads the message's. Without the
    extra, or without an SDK (no span to stamp), it is the identity.
    """
    if not ENABLED:
        return _NO_REPLAY
    return _replay(queue, message_id, original_headers, actor, edited, body_size)


@contextlib.contextmanager
def _replay(
    queue: str,
    message_id: str,
    original_headers: Headers,
    actor: str,
    edited: bool,
    body_size: int | None,
) -> Iterator[Stamp]:
    received = propagate.extract(original_headers or {}, context=Context(), getter=_GETTER)
    original = trace.get_current_span(received).get_span_context()
    links = [Link(original, {"rabbitretry.link": "replayed-message"})] if original.is_valid else []
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.name": "replay",
        "messaging.operation.type": "send",
        "messaging.destination.name": "amq.default",
        "messaging.rabbitmq.destination.routing_key": queue,
        "messaging.message.id": storable_text(message_id),
        "rabbitretry.replay.actor": actor,
        "rabbitretry.replay.edited": edited,
    }
    if body_size is not None:
        attributes["messaging.message.body.size"] = body_size
    with _tracer().start_as_current_span(
        f"replay {queue}", kind=SpanKind.PRODUCER, links=links, attributes=attributes
    ) as span:
        if not span.get_span_context().is_valid:
            # No SDK: stamping would only drop the original's context and add the operator's
            # baggage; the copy keeps what the message carried.
            yield _identity
            return
        # The message's own context with the span replaced: the producer's baggage stays.
        context = trace.set_span_in_context(span, received)
        yield lambda headers: _stamped(headers, context)
