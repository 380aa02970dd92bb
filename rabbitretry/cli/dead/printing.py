"""What ``rabbitretry dead`` prints: tables of messages and groups, and one message in full."""

from __future__ import annotations

import json
from typing import Any

from rich.table import Table

from rabbitretry import ledger, operations
from rabbitretry.cli.common import age, literal, out
from rabbitretry.db import Record
from rabbitretry.topology import names

# Short values that a narrow terminal should never fold; the long ones (keys, errors) fold.
_NO_WRAP = {"fingerprint", "messages", "attempts", "status", "first", "last", "age"}

NOT_KEPT = (
    "(not kept: the message succeeded, and its consumer keeps no payload, headers or "
    'properties after a success; keep_payload = "always" keeps them)'
)


def print_messages(rows: list[Record], what: str, limit: int) -> None:
    table = Table(title=f"{len(rows)} {what} message(s)" + _limit_note(rows, limit))
    for column in ("queue", "key", "status", "attempts", "error", "last error", "age"):
        table.add_column(column, overflow="fold", no_wrap=column in _NO_WRAP)
    for row in rows:
        table.add_row(
            literal(row["queue"]),
            literal(row["message_id"]),
            row["status"],
            str(row["attempts"]),
            literal(row["error_type"] or row["reason"] or ""),
            literal(one_line(row["error_message"] or row["reason"] or "", 80)),
            age(row["changed_at"]),
        )
    out.print(table)


def print_groups(rows: list[Record], what: str, limit: int) -> None:
    table = Table(title=f"{len(rows)} group(s) of {what} messages" + _limit_note(rows, limit))
    for column in ("fingerprint", "queue", "messages", "error", "example", "first", "last"):
        table.add_column(column, overflow="fold", no_wrap=column in _NO_WRAP)
    for row in rows:
        table.add_row(
            row["fingerprint"] or "-",
            literal(row["queue"]),
            str(row["messages"]),
            literal(row["error_type"] or ""),
            literal(one_line(row["example_message"], 60)),
            age(row["first_seen"]) + " ago",
            age(row["last_seen"]) + " ago",
        )
    out.print(table)


def _limit_note(rows: list[Record], limit: int) -> str:
    return " (limit reached)" if len(rows) == limit else ""


def print_targets(keys: list[ledger.Key]) -> None:
    table = Table()
    for column in ("queue", "key"):
        table.add_column(column)
    for key in keys:
        table.add_row(key.queue, key.message_id)
    out.print(table)


def print_entry(
    row: Record, attempts: list[Record], audit: list[Record], recovery: Record | None = None
) -> None:
    budget = row["attempts"] - row["attempts_forgiven"]
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column()
    fields: list[tuple[str, Any]] = [
        ("queue", row["queue"]),
        ("key", row["message_id"]),
        ("status", row["status"] + (f" ({row['reason']})" if row["reason"] else "")),
        (
            "attempts",
            f"{row['attempts']} ({budget} of {row['max_attempts']} in the current budget)",
        ),
        ("replays", row["replays"]),
        ("first seen", f"{row['first_seen']:%Y-%m-%d %H:%M:%S %Z} ({age(row['first_seen'])} ago)"),
        ("finished", f"{row['finished_at']:%Y-%m-%d %H:%M:%S %Z}" if row["finished_at"] else "-"),
        (
            "next retry",
            f"{row['next_retry_at']:%Y-%m-%d %H:%M:%S %Z}" if row["next_retry_at"] else "-",
        ),
        (
            "came from",
            f"exchange {row['exchange'] or '(default)'!r}, routing key {row['routing_key']!r}",
        ),
        (
            "error",
            f"{row['error_type'] or ''}: {row['error_message'] or ''}"
            if row["error_type"]
            else "-",
        ),
        ("fingerprint", row["error_fingerprint"] or "-"),
    ]
    if recovery is not None:
        fields.append(("recover hook", _recovery(row["queue"], recovery)))
    for name, value in fields:
        summary.add_row(name, str(value))
    out.print(summary)
    out.print("\n[bold]payload[/bold]")
    if row["payload"] is None:
        out.print(NOT_KEPT, markup=False)
    else:
        out.print(_pretty_payload(bytes(row["payload"])), markup=False, highlight=False)
        headers = json.loads(row["headers"])
        out.print("\n[bold]headers[/bold]")
        out.print(
            json.dumps(headers, indent=2, sort_keys=True) if headers else "(none)", markup=False
        )
    history = Table(title="attempts", title_justify="left")
    for column in ("#", "started", "duration", "outcome", "error", "worker"):
        history.add_column(column, overflow="fold")
    for attempt in attempts:
        duration = (
            f"{(attempt['finished_at'] - attempt['started_at']).total_seconds() * 1000:.0f} ms"
            if attempt["finished_at"]
            else "-"
        )
        error = (
            f"{attempt['error_type']}: {one_line(attempt['error_message'] or '', 60)}"
            if attempt["error_type"]
            else ""
        )
        history.add_row(
            str(attempt["attempt"]),
            f"{attempt['started_at']:%H:%M:%S.%f}"[:-3],
            duration,
            attempt["outcome"] or "running",
            error,
            attempt["worker"],
        )
    out.print()
    out.print(history if attempts else "no attempts (refused on arrival)")
    if row["error_traceback"]:
        out.print("\n[bold]last traceback[/bold]")
        out.print(row["error_traceback"], markup=False, highlight=False)
    if audit:
        out.print("\n[bold]audit[/bold]")
        for entry in audit:
            note = f": {entry['comment']}" if entry["comment"] else ""
            out.print(
                f"{entry['at']:%Y-%m-%d %H:%M:%S} {entry['actor']} {entry['action']}{note}",
                markup=False,
            )


def _pretty_payload(body: bytes) -> str:
    text = operations.payload_text(body)
    return text if len(text) <= 4000 else text[:4000] + f"… ({len(body)} bytes)"


def one_line(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _recovery(queue: str, run: Record) -> str:
    """How the run of the consumer's ``on_dead`` for this message went, and where to see it."""
    state = run["status"] + (f" ({run['reason']})" if run["reason"] else "")
    if run["error_type"] and run["status"] != "succeeded":
        state += f", last error {run['error_type']}: {one_line(run['error_message'] or '', 60)}"
    return (
        f"{state} after {run['attempts']} run(s); "
        f"rabbitretry dead show {run['message_id']} --queue {names.recover_queue(queue)}"
    )
