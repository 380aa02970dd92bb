"""Prometheus metrics: what a worker observes per delivery, and gauges read from the ledger.

A worker started with ``--metrics-port`` serves both on ``/metrics``. The ledger gauges are
read at scrape time (a handful of indexed queries), so every worker, and the console, shows the
same numbers; :func:`render_ledger_metrics` is what the console mounts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from datetime import UTC, datetime

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rabbitretry import db, heartbeat, levels
from rabbitretry.db import UNAVAILABLE, Executor, Pool, query
from rabbitretry.delivery.outcome import FINISHED, Outcome

log = logging.getLogger("rabbitretry.metrics")

CONTENT_TYPE = CONTENT_TYPE_LATEST
LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400)
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
ATTEMPT_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50)
LEDGER_STATUSES = ("retrying", "processing", "dead")


class WorkerMetrics:
    """The per-delivery metrics of one worker process; :meth:`observe` is the worker's hook."""

    def __init__(self, pool: Pool | None = None) -> None:
        self.pool = pool
        """used to look up when a retried message was first seen, for its latency"""
        self.registry = CollectorRegistry()
        self.processed = Counter(
            "rabbitretry_processed",
            "Deliveries handled, by queue and outcome (succeeded, retrying, dead, dropped, "
            "parked, interrupted, requeued).",
            ["queue", "outcome"],
            registry=self.registry,
        )
        self.handler_duration = Histogram(
            "rabbitretry_handler_duration_seconds",
            "Time the handler ran per attempt (in-process retries included), by outcome.",
            ["queue", "outcome"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.latency = Histogram(
            "rabbitretry_end_to_end_latency_seconds",
            "From the message's publish timestamp (else when the ledger first saw it) to its "
            "final outcome (succeeded, dead or skipped).",
            ["queue", "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.attempts = Histogram(
            "rabbitretry_attempts",
            "Attempts a message took to reach its final outcome.",
            ["queue", "outcome"],
            buckets=ATTEMPT_BUCKETS,
            registry=self.registry,
        )

    async def observe(self, queue: str, outcome: Outcome) -> None:
        """Record one delivery's outcome; never raises (metrics must not disturb the work)."""
        try:
            self.processed.labels(queue, outcome.result).inc()
            if outcome.handler_seconds is not None:
                self.handler_duration.labels(queue, outcome.result).observe(outcome.handler_seconds)
            if outcome.result in FINISHED:
                self.attempts.labels(queue, outcome.result).observe(outcome.attempt)
                started = await self._started(outcome)
                if started is not None:
                    elapsed = (datetime.now(UTC) - started).total_seconds()
                    self.latency.labels(queue, outcome.result).observe(max(0.0, elapsed))
        except Exception:
            log.exception("could not record the metrics of a delivery")

    async def _started(self, outcome: Outcome) -> datetime | None:
        """When the message began: published, else first seen (this delivery, if the first)."""
        if outcome.published_at is not None:
            return outcome.published_at
        if outcome.attempt <= 1 or outcome.key is None or self.pool is None:
            return outcome.received_at
        try:
            first_seen: datetime | None = await self.pool.fetchval(
                query("status_first_seen"), outcome.key.queue, outcome.key.message_id
            )
        except UNAVAILABLE:
            return None
        return first_seen

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Fixed(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


async def ledger_families(executor: Executor) -> list[Metric]:
    """Gauges read from the ledger: messages per queue and status, outbox, heartbeats."""
    messages = GaugeMetricFamily(
        "rabbitretry_ledger_messages",
        "Messages in the ledger by queue and status (retrying, processing, dead).",
        labels=["queue", "status"],
    )
    counts = await levels.unfinished_counts(executor)
    for queue in await levels.known_queues(executor):
        for status in LEDGER_STATUSES:
            messages.add_metric([queue, status], counts.get((queue, status), 0))

    outbox = await levels.outbox_backlog(executor)
    outbox_messages = GaugeMetricFamily(
        "rabbitretry_outbox_messages",
        "Outbox rows not yet published: pending, or failed (given up).",
        labels=["status"],
    )
    outbox_messages.add_metric(["pending"], outbox.pending)
    outbox_messages.add_metric(["failed"], outbox.failed)
    oldest = GaugeMetricFamily(
        "rabbitretry_outbox_oldest_pending_age_seconds",
        "Age of the oldest pending outbox row (0 when none is pending).",
        value=outbox.oldest_pending_seconds or 0.0,
    )

    now: datetime = await executor.fetchval(query("status_now"))
    age = GaugeMetricFamily(
        "rabbitretry_heartbeat_age_seconds",
        "Seconds since a periodic component (reconciler, alert deliverer) last finished a run.",
        labels=["component"],
    )
    healthy = GaugeMetricFamily(
        "rabbitretry_heartbeat_healthy",
        "1 when the component's last run succeeded and it is not overdue, else 0.",
        labels=["component"],
    )
    for beat in await heartbeat.read_all(executor):
        age.add_metric([beat.name], beat.age(now))
        healthy.add_metric([beat.name], 0 if beat.failing or beat.is_stale(now) else 1)
    return [messages, outbox_messages, oldest, age, healthy]


async def render_ledger_metrics(executor: Executor) -> bytes:
    """The ledger gauges in Prometheus text format, plus ``rabbitretry_ledger_up``."""
    try:
        families = await ledger_families(executor)
        up = 1
    except UNAVAILABLE as error:
        log.warning("ledger metrics unavailable: %s", error)
        families, up = [], 0
    families.append(
        GaugeMetricFamily(
            "rabbitretry_ledger_up", "1 when the ledger could be read for this scrape.", value=up
        )
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(families))
    return generate_latest(registry)


Render = Callable[[], Awaitable[bytes]]


async def _serve_http(
    render: Render, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        path = request.split(b" ", 2)[1] if request.count(b" ") >= 2 else b""
        if path.split(b"?")[0] not in (b"/metrics", b"/"):
            body, status, kind = b"not found: try /metrics\n", "404 Not Found", "text/plain"
        else:
            try:
                body, status, kind = await render(), "200 OK", CONTENT_TYPE
            except Exception:
                log.exception("could not render the metrics")
                body, status, kind = b"could not render the metrics\n", "500 Error", "text/plain"
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
        pass
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def serving(
    metrics: WorkerMetrics, pool: Pool | None, port: int, host: str = "0.0.0.0"
) -> AsyncIterator[int]:
    """Serve ``/metrics`` (the worker's metrics, and the ledger gauges when ``pool`` is given)
    on ``host:port`` (port 0: any free one); yields the port."""

    async def render() -> bytes:
        ledger = await render_ledger_metrics(pool) if pool is not None else b""
        return metrics.render() + ledger

    server = await asyncio.start_server(lambda r, w: _serve_http(render, r, w), host, port)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def worker_endpoint(database_url: str, port: int) -> AsyncIterator[WorkerMetrics]:
    """For ``rabbitretry run --metrics-port``: metrics, a small pool of their own, the server."""
    pool = await db.create_pool(database_url, min_size=1, max_size=2)
    try:
        metrics = WorkerMetrics(pool)
        async with serving(metrics, pool, port):
            log.info("metrics on http://0.0.0.0:%d/metrics", port)
            yield metrics
    finally:
        await pool.close()
