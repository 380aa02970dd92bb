"""The actions, each a POST recorded in the audit table, and the pages that show what they did:
the audit trail and a background replay's progress.

Retrying one message is done at once; retrying several runs as a replay job in the background
(:mod:`rabbitretry.console.replay_jobs`), so the request returns before the last is replayed.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from rabbitretry import ledger, operations
from rabbitretry.console import forms, paging
from rabbitretry.console.app import (
    actor_of,
    config_of,
    ledger_of,
    ledgers_of,
    posted,
    render,
)
from rabbitretry.console.ledgers import Ledger
from rabbitretry.console.replay_jobs import Job
from rabbitretry.console.views.message import message_page, to_message
from rabbitretry.db import Record
from rabbitretry.operations import OperationError, Progress, ReplayReport

SHOWN = 200  # audit rows on the audit page


async def replay(request: Request) -> Response:
    """Retry the selected messages, each in the ledger database its row came from: one at
    once, several as a replay job per database."""
    form = await posted(request)
    located = [forms.located_key_from(str(v)) for v in form.getlist("key")]
    if not located:
        raise OperationError("select at least one message to retry")
    rate = forms.rate_from(str(form.get("rate") or ""))
    canary = form.get("canary") == "on"
    by_database: dict[str, list[ledger.Key]] = {}
    for key, database in located:
        by_database.setdefault(ledger_of(request, database).label, []).append(key)
    if len(located) == 1 and not canary:
        ((label, keys),) = by_database.items()
        home = ledger_of(request, label)
        async with operations.sender(config_of(request).amqp_url) as sender:
            done = await operations.replay(home.pool, sender, keys, actor=actor_of(request))
        if done.failures:  # the broker refused it: still dead, and the page says why
            raise OperationError(f"not retried, it stays dead: {done.failures[0]}")
        notice = "retried" if done.replayed else "not-dead"
        return to_message(keys[0], notice, _shown_label(request, home))
    started: list[Response] = []
    for label, keys in by_database.items():
        home = ledger_of(request, label)
        targets = await operations.replay_targets(home.pool, keys=keys)
        title = f"retry {len(keys)} selected message(s){_in(request, home)}"
        what = {"selected": len(keys)}
        started.append(
            await _start(request, home, title, targets, rate=rate, canary=canary, what=what)
        )
    return started[0] if len(started) == 1 else RedirectResponse("/audit", status_code=303)


async def confirm(request: Request) -> Response:
    """What a bulk action will touch, before it is done: the count (per database, with
    several), and a button to do it."""
    chosen = forms.bulk_from(await _posted_fields(request), datetime.now(UTC))
    matched = await _matching(request, chosen)
    count = sum(len(targets) for _, targets in matched)
    if not count:
        raise OperationError("no dead letters match: nothing to do")
    counts = [(home.label, len(targets)) for home, targets in matched]
    return render(
        request,
        "confirm.html",
        bulk=chosen,
        count=count,
        counts=counts if ledgers_of(request).several else [],
        title=chosen.title(count),
    )


async def bulk(request: Request) -> Response:
    """A confirmed bulk action, on the dead letters that match now (up to the same cutoff),
    in each database it names: a retry is a replay job per database."""
    chosen = forms.bulk_from(await _posted_fields(request), datetime.now(UTC))
    matched = await _matching(request, chosen)
    if chosen.action == "retry":
        started = [
            await _start(
                request,
                home,
                chosen.title(len(targets)) + _in(request, home),
                targets,
                rate=chosen.rate,
                canary=chosen.canary,
                what=chosen.describe(),
            )
            for home, targets in matched
            if targets
        ]
        if not started:
            raise OperationError("no dead letters match: nothing to retry")
        return started[0] if len(started) == 1 else RedirectResponse("/audit", status_code=303)
    ignored = 0
    for home, targets in matched:
        _, done = await operations.ignore_many(
            home.pool,
            targets,
            actor=actor_of(request),
            comment=chosen.comment,
            description=chosen.describe(),
        )
        ignored += done
    return RedirectResponse(f"/audit?notice=ignored-many&count={ignored}", status_code=303)


async def _matching(request: Request, chosen: forms.Bulk) -> list[tuple[Ledger, list[ledger.Key]]]:
    """The dead letters a bulk action touches, in each database it names (a group: the
    group's database; a filter: the one it names, else every one)."""
    homes = [ledger_of(request, chosen.database)] if chosen.database else ledgers_of(request)
    return [
        (home, await paging.dead_matching(home.pool, chosen.selection, chosen.before))
        for home in homes
    ]


async def unignore(request: Request) -> Response:
    form = await posted(request)
    batch = str(form.get("batch") or "")
    home = ledger_of(request, str(form.get("database") or ""))
    undone = await operations.unignore(home.pool, batch, actor=actor_of(request))
    return RedirectResponse(f"/audit?notice=unignored&count={undone}", status_code=303)


def _shown_label(request: Request, home: Ledger) -> str:
    """The database's label for links, "" with one database (links stay as they were)."""
    return home.label if ledgers_of(request).several else ""


def _in(request: Request, home: Ledger) -> str:
    return f" in {home.label}" if ledgers_of(request).several else ""


async def _posted_fields(request: Request) -> dict[str, str]:
    form = await posted(request)
    return {k: v for k, v in form.items() if isinstance(v, str)}


async def _start(
    request: Request,
    home: Ledger,
    title: str,
    targets: list[ledger.Key],
    *,
    rate: float | None,
    canary: bool,
    what: dict[str, Any],
) -> Response:
    if not targets:
        raise OperationError("no dead letters match: nothing to retry")
    pool, config, actor = home.pool, config_of(request), actor_of(request)

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

    started: Job = await home.jobs.start(title, actor, len(targets), run)
    where = f"?database={quote(home.label)}" if ledgers_of(request).several else ""
    return RedirectResponse(f"/jobs/{started.id}{where}", status_code=303)


async def ignore(request: Request) -> Response:
    form = await posted(request)
    key, database = forms.located_key_from(str(form.get("key") or ""))
    home = ledger_of(request, database)
    comment = str(form.get("comment") or "")
    if not await operations.ignore(home.pool, key, actor=actor_of(request), comment=comment):
        raise HTTPException(409, f"{key} is neither dead nor retrying: it cannot be ignored")
    return to_message(key, "ignored", _shown_label(request, home))


async def edit(request: Request) -> Response:
    form = await posted(request)
    key, database = forms.located_key_from(str(form.get("key") or ""))
    home = ledger_of(request, database)
    payload = str(form.get("payload") or "")
    config = config_of(request)
    try:
        async with operations.sender(config.amqp_url) as sender:
            done = await operations.edit_and_replay(
                home.pool,
                sender,
                key,
                payload,
                actor=actor_of(request),
                payload_adapter=config.models.get(key.queue),
                comment=str(form.get("comment") or "") or None,
            )
    except OperationError as error:
        return await message_page(request, key, database=database, error=str(error), draft=payload)
    return to_message(key, "edited" if done else "not-dead", _shown_label(request, home))


async def audit(request: Request) -> Response:
    """The latest audit rows and replays of every database, newest first, each labelled
    with its database when there are several."""
    every_row = request.query_params.get("each") == "1"
    ledgers = ledgers_of(request)

    async def read(home: Ledger) -> tuple[list[Record], list[Job]]:
        rows = await operations.recent_audit(home.pool, SHOWN, every_row=every_row)
        return rows, await home.jobs.recent()

    answers, down = await ledgers.each(read)
    label = (lambda home: home.label) if ledgers.several else (lambda home: "")
    rows = [
        {**r, "detail": json.loads(r["detail"]), "database": label(home)}
        for home, (found, _) in answers
        for r in found
    ]
    rows.sort(key=lambda r: r["at"], reverse=True)
    jobs = [(label(home), j) for home, (_, found_jobs) in answers for j in found_jobs]
    jobs.sort(key=lambda pair: pair[1].started, reverse=True)
    return render(
        request,
        "audit.html",
        rows=rows[:SHOWN],
        every_row=every_row,
        jobs=jobs,
        down=down,
    )


async def job(request: Request) -> Response:
    home = ledger_of(request, request.query_params.get("database", ""))
    found = await home.jobs.get(request.path_params["job_id"])
    if found is None:
        raise HTTPException(404, "no such replay")
    return render(request, "job.html", job=found)
