"""The console's pages and actions; every action is an :mod:`rabbitretry.operations` call."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from markupsafe import Markup
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from rabbitretry import db, ledger, operations
from rabbitretry.console import chart, display, forms, listing, security
from rabbitretry.console.app import (
    actor_of,
    config_of,
    failed_login,
    jobs_of,
    pool_of,
    posted,
    refuse_cross_site,
    refuse_throttled,
    render,
    revoke,
    session_of,
    set_session_cookie,
)
from rabbitretry.console.replay_jobs import Job
from rabbitretry.monitoring import metrics
from rabbitretry.operations import OperationError, Progress, ReplayReport

REFRESH_SECONDS = ("30", "60", "300")  # the auto-refresh a list may ask for
CHART_MINUTES = 180
EXPORT_LIMIT = 1_000_000


# ---------------------------------------------------------------- login


async def login_page(request: Request) -> Response:
    if request.state.session is not None:
        return RedirectResponse(_local(request.query_params.get("next")), status_code=303)
    return _login_form(request)


def _login_form(
    request: Request, error: str = "", status_code: int = 200, target: str | None = None
) -> Response:
    auth = config_of(request).auth
    return render(
        request,
        "login.html",
        status_code,
        error=error,
        with_token=bool(auth.token),
        with_password=bool(auth.user or auth.users),
        next=_local(target or request.query_params.get("next")),
    )


async def login(request: Request) -> Response:
    refuse_cross_site(request)
    refuse_throttled(request)
    form = await request.form()
    user, password, token, name = (
        str(form.get(k) or "").strip() for k in ("user", "password", "token", "name")
    )
    config = config_of(request)
    if not config.auth.check_login(user, password, token):
        failed_login(request, user or "token")
        return _login_form(request, "wrong credentials", 401, str(form.get("next") or ""))
    who = user if user and not token else (name or "token")
    if len(who) > security.MAX_NAME:
        too_long = f"the name is too long (at most {security.MAX_NAME} characters)"
        return _login_form(request, too_long, 400, str(form.get("next") or ""))
    response = RedirectResponse(_local(str(form.get("next") or "")), status_code=303)
    set_session_cookie(response, security.new_session(who), config, request)
    return response


async def logout(request: Request) -> Response:
    await posted(request)
    session = session_of(request)
    if session.issued:  # a cookie's session; one from an Authorization header has no end
        await revoke(pool_of(request), session)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(security.SESSION_COOKIE)
    return response


def _local(target: str | None) -> str:
    """Only a path on this site (never //elsewhere or /\\elsewhere): no open redirect."""
    if target and target.startswith("/") and not target.startswith(("//", "/\\")):
        return target
    return "/"


# ---------------------------------------------------------------- pages


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
        params=_params(request),
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


async def messages(request: Request) -> Response:
    params = _params(request)
    order = listing.order_from(params, listing.MESSAGE_COLUMNS, "changed")
    page = await listing.messages(pool_of(request), forms.filter_from(params), order)
    return _list_page(request, "messages.html", params, page)


async def groups(request: Request) -> Response:
    params = _params(request)
    order = listing.order_from(params, listing.GROUP_COLUMNS, "messages")
    page = await listing.groups(pool_of(request), forms.filter_from(params), order)
    return _list_page(request, "groups.html", params, page)


def _list_page(
    request: Request, template: str, params: dict[str, str], page: listing.Page
) -> Response:
    return render(
        request,
        template,
        page=page,
        rows=page.rows,
        params=params,
        statuses=(*operations.STATUSES, "all"),
        cutoff=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S"),
        now=datetime.now(UTC),
    )


async def message(request: Request) -> Response:
    key = ledger.Key(request.query_params.get("queue", ""), request.query_params.get("id", ""))
    return await _message_page(request, key)


async def _message_page(
    request: Request, key: ledger.Key, *, error: str = "", draft: str | None = None
) -> Response:
    pool = pool_of(request)
    row = await ledger.get(pool, key)
    if row is None:
        raise HTTPException(404, f"no message {key} in the ledger")
    attempts, audit = await operations.history(pool, key)
    payload = display.payload(bytes(row["payload"]))
    return render(
        request,
        "message.html",
        400 if error else 200,
        row=row,
        key=key,
        attempts=attempts,
        audit=audit,
        payload=payload,
        draft=(payload.text or "") if draft is None else draft,
        headers=json.dumps(json.loads(row["headers"]), indent=2, sort_keys=True),
        properties=json.dumps(json.loads(row["properties"]), indent=2, sort_keys=True),
        has_model=key.queue in config_of(request).models,
        error=error,
        now=datetime.now(UTC),
    )


async def audit(request: Request) -> Response:
    every_row = request.query_params.get("each") == "1"
    rows = await operations.recent_audit(pool_of(request), 200, every_row=every_row)
    return render(
        request,
        "audit.html",
        rows=[{**r, "detail": json.loads(r["detail"])} for r in rows],
        every_row=every_row,
        jobs=await jobs_of(request).recent(),
    )


async def job(request: Request) -> Response:
    found = await jobs_of(request).get(request.path_params["job_id"])
    if found is None:
        raise HTTPException(404, "no such replay")
    return render(request, "job.html", job=found)


# ---------------------------------------------------------------- actions


async def replay(request: Request) -> Response:
    form = await posted(request)
    keys = [forms.key_from(str(v)) for v in form.getlist("key")]
    if not keys:
        raise OperationError("select at least one message to retry")
    rate = forms.rate_from(str(form.get("rate") or ""))
    canary = form.get("canary") == "on"
    pool = pool_of(request)
    if len(keys) == 1 and not canary:
        async with operations.publisher(config_of(request).amqp_url) as sender:
            done = await operations.replay(pool, sender, keys, actor=actor_of(request))
        return _to_message(keys[0], "retried" if done.replayed else "not-dead")
    targets = await operations.replay_targets(pool, keys=keys)
    title = f"retry {len(keys)} selected message(s)"
    return await _start(
        request, title, targets, rate=rate, canary=canary, what={"selected": len(keys)}
    )


async def confirm(request: Request) -> Response:
    """What a bulk action will touch, before it is done: the count, and a button to do it."""
    chosen = forms.bulk_from(await _posted_fields(request), datetime.now(UTC))
    targets = await listing.dead_matching(pool_of(request), chosen.selection, chosen.before)
    if not targets:
        raise OperationError("no dead letters match: nothing to do")
    count = len(targets)
    return render(request, "confirm.html", bulk=chosen, count=count, title=chosen.title(count))


async def bulk(request: Request) -> Response:
    """A confirmed bulk action, on the dead letters that match now (up to the same cutoff)."""
    chosen = forms.bulk_from(await _posted_fields(request), datetime.now(UTC))
    targets = await listing.dead_matching(pool_of(request), chosen.selection, chosen.before)
    if chosen.action == "retry":
        return await _start(
            request,
            chosen.title(len(targets)),
            targets,
            rate=chosen.rate,
            canary=chosen.canary,
            what=chosen.describe(),
        )
    _, ignored = await operations.ignore_many(
        pool_of(request),
        targets,
        actor=actor_of(request),
        comment=chosen.comment,
        description=chosen.describe(),
    )
    return RedirectResponse(f"/audit?notice=ignored-many&count={ignored}", status_code=303)


async def unignore(request: Request) -> Response:
    form = await posted(request)
    batch = str(form.get("batch") or "")
    undone = await operations.unignore(pool_of(request), batch, actor=actor_of(request))
    return RedirectResponse(f"/audit?notice=unignored&count={undone}", status_code=303)


async def _posted_fields(request: Request) -> dict[str, str]:
    form = await posted(request)
    return {k: v for k, v in form.items() if isinstance(v, str)}


async def _start(
    request: Request,
    title: str,
    targets: list[ledger.Key],
    *,
    rate: float | None,
    canary: bool,
    what: dict[str, Any],
) -> Response:
    if not targets:
        raise OperationError("no dead letters match: nothing to retry")
    pool, config, actor = pool_of(request), config_of(request), actor_of(request)

    async def run(job_id: str, progress: Progress) -> ReplayReport:
        async with operations.publisher(config.amqp_url) as sender:
            return await operations.replay(
                pool,
                sender,
                targets,
                actor=actor,
                rate=rate,
                canary=canary,
                canary_timeout=config.canary_timeout,
                description={**what, "from": "console", "job": job_id},
                on_progress=progress,
                batch=job_id,
            )

    started: Job = await jobs_of(request).start(title, actor, len(targets), run)
    return RedirectResponse(f"/jobs/{started.id}", status_code=303)


async def ignore(request: Request) -> Response:
    form = await posted(request)
    key = forms.key_from(str(form.get("key") or ""))
    comment = str(form.get("comment") or "")
    if not await operations.ignore(pool_of(request), key, actor=actor_of(request), comment=comment):
        raise HTTPException(409, f"{key} is neither dead nor retrying: it cannot be ignored")
    return _to_message(key, "ignored")


async def edit(request: Request) -> Response:
    form = await posted(request)
    key = forms.key_from(str(form.get("key") or ""))
    payload = str(form.get("payload") or "")
    config = config_of(request)
    try:
        async with operations.publisher(config.amqp_url) as sender:
            done = await operations.edit_and_replay(
                pool_of(request),
                sender,
                key,
                payload,
                actor=actor_of(request),
                payload_adapter=config.models.get(key.queue),
                comment=str(form.get("comment") or "") or None,
            )
    except OperationError as error:
        return await _message_page(request, key, error=str(error), draft=payload)
    return _to_message(key, "edited" if done else "not-dead")


def _to_message(key: ledger.Key, notice: str) -> Response:
    query = urlencode({"queue": key.queue, "id": key.message_id, "notice": notice})
    return RedirectResponse(f"/message?{query}", status_code=303)


def _params(request: Request) -> dict[str, str]:
    names = (*forms.FILTER_FIELDS, *listing.PAGING_FIELDS, "refresh")
    params = {name: request.query_params.get(name, "") for name in names}
    if params["refresh"] and params["refresh"] not in REFRESH_SECONDS:
        # It goes into a meta refresh: a number it must be, never "0; url=...".
        raise OperationError(f"refresh must be one of {', '.join(REFRESH_SECONDS)} seconds")
    return params


async def export(request: Request) -> Response:
    """The messages the list's filters match, as JSON lines (``dead export``'s format)."""
    selection = forms.filter_from(_params(request), limit=EXPORT_LIMIT)
    lines: list[str] = []
    await operations.export(pool_of(request), selection, lines.append, actor=actor_of(request))
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return Response(
        "".join(lines),
        media_type="application/x-ndjson",
        headers={"Content-Disposition": f'attachment; filename="rabbitretry-{stamp}.jsonl"'},
    )


async def prometheus(request: Request) -> Response:
    """The ledger gauges for Prometheus, behind the login: scrape with a bearer token."""
    body = await metrics.render_ledger_metrics(pool_of(request))
    return Response(body, media_type=metrics.CONTENT_TYPE)


def routes() -> list[Route | Mount]:
    return [
        Route("/", overview),
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/messages", messages),
        Route("/groups", groups),
        Route("/message", message),
        Route("/audit", audit),
        Route("/jobs/{job_id}", job),
        Route("/metrics", prometheus),
        Route("/export.jsonl", export),
        Route("/actions/replay", replay, methods=["POST"]),
        Route("/actions/confirm", confirm, methods=["POST"]),
        Route("/actions/bulk", bulk, methods=["POST"]),
        Route("/actions/unignore", unignore, methods=["POST"]),
        Route("/actions/ignore", ignore, methods=["POST"]),
        Route("/actions/edit", edit, methods=["POST"]),
        Mount("/static", StaticFiles(packages=[("rabbitretry.console", "static")]), name="static"),
    ]
