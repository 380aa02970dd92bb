"""Query strings and form fields into operations' terms. Pure functions, no I/O."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rabbitretry import operations
from rabbitretry.ledger import Key
from rabbitretry.operations import Filter, OperationError

FILTER_FIELDS = ("status", "queue", "error", "fingerprint", "since", "until", "q")


EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 1, 1, tzinfo=UTC)
"""The times a filter, a cutoff or a page link may name: a time outside them is a mistake, and
one near the ends of ``datetime`` cannot even be turned to UTC or sent to PostgreSQL."""
LONGEST_NUMBER = 18
"""Digits in a count or a page link's number: any int8 this short fits, none longer is real."""


def moment(text: str | None) -> datetime | None:
    """A form's time (``2026-12-03T07:30`` from a datetime-local input, or ISO); UTC if naive.
    Only a time from 1970 to 9998: anything else is refused (400) before it is compared,
    shifted or sent to the database."""
    if not text or not text.strip():
        return None
    value = bounded_time(text.strip())
    if value is None:
        raise OperationError(
            f"{shown(text)} is not a time like 2026-12-03T07:30 "
            f"(between {EARLIEST:%Y} and {LATEST:%Y})"
        )
    return value


def bounded_time(text: str) -> datetime | None:
    """``text`` as an aware time between :data:`EARLIEST` and :data:`LATEST`, or None."""
    try:
        value = datetime.fromisoformat(text[:64])
        value = value if value.tzinfo else value.replace(tzinfo=UTC)
        value.astimezone(UTC)  # an offset that takes it past year 1 or 9999 overflows
    except (ValueError, OverflowError):
        return None
    return value if EARLIEST <= value < LATEST else None


def bounded_count(text: str) -> int | None:
    """``text`` as a whole number from 0 to 10**18 (ASCII digits only), or None."""
    if text.isascii() and text.isdigit() and len(text) <= LONGEST_NUMBER:
        return int(text)
    return None


def shown(text: str, limit: int = 40) -> str:
    """A value the request sent, quoted and cut short for an error message."""
    return repr(text[:limit] + "…" if len(text) > limit else text)


def filter_from(params: Mapping[str, str], *, limit: int = 200) -> Filter:
    status = params.get("status") or "dead"
    statuses = operations.STATUSES if status == "all" else (status,)
    return Filter(
        statuses=tuple(statuses),
        queue=params.get("queue") or None,
        error=params.get("error") or None,
        fingerprint=params.get("fingerprint") or None,
        since=moment(params.get("since")),
        until=moment(params.get("until")),
        text=params.get("q") or None,
        limit=limit,
    )


def refuse_nul(*values: str) -> None:
    """Refuse a value holding a NUL: PostgreSQL text cannot, so it could match nothing."""
    if any("\x00" in value for value in values):
        raise OperationError("a NUL character (\\x00) cannot be part of a filter or a key")


def key_value(queue: str, message_id: str, database: str = "") -> str:
    """A key as one form value (queue names may contain '/', so JSON), with the label of its
    ledger database when the console shows several."""
    return json.dumps([queue, message_id, database] if database else [queue, message_id])


def key_from(value: str) -> Key:
    return located_key_from(value)[0]


def located_key_from(value: str) -> tuple[Key, str]:
    """A form's key and the label of its database ("" when it names none: the first)."""
    try:
        parts = json.loads(value)
        if not isinstance(parts, list) or len(parts) not in (2, 3):
            raise ValueError(value)
        queue, message_id, database = (*parts, "")[:3]
    except (ValueError, TypeError):
        raise OperationError("a selected message could not be read; reload the page") from None
    refuse_nul(str(queue), str(message_id), str(database))
    return Key(str(queue), str(message_id)), str(database)


def rate_from(text: str | None) -> float | None:
    """A replay rate (``20/s``, ``300/m``), refused (400) outside one a minute to 100,000 a
    second (:func:`rabbitretry.operations.parse_rate`)."""
    if not text or not text.strip():
        return None
    if len(text) > 64:  # parse_rate would quote it whole in its error
        raise OperationError(f"{shown(text)} is not a rate like 20/s or 300/m")
    return operations.parse_rate(text)


@dataclass(frozen=True)
class Bulk:
    """An action on every dead letter a group or a filter matches, as its forms post it."""

    action: str
    """``retry`` or ``ignore``."""
    database: str
    """The label of the one ledger database it acts on; "" for every one the console shows."""
    selection: Filter
    group: tuple[str, str] | None
    before: datetime
    """The cutoff: letters that die after it are not touched."""
    rate: float | None
    canary: bool
    comment: str
    fields: dict[str, str]
    """The form fields that say all this again, for the confirmation page's form."""

    def describe(self) -> dict[str, Any]:
        """What the audit says it applied to."""
        if self.group:
            return {"group": self.group[1], "queue": self.group[0], "before": self.before}
        matched = {k: v for k, v in self.fields.items() if k in FILTER_FIELDS and v}
        return {"filter": matched, "queue": self.selection.queue, "before": self.before}

    def title(self, count: int) -> str:
        verb = "retry" if self.action == "retry" else "ignore"
        what = f"group {self.group[1]} of {self.group[0]}" if self.group else "matching"
        return (
            f"{verb} {count:,} dead letter(s): {what}, died up to {self.before:%Y-%m-%d %H:%M:%S}"
        )


BULK_FIELDS = (
    *FILTER_FIELDS,
    "database",
    "action",
    "group",
    "before",
    "rate",
    "canary",
    "comment",
)


def bulk_from(form: Mapping[str, str], now: datetime) -> Bulk:
    action = form.get("action") or ""
    if action not in ("retry", "ignore"):
        raise OperationError("say what to do with them: retry or ignore")
    group = None
    database = form.get("database") or ""
    if form.get("group"):
        key, database = located_key_from(form["group"])
        group = (key.queue, key.message_id)
        selection = Filter(queue=key.queue, fingerprint=key.message_id, limit=1)
    else:
        selection = filter_from({**form, "status": "dead"}, limit=1)
    comment = (form.get("comment") or "").strip()
    if action == "ignore" and not comment:
        raise OperationError("say why they are ignored: a comment is required")
    before = moment(form.get("before")) or now
    fields = {k: form.get(k) or "" for k in BULK_FIELDS}
    fields["before"] = before.strftime("%Y-%m-%dT%H:%M:%S.%f")
    return Bulk(
        action=action,
        database=database,
        selection=selection,
        group=group,
        before=before,
        rate=rate_from(form.get("rate")),
        canary=form.get("canary") == "on",
        comment=comment,
        fields=fields,
    )
