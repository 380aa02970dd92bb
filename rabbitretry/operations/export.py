"""Exporting dead letters as JSON lines: everything about each message, to keep or to study.

A line holds the payload as JSON when it is JSON (so ``jq`` can read it) and as base64 when it
is not, so no byte is lost. An export is audited: it takes messages out of the system.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from rabbitretry.db import Pool, Record, query
from rabbitretry.operations.audit import audit
from rabbitretry.operations.selection import Filter

_FIELDS = (
    "queue",
    "message_id",
    "status",
    "attempts",
    "reason",
    "error_type",
    "error_message",
    "error_fingerprint",
    "exchange",
    "routing_key",
    "replays",
)


def export_line(row: Record) -> str:
    """One message as a JSON line; the payload as JSON when it is JSON, else base64."""
    entry: dict[str, Any] = {k: row[k] for k in _FIELDS}
    entry["first_seen"] = row["first_seen"].isoformat()
    entry["finished_at"] = row["finished_at"].isoformat() if row["finished_at"] else None
    if row["payload"] is None:  # a succeeded message whose snapshot was dropped
        entry["payload"] = entry["headers"] = entry["properties"] = None
        return json.dumps(entry, ensure_ascii=False, default=str)
    body = bytes(row["payload"])
    entry["headers"] = json.loads(row["headers"])
    entry["properties"] = json.loads(row["properties"])
    try:
        entry["payload"] = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        entry["payload_base64"] = base64.b64encode(body).decode()
    return json.dumps(entry, ensure_ascii=False, default=str)


async def export(
    pool: Pool, selection: Filter, write: Callable[[str], object], *, actor: str
) -> int:
    """Write the matching messages as JSON lines, oldest first; how many were written."""
    rows = await pool.fetch(query("operations_export"), *selection.params())
    for row in rows:
        write(export_line(row) + "\n")
    await audit(
        pool,
        actor,
        "export",
        queue=selection.queue,
        messages=len(rows),
        detail={k: v for k, v in asdict(selection).items() if v},
    )
    return len(rows)
