"""Capturing rabbitretry's spans in a test: an SDK provider with the in-memory exporter.

The provider is handed to :func:`rabbitretry.tracing.set_tracer_provider`, not installed as
the global one (which OpenTelemetry lets a process set only once), and taken back afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator, Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer

from rabbitretry import tracing


class Spans:
    """The spans ended so far, and a tracer for the test's own spans."""

    def __init__(self, provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
        self.provider = provider
        self.exporter = exporter
        self.tracer: Tracer = provider.get_tracer("tests")

    def all(self) -> Sequence[ReadableSpan]:
        return self.exporter.get_finished_spans()

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.all() if span.name == name]

    async def wait(
        self, condition: Callable[[Sequence[ReadableSpan]], bool], *, timeout: float = 20.0
    ) -> Sequence[ReadableSpan]:
        """Poll until ``condition(spans)`` holds (a span ends just after the ledger write)."""
        deadline = time.monotonic() + timeout
        while not condition(spans := self.all()):
            if time.monotonic() > deadline:
                names = [(span.name, dict(span.attributes or {})) for span in spans]
                raise AssertionError(f"spans never matched within {timeout} s: {names}")
            await asyncio.sleep(0.05)
        return spans

    async def wait_named(self, name: str, count: int = 1) -> list[ReadableSpan]:
        await self.wait(lambda spans: sum(span.name == name for span in spans) >= count)
        return self.named(name)


@contextlib.contextmanager
def capturing() -> Iterator[Spans]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.set_tracer_provider(provider)
    try:
        yield Spans(provider, exporter)
    finally:
        tracing.set_tracer_provider(None)
        provider.shutdown()


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    return span.get_span_context().span_id


def trace_id(span: ReadableSpan) -> int:
    return span.get_span_context().trace_id
