"""What an alert says and when a failed delivery is tried again. Pure, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

BACKOFF_BASE = 5.0
BACKOFF_CAP = 300.0
LAST_ERROR_SHOWN = 160  # characters of a downstream's last error in an alert's one line


@dataclass(frozen=True)
class Alert:
    id: int
    kind: str
    """dead, heartbeat, backlog or downstream"""
    group_key: str
    """the error fingerprint, heartbeat name, queue or downstream"""
    queue: str | None
    error_type: str | None
    error_message: str | None
    count: int
    sample_keys: list[str]
    first_seen: datetime
    last_seen: datetime
    detail: dict[str, Any]
    status: str
    tries: int
    next_try_at: datetime
    last_error: str | None
    sent_at: datetime | None


def title(alert: Alert) -> str:
    """One line that says what happened, for a chat message or a pager."""
    if alert.kind == "dead":
        plural = "message" if alert.count == 1 else "messages"
        return f"{alert.count} {plural} dead on {alert.queue}: {alert.error_type}"
    if alert.kind == "heartbeat":
        return f"{alert.group_key} heartbeat: {alert.error_message}"
    if alert.kind == "downstream":
        return downstream_title(alert)
    return f"backlog on {alert.queue}: {alert.error_message}"


def downstream_title(alert: Alert) -> str:
    """A breaker opened: ``wms unavailable since 22:00:03 UTC (5 failures, last: HTTP 500);
    1,203 messages waiting on orders.ship``; or closed: ``wms recovered at 22:30:10 UTC after
    29 min 7 s down (12 failed probes)``. The waiting counts are the deliverer's, in
    ``detail["waiting"]`` (``[{"queue": ..., "ready": n or null}]``); without them, unknown."""
    name, detail = alert.group_key, alert.detail
    if detail.get("state") == "closed":
        at = moment(detail.get("since"), alert.first_seen)
        down = (at - moment(detail.get("down_since"), at)).total_seconds()
        probes = _count(int(detail.get("probes") or 0), "failed probe")
        return f"{name} recovered at {clock(at)} after {duration(down)} down ({probes})"
    since = clock(moment(detail.get("since"), alert.first_seen))
    last = one_line(alert.error_message or "", LAST_ERROR_SHOWN) or "no error text"
    failures = _count(alert.count, "failure")
    return f"{name} unavailable since {since} ({failures}, last: {last}); {waiting(detail)}"


def waiting(detail: dict[str, Any]) -> str:
    """``1,203 messages waiting on orders.ship, 5 on orders.bill``; a queue the broker did not
    count is ``unknown``, and when none was counted: ``messages waiting: unknown``."""
    found = detail.get("waiting")
    counts = [
        (str(entry.get("queue")), entry.get("ready"))
        for entry in (found if isinstance(found, list) else [])
        if isinstance(entry, dict)
    ]
    known = [(queue, ready) for queue, ready in counts if isinstance(ready, int)]
    unknown = [queue for queue, ready in counts if not isinstance(ready, int)]
    if not known:
        return "messages waiting: unknown"
    (queue, ready), *others = known
    parts = [f"{_count(ready, 'message')} waiting on {queue}"]
    parts += [f"{n:,} on {q}" for q, n in others]
    parts += [f"{q} unknown" for q in unknown]
    return ", ".join(parts)


def moment(value: object, default: datetime) -> datetime:
    """A timestamp from an alert's detail (ISO 8601, as PostgreSQL writes it to JSON), in UTC;
    ``default`` when it is missing or not one."""
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return default.astimezone(UTC)
        return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).astimezone(UTC)
    return default.astimezone(UTC)


def clock(at: datetime) -> str:
    """``22:00:03 UTC``."""
    return at.astimezone(UTC).strftime("%H:%M:%S UTC")


def duration(seconds: float) -> str:
    """``7 s``, ``29 min 7 s``, ``2 h 5 min``, ``3 d 4 h``: the two largest units."""
    total = max(0, int(seconds))
    for size, unit, smaller, small_unit in ((86400, "d", 3600, "h"), (3600, "h", 60, "min")):
        if total >= size:
            rest = (total % size) // smaller
            return f"{total // size} {unit}" + (f" {rest} {small_unit}" if rest else "")
    if total >= 60:
        return f"{total // 60} min" + (f" {total % 60} s" if total % 60 else "")
    return f"{total} s"


def one_line(text: str, width: int) -> str:
    """``text`` on one line (runs of white space as one space), cut to ``width`` with "…"."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def payload(alert: Alert) -> dict[str, Any]:
    """The webhook's JSON body. ``text`` makes it a valid Slack/Mattermost message as well;
    ``id`` is stable across retries, so a receiver can drop a duplicate delivery."""
    return {
        "id": alert.id,
        "kind": alert.kind,
        "text": title(alert),
        "queue": alert.queue,
        "group": alert.group_key,
        "error_type": alert.error_type,
        "error_message": alert.error_message,
        "count": alert.count,
        "sample_keys": alert.sample_keys,
        "first_seen": alert.first_seen.isoformat(),
        "last_seen": alert.last_seen.isoformat(),
        "detail": alert.detail,
    }


def backoff(tries: int, base: float = BACKOFF_BASE, cap: float = BACKOFF_CAP) -> float:
    """Seconds before the next try after ``tries`` failed ones: doubling, capped. An alert is
    never given up: the webhook may be down for hours and the alert must still arrive."""
    return float(min(cap, base * 2 ** min(max(0, tries - 1), 32)))


def mask_secret_url(url: str) -> str:
    """A webhook URL safe to print: its password, path and query hidden.

    Webhook URLs carry their secret in the path (Slack, Teams) or the query (tokens), not only
    in the password, so everything after the host is masked.
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "<unparsable URL>"
    host = parts.hostname or ""
    if port is not None:
        host = f"{host}:{port}"
    if parts.username is not None:
        host = f"{parts.username}:***@{host}"
    path = "/***" if parts.path.strip("/") or parts.query else parts.path
    return urlunsplit((parts.scheme, host, path, "", ""))
