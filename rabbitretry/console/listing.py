"""The console's lists: keyset pages over what a filter matches, in the order an operator picks.

A page is found from the row before it (the cursor), never by an offset, so page 2,000 of a
100,000-row list costs what page 1 costs, and rows arriving meanwhile do not shift the pages.
Sort columns come from fixed tables (never from the request), so the statements below are put
together from known pieces only; every value travels as a parameter.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from rabbitretry.console.forms import refuse_nul
from rabbitretry.db import Pool, Record, query
from rabbitretry.ledger import Key
from rabbitretry.operations import Filter, OperationError

PAGE = 50
PAGING_FIELDS = ("sort", "dir", "after", "before", "page")

# What a filter matches ($1 statuses ... $7 text): the conditions of the CLI's list, taken
# from its statement, so that a filter means the same in a terminal and on a page.
MATCHING = query("operations_list").split("WHERE", 1)[1].split("ORDER BY", 1)[0]


@dataclass(frozen=True)
class Column:
    expression: str
    type: str
    descending: bool
    """The order a click on the column first gives (newest, largest first)."""


MESSAGE_COLUMNS = {
    "changed": Column("coalesce(finished_at, updated_at)", "timestamptz", True),
    "first_seen": Column("first_seen", "timestamptz", True),
    "attempts": Column("attempts", "integer", True),
    "queue": Column("queue", "text", False),
    "key": Column("message_id", "text", False),
}
GROUP_COLUMNS = {
    "messages": Column("messages", "bigint", True),
    "last_seen": Column("last_seen", "timestamptz", True),
    "first_seen": Column("first_seen", "timestamptz", True),
    "queue": Column("queue", "text", False),
}
MESSAGE_ROW = """queue, message_id, status, attempts, max_attempts, reason, error_type,
error_message, error_fingerprint, first_seen, finished_at, next_retry_at, replays,
coalesce(finished_at, updated_at) AS changed_at"""
GROUPS = f"""
SELECT queue, coalesce(error_fingerprint, '') AS fingerprint,
       min(coalesce(error_type, reason)) AS error_type,
       min(coalesce(error_message, reason, '')) AS example_message,
       count(*) AS messages,
       min(coalesce(finished_at, updated_at)) AS first_seen,
       max(coalesce(finished_at, updated_at)) AS last_seen
FROM rabbitretry.ledger WHERE {MATCHING}
GROUP BY queue, coalesce(error_fingerprint, '')
"""


@dataclass(frozen=True)
class Order:
    """A sort column, its direction, and where a page starts."""

    column: str
    descending: bool
    after: list[Any] | None = None
    """The cursor of the row before the page (a next page)."""
    before: list[Any] | None = None
    """The cursor of the row after the page (a previous page)."""
    last: bool = False


@dataclass(frozen=True)
class Page:
    rows: list[Record]
    total: int
    order: Order
    next: str | None
    """The cursor for the next page, None on the last one."""
    previous: str | None


def order_from(params: dict[str, str], columns: dict[str, Column], default: str) -> Order:
    name = params.get("sort") or default
    if name not in columns:
        raise OperationError(f"cannot sort by {name!r}: choose one of {', '.join(columns)}")
    direction = params.get("dir") or ("desc" if columns[name].descending else "asc")
    if direction not in ("asc", "desc"):
        raise OperationError(f"the direction must be asc or desc, not {direction!r}")
    return Order(
        name,
        direction == "desc",
        after=_cursor(params.get("after")),
        before=_cursor(params.get("before")),
        last=params.get("page") == "last",
    )


def link(path: str, params: dict[str, str], **changes: str) -> str:
    """``path`` with the current filters and ``changes``; a new sort or filter starts again
    from the first page."""
    kept = {k: v for k, v in params.items() if k not in ("after", "before", "page")}
    wanted = {k: v for k, v in {**kept, **changes}.items() if v}
    return f"{path}?{urlencode(wanted)}" if wanted else path


def cursor_of(values: Sequence[Any]) -> str:
    text = json.dumps([v.isoformat() if hasattr(v, "isoformat") else v for v in values])
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _cursor(text: str | None) -> list[Any] | None:
    if not text:
        return None
    damaged = OperationError("this page link is damaged: start again from the first page")
    try:
        values = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (ValueError, binascii.Error):
        raise damaged from None
    if not isinstance(values, list) or len(values) != 3:
        raise damaged
    refuse_nul(*(str(v) for v in values))
    return [None if v is None else str(v) for v in values]


async def messages(pool: Pool, selection: Filter, order: Order) -> Page:
    column = MESSAGE_COLUMNS[order.column]
    source = f"SELECT {MESSAGE_ROW}, {column.expression} AS sort_value FROM rabbitretry.ledger"
    return await _page(
        pool,
        f"{source} WHERE {MATCHING}",
        f"SELECT count(*) FROM rabbitretry.ledger WHERE {MATCHING}",
        column,
        ("queue", "message_id"),
        selection,
        order,
    )


async def groups(pool: Pool, selection: Filter, order: Order) -> Page:
    column = GROUP_COLUMNS[order.column]
    return await _page(
        pool,
        f"SELECT *, {column.expression} AS sort_value FROM ({GROUPS}) AS g WHERE true",
        f"SELECT count(*) FROM ({GROUPS}) AS g",
        column,
        ("queue", "fingerprint"),
        selection,
        order,
    )


async def _page(
    pool: Pool,
    source: str,
    counting: str,
    column: Column,
    tie: tuple[str, str],
    selection: Filter,
    order: Order,
) -> Page:
    cursor = order.after or order.before
    backwards = order.before is not None or order.last
    # Walking backwards, fetch in the opposite order, then turn the rows round.
    descending = order.descending != backwards
    statement = _statement(source, column, tie, descending, with_cursor=cursor is not None)
    async with pool.acquire() as conn:
        rows = list(await conn.fetch(statement, *_matching(selection), PAGE + 1, *(cursor or [])))
        total = await conn.fetchval(counting, *_matching(selection))
    more = len(rows) > PAGE
    rows = rows[:PAGE]
    if backwards:
        rows.reverse()
        has_previous, has_next = more, order.before is not None
    else:
        has_previous, has_next = order.after is not None, more
    return Page(
        rows,
        int(total),
        order,
        next=_cursor_at(rows[-1], tie) if rows and has_next else None,
        previous=_cursor_at(rows[0], tie) if rows and has_previous else None,
    )


def _statement(
    source: str, column: Column, tie: tuple[str, str], descending: bool, *, with_cursor: bool
) -> str:
    """A page of ``source``: $8 rows, after the cursor ($9 sort value, $10 and $11 the tie)."""
    statement = f"SELECT * FROM ({source}) AS listed"
    if with_cursor:
        statement += (
            f" WHERE (sort_value, {tie[0]}, {tie[1]}) {'<' if descending else '>'}"
            f" ($9::text::{column.type}, $10::text, $11::text)"
        )
    direction = "DESC" if descending else "ASC"
    return statement + (
        f" ORDER BY sort_value {direction}, {tie[0]} {direction}, {tie[1]} {direction} LIMIT $8"
    )


def _matching(selection: Filter) -> list[Any]:
    """The parameters of MATCHING ($1 to $7): the filter's, without its limit."""
    return selection.params()[:7]


def _cursor_at(row: Record, tie: tuple[str, str]) -> str:
    return cursor_of([row["sort_value"], row[tie[0]], row[tie[1]]])


async def dead_matching(pool: Pool, selection: Filter, before: datetime) -> list[Key]:
    """Every dead letter the filter matches that died at or before ``before``, oldest death
    first: the targets of a bulk action, taken once (messages dying later are not swept in)."""
    rows = await pool.fetch(
        f"SELECT queue, message_id FROM rabbitretry.ledger WHERE {MATCHING}"
        " AND finished_at <= $8 ORDER BY finished_at, queue, message_id",
        *_matching(replace(selection, statuses=("dead",))),
        before,
    )
    return [Key(r["queue"], r["message_id"]) for r in rows]
