"""The state of the ledger at a glance: the landing page for people, /metrics for Prometheus."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import Response

from rabbitretry import db
from rabbitretry.console import chart
from rabbitretry.console.app import pool_of, render
from rabbitretry.console.views.lists import params_of
from rabbitretry.monitoring import metrics

CHART_MINUTES = 180


async def overview(request: Request) -> Response:
    """The landing page: per queue, what is dead, retrying and in progress, and how the last
    hours went; the latest alert."""
    pool = pool_of(request)
    async with pool.acquire() as conn:
        queues = await conn.fetch(db.query("console_overview_queues"))
        minutes = await conn.fetch(db.query("console_overview_minutes"), CHART_MINUTES)
        alerts = await conn.fetch(db.query("alerts_recent"), None, 1)
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    charts = _charts(minutes, now)
    names = sorted({*(q["queue"] for q in queues), *charts})
    counts = {q["queue"]: q for q in queues}
    return render(
        request,
        "overview.html",
        queues=[
            (name, counts.get(name), charts.get(name) or chart.svg([], name)) for name in names
        ],
        alert=alerts[0] if alerts else None,
        hours=CHART_MINUTES // 60,
        params=params_of(request),
        now=datetime.now(UTC),
    )


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
    """The ledger gauges for Prometheus, behind the login: scrape with a bearer token."""
    body = await metrics.render_ledger_metrics(pool_of(request))
    return Response(body, media_type=metrics.CONTENT_TYPE)
