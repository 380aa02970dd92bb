"""The actions, each a POST recorded in the audit table, and the pages that show what they did:
the audit trail and a background replay's progress.

Retrying one message is done at once; retrying several runs as a replay job in the background
(:mod:`rabbitretry.console.replay_jobs`), so the request returns before the last is replayed.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from rabbitretry import ledger, operations
from rabbitretry.console import forms, paging
from rabbitretry.console.app import actor_of, config_of, jobs_of, pool_of, posted, render
from rabbitretry.console.replay_jobs import Job
from rabbitretry.console.views.message import message_page, to_message
from rabbitretry.operations import OperationError, Progress, ReplayReport


async def replay(request: Request) -> Response:
    form = await posted(request)
    keys = [forms.key_from(str(v)) for v in form.getlist("key")]
    if not keys:
        raise OperationError("select at least one message to retry")
    rate = forms.rate_from(str(form.get("rate") or ""))
    canary = form.get("canary") == "on"
    pool = pool_of(request)
    if len(keys) == 1 and not canary:
        async with operations.sender(config_of(request).amqp_url) as sender:
            done = await operations.replay(pool, sender, keys, actor=actor_of(request))
        if done.failures:  # the broker refused it: still dead, and the page says why
            raise OperationError(f"not retried, it stays dead: {done.failures[0]}")
        return to_message(keys[0], "retried" if done.replayed else "not-dead")
    targets = await operations.replay_targets(pool, keys=keys)
    title = f"retry {len(keys)} selected message(s)"
    return await _start(
        request, title, targets, rate=rate, canary=canary, what={"selected": len(keys)}
    )


async def confirm(request: Request) -> Response:
    """What a bulk action will touch, before it is done: the count, and a button to do it."""
    chosen = forms.bulk_from(await _posted_fields(request), datetime.now(UTC))
    targets = await paging.dead_matching(pool_of(request), chosen.selection, chosen.before)
    if not targets:
        raise OperationError("no dead letters match: nothing to do")
    count = len(targets)
    return render(request, "confirm.html", bulk=chosen, count=count, title=chosen.title(count))


async def bulk(request: Request) -> Response:
    """A confirmed bulk action, on the dead letters that match now (up to the same cutoff)."""
    chosen = forms.bulk_from(await _posted_fields(request), datetime.now(UTC))
    targets = await paging.dead_matching(pool_of(request), chosen.selection, chosen.before)
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
        async with operations.sender(config.amqp_url) as sender:
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
    return to_message(key, "ignored")


async def edit(request: Request) -> Response:
    form = await posted(request)
    key = forms.key_from(str(form.get("key") or ""))
    payload = str(form.get("payload") or "")
    config = config_of(request)
    try:
        async with operations.sender(config.amqp_url) as sender:
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
        return await message_page(request, key, error=str(error), draft=payload)
    return to_message(key, "edited" if done else "not-dead")


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
