"""rabbitretry.tracing: header stamping, span parents and outcomes; nothing without the extra."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry import baggage
from opentelemetry import context as otel_context
from opentelemetry.trace import StatusCode

from rabbitretry import tracing
from rabbitretry.delivery.attempt import AttemptResult
from rabbitretry.delivery.outcome import Outcome
from rabbitretry.ledger.failures import describe
from tests.otel import Spans, capturing, parent_id, span_id, trace_id

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def spans() -> Iterator[Spans]:
    with capturing() as captured:
        yield captured


def delivery(headers: dict[str, Any] | None = None, **properties: Any) -> Any:
    fields = {
        "headers": headers,
        "body": b'{"n": 1}',
        "message_id": "m-1",
        "correlation_id": None,
        "routing_key": "jobs",
        "delivery_tag": 7,
        **properties,
    }
    return SimpleNamespace(**fields)


def test_without_the_extra_nothing_is_imported_and_nothing_changes() -> None:
    """With opentelemetry unimportable, the hooks hand back what they were given."""
    script = textwrap.dedent(
        """
        import sys
        sys.modules["opentelemetry"] = None  # as if the extra were not installed
        import rabbitretry
        from rabbitretry import outbox, publisher, tracing
        from rabbitretry.operations import dead_letter
        from rabbitretry.delivery import pipeline, worker

        assert tracing.ENABLED is False
        assert not [name for name in sys.modules if name.startswith("opentelemetry.")]
        headers = {"traceparent": "kept", "a": 1}
        with tracing.publish_span("ex", "rk", "m", headers) as sent:
            assert sent is headers
        with tracing.enqueue_span("ex", "rk", "m", None) as stored:
            assert stored is None
        with tracing.delivery_span("q", object()) as span:
            span.outcome(object())
            tracing.record_attempt(1, 3, object())
        with tracing.replay_span("q", "m", headers, actor="a", edited=False) as stamp:
            assert stamp(headers) is headers
        assert headers == {"traceparent": "kept", "a": 1}
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_publish_span_is_a_child_of_the_current_span_and_travels_in_the_headers(
    spans: Spans,
) -> None:
    headers = {"tracestate": "stale=1", "keep": "me"}
    with (
        spans.tracer.start_as_current_span("caller") as caller,
        tracing.publish_span("orders", "order.paid", "o-1", headers) as sent,
    ):
        pass
    (publish,) = spans.named("publish orders")
    assert parent_id(publish) == caller.get_span_context().span_id
    assert sent is not None and sent["keep"] == "me"
    assert "tracestate" not in sent  # a stale tracestate does not ride with a new traceparent
    assert sent["traceparent"].startswith(f"00-{trace_id(publish):032x}-{span_id(publish):016x}-")
    assert headers == {"tracestate": "stale=1", "keep": "me"}  # the caller's dict is untouched
    assert publish.attributes is not None
    assert publish.attributes["messaging.destination.name"] == "orders"
    assert publish.attributes["messaging.rabbitmq.destination.routing_key"] == "order.paid"
    assert publish.attributes["messaging.operation.type"] == "send"


def test_a_traceparent_given_by_the_caller_is_the_publish_spans_parent(spans: Spans) -> None:
    with tracing.publish_span("", "jobs", "m", {"traceparent": PARENT}) as sent:
        pass
    (publish,) = spans.named("publish jobs")
    assert f"{trace_id(publish):032x}" == PARENT.split("-")[1]
    assert f"{parent_id(publish):016x}" == PARENT.split("-")[2]
    assert sent is not None and sent["traceparent"] != PARENT


def test_delivery_span_continues_the_headers_context_even_as_bytes(spans: Spans) -> None:
    message = delivery({"traceparent": PARENT.encode()}, correlation_id="c-1")
    with tracing.delivery_span("jobs", message) as span:
        tracing.record_attempt(2, 5, AttemptResult("succeeded"))
        span.outcome(Outcome(None, "succeeded", attempt=4))
    (process,) = spans.named("process jobs")
    assert f"{trace_id(process):032x}" == PARENT.split("-")[1]
    assert process.attributes is not None
    assert process.attributes["messaging.message.conversation_id"] == "c-1"
    assert process.attributes["messaging.rabbitmq.message.delivery_tag"] == 7
    assert process.attributes["rabbitretry.attempt"] == 2
    assert process.attributes["rabbitretry.ledger_attempt"] == 4


def test_delivery_span_without_context_is_a_root_and_records_failures(spans: Spans) -> None:
    error = ValueError("bad")
    failure = describe("jobs", error)
    result = AttemptResult("dead", reason="permanent-error", error=error, failure=failure)
    with (
        spans.tracer.start_as_current_span("worker-ambient"),
        tracing.delivery_span("jobs", delivery(message_id="\udcff")) as span,
    ):
        tracing.record_attempt(1, 3, result)
        span.outcome(Outcome(None, "dead", attempt=1))
    (process,) = spans.named("process jobs")
    assert process.parent is None  # the message's context, not the worker's, is the parent
    assert process.status.status_code is StatusCode.ERROR
    assert process.attributes is not None
    assert process.attributes["rabbitretry.reason"] == "permanent-error"
    assert process.attributes["error.type"] == "ValueError"
    assert process.attributes["messaging.message.id"] == "\\udcff"  # an exporter can encode it
    assert [event.name for event in process.events] == ["exception"]


def test_delivery_span_marks_errors_and_interruptions(spans: Spans) -> None:
    with pytest.raises(RuntimeError), tracing.delivery_span("jobs", delivery()):
        raise RuntimeError("ours")
    with pytest.raises(asyncio.CancelledError), tracing.delivery_span("jobs", delivery()):
        raise asyncio.CancelledError
    failed, interrupted = spans.named("process jobs")
    assert failed.attributes is not None and interrupted.attributes is not None
    assert failed.attributes["rabbitretry.outcome"] == "requeued"
    assert failed.status.status_code is StatusCode.ERROR
    assert interrupted.attributes["rabbitretry.outcome"] == "interrupted"
    assert interrupted.status.status_code is StatusCode.UNSET


def test_replay_span_links_the_original_and_stamps_its_own_context(spans: Spans) -> None:
    original = {"traceparent": PARENT, "tracestate": "vendor=1", "x": 1}
    with tracing.replay_span("jobs", "m-1", original, actor="op", edited=True) as stamp:
        copy = stamp(dict(original))
    (replay,) = spans.named("replay jobs")
    (link,) = replay.links
    assert f"{link.context.trace_id:032x}" == PARENT.split("-")[1]
    assert replay.parent is None and trace_id(replay) != link.context.trace_id
    assert copy.keys() == {"traceparent", "x"}  # the original's tracestate is not carried
    assert copy["traceparent"].startswith(f"00-{trace_id(replay):032x}-{span_id(replay):016x}-")
    assert replay.attributes is not None and replay.attributes["rabbitretry.replay.edited"]


def test_replay_of_a_message_without_context_has_no_link(spans: Spans) -> None:
    with tracing.replay_span("jobs", "m-1", {}, actor="op", edited=False) as stamp:
        copy = stamp({})
    (replay,) = spans.named("replay jobs")
    assert replay.links == () or list(replay.links) == []
    assert "traceparent" in copy


@contextlib.contextmanager
def operator_baggage(**entries: str) -> Iterator[None]:
    """``entries`` as the baggage of the current context (the operator's, for a replay)."""
    context = otel_context.get_current()
    for name, value in entries.items():
        context = baggage.set_baggage(name, value, context)
    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)


@pytest.mark.parametrize(
    ("original", "kept"),
    [
        ({"baggage": "tenant=t1"}, "tenant=t1"),  # the producer's baggage travels on
        ({}, None),  # and the operator's never joins the message
    ],
)
def test_a_replayed_copy_carries_the_producers_baggage_not_the_operators(
    spans: Spans, original: dict[str, str], kept: str | None
) -> None:
    headers = {"traceparent": PARENT, **original}
    with (
        operator_baggage(operator="alice"),
        tracing.replay_span("jobs", "m-1", headers, actor="op", edited=False) as stamp,
    ):
        copy = stamp(dict(headers))
    (replay,) = spans.named("replay jobs")
    assert copy["traceparent"].startswith(f"00-{trace_id(replay):032x}-{span_id(replay):016x}-")
    assert copy.get("baggage") == kept


def test_without_an_sdk_a_replayed_copy_keeps_its_headers() -> None:
    """With the API alone the replay has no context of its own to stamp: the copy keeps the
    original's (so a worker with an SDK still continues the original trace)."""
    headers = {"traceparent": PARENT, "baggage": "tenant=t1"}
    with (
        operator_baggage(operator="alice"),
        tracing.replay_span("jobs", "m-1", headers, actor="op", edited=False) as stamp,
    ):
        copy = stamp(dict(headers))
    assert copy == headers


def test_producer_spans_carry_the_body_size(spans: Spans) -> None:
    with tracing.publish_span("", "jobs", "m", None, body_size=12):
        pass
    with tracing.enqueue_span("", "jobs", "m", None, body_size=7):
        pass
    with tracing.replay_span("jobs", "m", {}, actor="op", edited=False, body_size=0):
        pass
    sizes = {
        span.name: (span.attributes or {}).get("messaging.message.body.size")
        for span in spans.all()
    }
    assert sizes == {"publish jobs": 12, "create jobs": 7, "replay jobs": 0}


@pytest.mark.parametrize(
    "headers",
    [
        {"traceparent": b"\xff\xfe"},
        {"traceparent": 42, "tracestate": None, "baggage": ["a"]},
        {"traceparent": "00-00000000000000000000000000000000-0000000000000000-01"},
        {b"traceparent": PARENT, "x": {"nested": 1}},
    ],
)
def test_hostile_trace_headers_make_a_root_span(spans: Spans, headers: dict[Any, Any]) -> None:
    with tracing.delivery_span("jobs", delivery(headers)) as span:
        span.outcome(Outcome(None, "succeeded"))
    (process,) = spans.named("process jobs")
    assert process.parent is None
