"""The console's lists: keyset pages over what a filter matches, in the order an operator picks.

A page is found from the row before it (the cursor), never by an offset, so page 2,000 of a
100,000-row list costs what page 1 costs, and rows arriving meanwhile do not shift the pages.
The statements (``sql/console.sql``) sort by a column named in a parameter, one of the fixed
tables below (never anything else from the request).
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

from rabbitretry.console.forms import bounded_count, bounded_time, refuse_nul
from rabbitretry.db import Pool, Record, query
from rabbitretry.ledger import Key
from rabbitretry.operations import Filter, OperationError

PAGE = 50
PAGING_FIELDS = ("sort", "dir", "after", "before", "page")


@dataclass(frozen=True)
class Column:
    type: str
    """``time``, ``number`` or ``text``: which of the statements' sort slots it fills."""
    descending: bool
    """The order a click on the column first gives (newest, largest first)."""

    def value(self, text: str) -> Any:
        """A cursor's sort value, back to this column's type; None when it is not one (a
        time out of range, a number that is not a count)."""
        if self.type == "time":
            return bounded_time(text)
        return bounded_count(text) if self.type == "number" else text


MESSAGE_COLUMNS = {
    "changed": Column("time", True),
    "first_seen": Column("time", True),
    "attempts": Column("number", True),
    "queue": Column("text", False),
    "key": Column("text", False),
}
GROUP_COLUMNS = {
    "messages": Column("number", True),
    "last_seen": Column("time", True),
    "first_seen": Column("time", True),
    "queue": Column("text", False),
}
SLOTS = ("time", "number", "text")


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
        after=_cursor(params.get("after"), columns[name]),
        before=_cursor(params.get("before"), columns[name]),
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


def _cursor(text: str | None, column: Column) -> list[Any] | None:
    """A page link's cursor: its sort value in ``column``'s type (a time or a count in range,
    checked here, before any comparison or query), and its two ties."""
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
    value, tie_1, tie_2 = (None if v is None else str(v) for v in values)
    sort_value = None if value is None else column.value(value)
    if value is not None and sort_value is None:
        raise damaged
    return [sort_value, tie_1, tie_2]


async def messages(pool: Pool, selection: Filter, order: Order) -> Page:
    return await _page(pool, "console_messages_page", MESSAGE_COLUMNS, selection, order)


async def groups(pool: Pool, selection: Filter, order: Order) -> Page:
    return await _page(pool, "console_groups_page", GROUP_COLUMNS, selection, order)


async def _page(
    pool: Pool, statement: str, columns: dict[str, Column], selection: Filter, order: Order
) -> Page:
    column = columns[order.column]
    backwards = order.before is not None or order.last
    # Walking backwards, fetch in the opposite order, then turn the rows round.
    descending = order.descending != backwards
    cursor = _cursor_parameters(column, order.after or order.before)
    rows = list(
        await pool.fetch(
            query(statement), *_matching(selection), PAGE + 1, order.column, descending, *cursor
        )
    )
    more = len(rows) > PAGE
    rows = rows[:PAGE]
    if backwards:
        rows.reverse()
        has_previous, has_next = more, order.before is not None
    else:
        has_previous, has_next = order.after is not None, more
    if rows:
        total = rows[0]["total"]
    else:  # past the end (a stale link): count from the first page
        total = await _count(pool, statement, selection, order) if any(cursor) else 0
    return Page(
        rows,
        int(total),
        order,
        next=_cursor_at(rows[-1], column) if rows and has_next else None,
        previous=_cursor_at(rows[0], column) if rows and has_previous else None,
    )


async def _count(pool: Pool, statement: str, selection: Filter, order: Order) -> int:
    """How many match: the total the first page carries."""
    first = await pool.fetchrow(
        query(statement), *_matching(selection), 1, order.column, True, *[None] * 5
    )
    return int(first["total"]) if first else 0


def _cursor_parameters(column: Column, cursor: list[Any] | None) -> list[Any]:
    """$11 to $15: the cursor's sort value (already of its type) in its type's slot, and its
    tie."""
    if cursor is None:
        return [None] * 5
    value, tie_1, tie_2 = cursor
    slots = [value if slot == column.type else None for slot in SLOTS]
    return [*slots, tie_1, tie_2]


def _matching(selection: Filter) -> list[Any]:
    """The parameters of the filter ($1 to $7), without its limit."""
    return selection.params()[:7]


def _cursor_at(row: Record, column: Column) -> str:
    return cursor_of([row[f"sort_{column.type}"], row["tie_1"], row["tie_2"]])


async def dead_matching(pool: Pool, selection: Filter, before: datetime) -> list[Key]:
    """Every dead letter the filter matches that died at or before ``before``, oldest death
    first: the targets of a bulk action, taken once (messages dying later are not swept in)."""
    until = min(selection.until, before) if selection.until else before
    dead = replace(selection, statuses=("dead",), until=until)
    rows = await pool.fetch(
        query("console_messages_page"), *_matching(dead), None, "changed", False, *[None] * 5
    )
    return [Key(r["queue"], r["message_id"]) for r in rows]
