"""The lists: messages and error groups a filter matches, page by page, and the same
selection exported as JSON lines."""

from __future__ import annotations

from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import Response

from rabbitretry import operations
from rabbitretry.console import forms, paging
from rabbitretry.console.app import actor_of, pool_of, render
from rabbitretry.operations import OperationError

REFRESH_SECONDS = ("30", "60", "300")  # the auto-refresh a list may ask for
EXPORT_LIMIT = 1_000_000


async def messages(request: Request) -> Response:
    params = params_of(request)
    order = paging.order_from(params, paging.MESSAGE_COLUMNS, "changed")
    page = await paging.messages(pool_of(request), forms.filter_from(params), order)
    return _list_page(request, "messages.html", params, page)


async def groups(request: Request) -> Response:
    params = params_of(request)
    order = paging.order_from(params, paging.GROUP_COLUMNS, "messages")
    page = await paging.groups(pool_of(request), forms.filter_from(params), order)
    return _list_page(request, "groups.html", params, page)


def _list_page(
    request: Request, template: str, params: dict[str, str], page: paging.Page
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


async def export(request: Request) -> Response:
    """The messages the list's filters match, as JSON lines (``dead export``'s format)."""
    selection = forms.filter_from(params_of(request), limit=EXPORT_LIMIT)
    lines: list[str] = []
    await operations.export(pool_of(request), selection, lines.append, actor=actor_of(request))
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return Response(
        "".join(lines),
        media_type="application/x-ndjson",
        headers={"Content-Disposition": f'attachment; filename="rabbitretry-{stamp}.jsonl"'},
    )


def params_of(request: Request) -> dict[str, str]:
    """The query parameters a list understands (filters, paging, refresh), "" when absent."""
    names = (*forms.FILTER_FIELDS, *paging.PAGING_FIELDS, "refresh")
    params = {name: request.query_params.get(name, "") for name in names}
    if params["refresh"] and params["refresh"] not in REFRESH_SECONDS:
        # It goes into a meta refresh: a number it must be, never "0; url=...".
        raise OperationError(f"refresh must be one of {', '.join(REFRESH_SECONDS)} seconds")
    return params
