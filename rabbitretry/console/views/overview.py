"""The state of the ledger at a glance: the landing page for people, /metrics for Prometheus."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from math import ceil

from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from rabbitretry import db
from rabbitretry.console import chart
from rabbitretry.console.app import actor_of, ledger_of, ledgers_of, posted, render
from rabbitretry.console.ledgers import Ledger
from rabbitretry.console.views.lists import params_of
from rabbitretry.monitoring import metrics
from rabbitretry.monitoring.alert_content import duration
from rabbitretry.operations import OperationError, downstreams
from rabbitretry.operations.downstreams import Breaker

CHART_MINUTES = 180


@dataclass(frozen=True)
class Reading:
    """What the overview reads of one ledger database."""

    queues: list[db.Record]
    minutes: list[db.Record]
    alerts: list[db.Record]
    breakers: list[Breaker]


async def _read(home: Ledger) -> Reading:
    async with home.pool.acquire() as conn:
        queues = await conn.fetch(db.query("console_overview_queues"))
        minutes = await conn.fetch(db.query("console_overview_minutes"), CHART_MINUTES)
        alerts = await conn.fetch(db.query("alerts_recent"), None, 1)
    return Reading(queues, minutes, alerts, await downstreams.breakers(home.pool))


async def overview(request: Request) -> Response:
    """The landing page: per queue, what is dead, retrying and in progress, and how the last
    hours went; the latest alert; the downstream breakers. With several ledger databases,
    each row says which it is in, and a database that cannot be read is named."""
    ledgers = ledgers_of(request)
    readings, down = await ledgers.each(_read)
    drawn = datetime.now(UTC)
    now = drawn.replace(second=0, microsecond=0)
    queues: list[tuple[str, str, db.Record | None, Markup]] = []
    rows: list[DownstreamRow] = []
    alerts: list[db.Record] = []
    for home, reading in readings:
        label = home.label if ledgers.several else ""
        charts = _charts(reading.minutes, now)
        names = sorted({*(q["queue"] for q in reading.queues), *charts})
        counts = {q["queue"]: q for q in reading.queues}
        queues += [
            (label, name, counts.get(name), charts.get(name) or chart.svg([], name))
            for name in names
        ]
        rows += [DownstreamRow.of(breaker, drawn, label) for breaker in reading.breakers]
        alerts += reading.alerts
    alerts.sort(key=lambda alert: alert["last_seen"], reverse=True)
    return render(
        request,
        "overview.html",
        queues=queues,
        alert=alerts[0] if alerts else None,
        downstreams=rows,
        down=down,
        hours=CHART_MINUTES // 60,
        params=params_of(request),
        now=drawn,
    )


@dataclass(frozen=True)
class DownstreamRow:
    """A breaker as the overview shows it: the state's words and colour, the next probe."""

    breaker: Breaker
    state: str
    """closed, open, half-open, or "open (held)" while an operator holds it open"""
    level: str
    """the colour: closed (green), half-open (amber), open (red)"""
    next_probe: str
    failed_probes: str
    """the failed probes of this outage; "-" while closed"""
    database: str = ""
    """the label of the ledger database it is recorded in, with several"""

    @classmethod
    def of(cls, breaker: Breaker, now: datetime, database: str = "") -> DownstreamRow:
        closed = breaker.state == "closed" and not breaker.held_open
        return cls(
            database=database,
            breaker=breaker,
            state="open (held)" if breaker.held_open else breaker.state,
            level="open" if breaker.held_open else breaker.state,
            next_probe=_next_probe(breaker, now),
            failed_probes="-" if closed else f"{breaker.probes:,}",
        )


def _next_probe(breaker: Breaker, now: datetime) -> str:
    if breaker.held_open:
        return "none until closed"
    if breaker.state == "half-open":
        return f"probing ({breaker.probe_worker})"
    if breaker.state != "open" or breaker.next_probe_at is None:
        return "-"
    if breaker.next_probe_at <= now:
        return "due"
    return f"in {duration(ceil((breaker.next_probe_at - now).total_seconds()))}"


async def downstream_action(request: Request) -> Response:
    """An operator holds a downstream's breaker open, or closes it; audited, as the CLI's
    ``rabbitretry downstream open|close``."""
    form = await posted(request)
    name = str(form.get("name") or "")
    reason = str(form.get("reason") or "") or None
    action = form.get("action")
    pool = ledger_of(request, str(form.get("database") or "")).pool
    if action == "open":
        await downstreams.hold_open(pool, name, actor=actor_of(request), reason=reason)
        return RedirectResponse("/?notice=downstream-held", status_code=303)
    if action == "close":
        await downstreams.close(pool, name, actor=actor_of(request), reason=reason)
        return RedirectResponse("/?notice=downstream-closed", status_code=303)
    raise OperationError("the action must be open or close")


def _charts(rows: list[db.Record], now: datetime) -> dict[str, Markup]:
    """One chart per queue, a point a minute up to ``now`` (minutes without rows are zero)."""
    start = now - timedelta(minutes=CHART_MINUTES - 1)
    by_queue: dict[str, list[chart.Minute]] = {}
    for row in rows:
        series = by_queue.setdefault(row["queue"], [chart.Minute()] * CHART_MINUTES)
        index = int((row["minute"] - start).total_seconds() // 60)
        if 0 <= index < CHART_MINUTES:
            series[index] = chart.Minute(row["handled"], row["died"])
    return {queue: chart.svg(series, queue) for queue, series in by_queue.items()}


async def prometheus(request: Request) -> Response:
    """The ledger gauges for Prometheus, behind the login: scrape with a bearer token. With
    several databases, each gauge has a ``database`` label."""
    ledgers = ledgers_of(request)
    if not ledgers.several:
        body = await metrics.render_ledger_metrics(ledgers.first.pool)
    else:
        body = await metrics.render_ledgers_metrics({home.label: home.pool for home in ledgers})
    return Response(body, media_type=metrics.CONTENT_TYPE)


async def healthz(request: Request) -> Response:
    """Whether each ledger database answers (and would take a write), without a login: 200
    when every one does, else 503, naming the one that does not (and why, to a caller that is
    logged in). One database: ``database``; several: ``database:LABEL`` each."""
    ledgers = ledgers_of(request)
    checks = {
        (f"database:{home.label}" if ledgers.several else "database"): check
        for home, check in zip(
            ledgers,
            await asyncio.gather(*(metrics.database_check(home.pool) for home in ledgers)),
            strict=True,
        )
    }
    ok = all(check == "ok" for check in checks.values())
    if getattr(request.state, "session", None) is None:
        # Anyone may ask (a load balancer): why a database is down, which may name hosts and
        # users, is for those logged in.
        checks = {name: "ok" if check == "ok" else "unavailable" for name, check in checks.items()}
    return JSONResponse(
        {"status": "ok" if ok else "unavailable", "checks": checks},
        status_code=200 if ok else 503,
    )
