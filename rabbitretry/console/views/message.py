"""One message: its payload, headers, state, attempts and audit trail, the run of its consumer's
recover hook, with the forms that act on it."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from urllib.parse import urlencode

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from rabbitretry import ledger, operations
from rabbitretry.console import display
from rabbitretry.console.app import config_of, ledger_of, ledgers_of, render
from rabbitretry.topology import names


async def message(request: Request) -> Response:
    key = ledger.Key(request.query_params.get("queue", ""), request.query_params.get("id", ""))
    return await message_page(request, key, database=request.query_params.get("database", ""))


async def message_page(
    request: Request,
    key: ledger.Key,
    *,
    database: str = "",
    error: str = "",
    draft: str | None = None,
) -> Response:
    """The page of ``key``; with ``error`` (a 400), it shows the rejected ``draft`` payload
    again so an edit that failed validation can be corrected rather than retyped. ``database``
    is the label of the ledger database it is in (with several)."""
    home = ledger_of(request, database)
    pool = home.pool
    row = await ledger.get(pool, key)
    if row is None:
        where = f" database {home.label}" if ledgers_of(request).several else ""
        compacted = await operations.compacted(pool, key)
        if compacted is not None:
            raise HTTPException(
                404,
                f"message {key} succeeded {compacted['finished_at']:%Y-%m-%d %H:%M %Z} and was "
                f"compacted by ledger prune: the ledger{where} keeps only its key's hash",
            )
        raise HTTPException(404, f"no message {key} in the ledger{where}")
    attempts, audit = await operations.history(pool, key)
    recovery = await operations.recover_run(pool, key)  # None: no hook, or it has not run
    kept = row["payload"] is not None  # a succeeded message's snapshot may be dropped
    payload = display.payload(bytes(row["payload"])) if kept else None
    return render(
        request,
        "message.html",
        400 if error else 200,
        row=row,
        key=key,
        located=home.label if ledgers_of(request).several else "",
        attempts=attempts,
        audit=audit,
        recovery=recovery,
        recover_queue=names.recover_queue(key.queue),
        payload=payload,
        draft=((payload.text if payload else None) or "") if draft is None else draft,
        headers=_pretty_json(row["headers"]),
        properties=_pretty_json(row["properties"]),
        has_model=key.queue in config_of(request).models,
        error=error,
        now=datetime.now(UTC),
    )


def to_message(key: ledger.Key, notice: str, database: str = "") -> Response:
    """Back to the message's page after an action on it, announcing ``notice``."""
    where = {"database": database} if database else {}
    query = urlencode({"queue": key.queue, "id": key.message_id, **where, "notice": notice})
    return RedirectResponse(f"/message?{query}", status_code=303)


def _pretty_json(stored: str | None) -> str:
    return "" if stored is None else json.dumps(json.loads(stored), indent=2, sort_keys=True)
