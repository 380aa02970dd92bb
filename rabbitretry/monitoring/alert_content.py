"""What an alert says and when a failed delivery is tried again. Pure, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

BACKOFF_BASE = 5.0
BACKOFF_CAP = 300.0


@dataclass(frozen=True)
class Alert:
    id: int
    kind: str
    """dead, heartbeat or backlog"""
    group_key: str
    """the error fingerprint, heartbeat name or queue"""
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
    return f"backlog on {alert.queue}: {alert.error_message}"


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
