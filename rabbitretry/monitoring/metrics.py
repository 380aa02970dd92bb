"""Prometheus metrics: what a worker observes per delivery, and gauges read from the ledger.

A worker started with ``--metrics-port`` serves both on ``/metrics``, and its health on
``/healthz``. The ledger gauges are read at scrape time (a handful of indexed queries), so every
worker, and the console, shows the same numbers; :func:`render_ledger_metrics` is what the
console mounts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rabbitretry import db
from rabbitretry.db import (
    UNAVAILABLE,
    Executor,
    Pool,
    is_outage,
    outage_kind,
    query,
    write_refusal,
)
from rabbitretry.delivery.outage import Health
from rabbitretry.delivery.outcome import FINISHED, Outcome
from rabbitretry.ledger import downstreams
from rabbitretry.monitoring import heartbeat, levels

log = logging.getLogger("rabbitretry.monitoring.metrics")

CONTENT_TYPE = CONTENT_TYPE_LATEST
LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400)
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
ATTEMPT_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50)
HEALTH_TIMEOUT = 2.0  # seconds /healthz waits for the database's answer
LEDGER_STATUSES = ("retrying", "processing", "dead")
DOWNSTREAM_STATES = ("closed", "open", "half-open")


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
    """Gauges read from the ledger: messages per queue and status, outbox, heartbeats, and
    the downstream breakers."""
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
    return [messages, outbox_messages, oldest, age, healthy, *await downstream_families(executor)]


async def downstream_families(executor: Executor) -> list[Metric]:
    """Per downstream breaker (a row of ``rabbitretry.downstream``): its state, how often it
    opened, its failed probes in the current outage, its failures counted now."""
    state = GaugeMetricFamily(
        "rabbitretry_downstream_state",
        "1 for the downstream breaker's current state (closed, open, half-open), 0 for the others.",
        labels=["downstream", "state"],
    )
    opened = CounterMetricFamily(
        "rabbitretry_downstream_opened",
        "How many times the downstream's breaker has opened.",
        labels=["downstream"],
    )
    probes = GaugeMetricFamily(
        "rabbitretry_downstream_failed_probes",
        "Probes of the downstream that failed in the current outage (0 while closed).",
        labels=["downstream"],
    )
    failures = GaugeMetricFamily(
        "rabbitretry_downstream_failures",
        "Failures of the downstream counted towards its breaker's threshold now (while "
        "open: those that opened it).",
        labels=["downstream"],
    )
    for row in await downstreams.listing(executor):
        name = row["name"]
        for each in DOWNSTREAM_STATES:
            state.add_metric([name, each], 1 if row["state"] == each else 0)
        opened.add_metric([name], row["opened"])
        probes.add_metric([name], 0 if row["state"] == "closed" else row["probes"])
        failures.add_metric([name], row["failures"])
    return [state, opened, probes, failures]


async def _read_families(executor: Executor) -> list[Metric]:
    """The ledger gauges and ``rabbitretry_ledger_up`` (0, alone, when it cannot be read)."""
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
    return families


def _rendered(families: list[Metric]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(families))
    return generate_latest(registry)


async def render_ledger_metrics(executor: Executor) -> bytes:
    """The ledger gauges in Prometheus text format, plus ``rabbitretry_ledger_up``."""
    return _rendered(await _read_families(executor))


async def render_ledgers_metrics(executors: Mapping[str, Executor]) -> bytes:
    """The ledger gauges of several databases, each sample with a ``database`` label (the
    key of ``executors``); a database that cannot be read has ``rabbitretry_ledger_up 0``."""
    read = await asyncio.gather(*(_read_families(e) for e in executors.values()))
    merged: dict[str, Metric] = {}
    for database, families in zip(executors, read, strict=True):
        for family in families:
            into = merged.setdefault(
                family.name, Metric(family.name, family.documentation, family.type, family.unit)
            )
            into.samples += [
                sample._replace(labels={**sample.labels, "database": database})
                for sample in family.samples
            ]
    return _rendered(list(merged.values()))


Response = tuple[str, str, bytes]  # status line, content type, body
Route = Callable[[], Awaitable[Response]]


async def _serve_http(
    routes: dict[bytes, Route], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        path = request.split(b" ", 2)[1] if request.count(b" ") >= 2 else b""
        route = routes.get(path.split(b"?")[0])
        if route is None:
            status, kind = "404 Not Found", "text/plain"
            body = b"not found: try /metrics or /healthz\n"
        else:
            try:
                status, kind, body = await route()
            except Exception:
                log.exception("could not answer %s", path.decode(errors="replace"))
                status, kind, body = "500 Error", "text/plain", b"internal error\n"
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


async def database_check(pool: Pool) -> str:
    """``"ok"`` when the database answers within HEALTH_TIMEOUT and would take a write, else
    why not (a read-only standby answers queries, but the ledger cannot be written)."""
    try:
        async with asyncio.timeout(HEALTH_TIMEOUT):
            refusal = await write_refusal(pool)
    except TimeoutError:
        return f"the database did not answer within {HEALTH_TIMEOUT:g} s"
    except Exception as error:
        if is_outage(error):
            return f"the database is {outage_kind(error)}: {type(error).__name__}: {error}"
        return f"the database does not answer: {type(error).__name__}: {error}"
    return refusal or "ok"


Pools = Pool | Mapping[str, Pool] | None
"""A worker's ledger databases: one pool, or a pool per database label (several)."""


def _labelled(pools: Pools) -> dict[str, Pool]:
    if pools is None:
        return {}
    return dict(pools) if isinstance(pools, Mapping) else {"": pools}


async def health_response(health: Callable[[], Health] | None, pools: Pools) -> Response:
    """``/healthz``: 200 and ``{"status": "ok", "checks": {...}}`` when every check is ok,
    else 503 and ``"status": "unavailable"``; each check says ``"ok"`` or what is wrong. The
    database check is ``database``, or ``database:LABEL`` for each of several databases."""
    checks = dict(health().checks) if health is not None else {}
    labelled = _labelled(pools)
    answers = await asyncio.gather(*(database_check(pool) for pool in labelled.values()))
    for label, answer in zip(labelled, answers, strict=True):
        checks[f"database:{label}" if len(labelled) > 1 else "database"] = answer
    ok = all(state == "ok" for state in checks.values())
    document = {"status": "ok" if ok else "unavailable", "checks": checks}
    body = (json.dumps(document) + "\n").encode()
    return ("200 OK" if ok else "503 Service Unavailable"), "application/json", body


@contextlib.asynccontextmanager
async def serving(
    metrics: WorkerMetrics,
    pool: Pools,
    port: int,
    host: str = "127.0.0.1",
    health: Callable[[], Health] | None = None,
) -> AsyncIterator[int]:
    """Serve ``/metrics`` (the worker's metrics, and the ledger gauges when ``pool`` is given)
    and ``/healthz`` (``health``'s checks, and the database's when ``pool`` is given) on
    ``host:port`` (port 0: any free one); yields the port. ``pool`` may be a pool per
    database label: each database is then checked, and its gauges have a ``database`` label."""
    labelled = _labelled(pool)

    async def render() -> Response:
        if len(labelled) > 1:
            ledger = await render_ledgers_metrics(labelled)
        else:
            ledger = b"".join([await render_ledger_metrics(p) for p in labelled.values()])
        return "200 OK", CONTENT_TYPE, metrics.render() + ledger

    async def healthz() -> Response:
        return await health_response(health, labelled)

    routes: dict[bytes, Route] = {b"/metrics": render, b"/": render, b"/healthz": healthz}
    server = await asyncio.start_server(lambda r, w: _serve_http(routes, r, w), host, port)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def worker_endpoint(
    database_url: str | Mapping[str, str],
    port: int,
    host: str = "127.0.0.1",
    health: Callable[[], Health] | None = None,
) -> AsyncIterator[WorkerMetrics]:
    """For ``rabbitretry run --metrics-port``: metrics, a small pool of their own per ledger
    database (``database_url``, or a URL per label: every database the worker uses), the
    server."""
    given = database_url
    urls = dict(given) if isinstance(given, Mapping) else {"": given}
    pools: dict[str, Pool] = {}
    try:
        for label, url in urls.items():
            pools[label] = await db.create_pool(url, min_size=1, max_size=2)
        metrics = WorkerMetrics(next(iter(pools.values())))
        async with serving(metrics, pools, port, host, health) as bound:
            base = f"http://{f'[{host}]' if ':' in host else host}:{bound}"
            log.info("metrics on %s/metrics, health on %s/healthz", base, base)
            yield metrics
    finally:
        for pool in pools.values():
            await pool.close()
