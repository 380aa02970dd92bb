"""The lists: messages and error groups a filter matches, page by page, and the same
selection exported as JSON lines.

Over several ledger databases, a list has a section per database, each paged on its own
(keyset pages per database): a section's pager shows that database alone
(``database=LABEL``), whose pages are then exactly those of a console on it. One merged order
would need the databases to agree on how text sorts (their collations may not), and a
cursor per database besides.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import Response

from rabbitretry import operations
from rabbitretry.console import forms, paging
from rabbitretry.console.app import actor_of, ledger_of, ledgers_of, render
from rabbitretry.console.ledgers import Ledger, Ledgers
from rabbitretry.db import Pool
from rabbitretry.operations import Filter, OperationError

REFRESH_SECONDS = ("30", "60", "300")  # the auto-refresh a list may ask for
EXPORT_LIMIT = 1_000_000


Lister = Callable[[Pool, Filter, paging.Order], Awaitable[paging.Page]]


@dataclass(frozen=True)
class Section:
    """One database's page of a list: its label ("" with one database), the page, and the
    query its pager and sort links keep (with ``database`` when there are several)."""

    database: str
    page: paging.Page
    params: dict[str, str]


async def messages(request: Request) -> Response:
    params = params_of(request)
    order = paging.order_from(params, paging.MESSAGE_COLUMNS, "changed")
    return await _list_page(request, "messages.html", params, order, paging.messages)


async def groups(request: Request) -> Response:
    params = params_of(request)
    order = paging.order_from(params, paging.GROUP_COLUMNS, "messages")
    return await _list_page(request, "groups.html", params, order, paging.groups)


async def _list_page(
    request: Request,
    template: str,
    params: dict[str, str],
    order: paging.Order,
    lister: Lister,
) -> Response:
    selection = forms.filter_from(params)
    ledgers = ledgers_of(request)

    async def page_of(ledger: Ledger) -> paging.Page:
        return await lister(ledger.pool, selection, order)

    pages, down = await chosen(request, params).each(page_of)
    sections = [
        Section(
            ledger.label if ledgers.several else "",
            page,
            {**params, "database": ledger.label} if ledgers.several else params,
        )
        for ledger, page in pages
    ]
    return render(
        request,
        template,
        sections=sections,
        total=sum(section.page.total for section in sections),
        order=order,
        down=down,
        params=params,
        statuses=(*operations.STATUSES, "all"),
        cutoff=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S"),
        now=datetime.now(UTC),
    )


def chosen(request: Request, params: dict[str, str]) -> Ledgers:
    """The databases a list shows: the one its ``database`` names, else every one."""
    ledgers = ledgers_of(request)
    if params.get("database"):
        return ledgers.only(ledger_of(request, params["database"]).label)
    return ledgers


async def export(request: Request) -> Response:
    """The messages the list's filters match, as JSON lines (``dead export``'s format)."""
    params = params_of(request)
    selection = forms.filter_from(params, limit=EXPORT_LIMIT)
    lines: list[str] = []

    async def export_from(ledger: Ledger) -> None:
        await operations.export(ledger.pool, selection, lines.append, actor=actor_of(request))

    for ledger in chosen(request, params):
        await export_from(ledger_of(request, ledger.label))  # an outage names this database
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return Response(
        "".join(lines),
        media_type="application/x-ndjson",
        headers={"Content-Disposition": f'attachment; filename="rabbitretry-{stamp}.jsonl"'},
    )


def params_of(request: Request) -> dict[str, str]:
    """The query parameters a list understands (filters, paging, refresh), "" when absent."""
    names = (*forms.FILTER_FIELDS, *paging.PAGING_FIELDS, "refresh", "database")
    params = {name: request.query_params.get(name, "") for name in names}
    if params["refresh"] and params["refresh"] not in REFRESH_SECONDS:
        # It goes into a meta refresh: a number it must be, never "0; url=...".
        raise OperationError(f"refresh must be one of {', '.join(REFRESH_SECONDS)} seconds")
    return params
