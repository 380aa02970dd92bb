"""``rabbitretry dead``: list, inspect and replay dead letters."""

from __future__ import annotations

import getpass
import json
import socket
from typing import Annotated, Any

import typer
from rich.progress import Progress
from rich.table import Table

from rabbitretry import amqp, db, deadletters, ledger
from rabbitretry.cli.common import UserError, age, out, parse_time, run_async, settings
from rabbitretry.db import Pool, Record, query

app = typer.Typer(
    help="Dead letters: messages that will not be retried again until someone replays them.",
    no_args_is_help=True,
)

QueueOption = Annotated[str | None, typer.Option("--queue", "-q", help="Only this work queue.")]


@app.command("list")
@run_async
async def list_(
    queue: QueueOption = None,
    error: Annotated[
        str | None,
        typer.Option(
            "--error",
            "-e",
            help="Only this error type or reason, e.g. TimeoutError or invalid-payload.",
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option("--since", help="Only those that died since: 30m, 2h, 7d or a timestamp."),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many rows.")] = 100,
) -> None:
    """List dead letters, newest first."""
    since_at = parse_time(since) if since else None
    pool = await db.create_pool(settings().database_url, min_size=1, max_size=1)
    try:
        rows = await pool.fetch(query("list_dead"), queue, error, since_at, limit)
    finally:
        await pool.close()
    if not rows:
        out.print("no dead letters" + (" match these filters" if queue or error or since else ""))
        return
    table = Table(
        title=f"{len(rows)} dead letter(s)" + (" (limit reached)" if len(rows) == limit else "")
    )
    for column in ("queue", "key", "attempts", "error", "last error", "age"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(
            row["queue"],
            row["message_id"],
            str(row["attempts"]),
            row["error_type"] or row["reason"] or "",
            _one_line(row["error_message"] or row["reason"] or "", 80),
            age(row["finished_at"]),
        )
    out.print(table)


@app.command()
@run_async
async def show(
    key: Annotated[str, typer.Argument(help="The message_id (ledger key) of the dead letter.")],
    queue: QueueOption = None,
) -> None:
    """Show one message: payload, headers, state and every attempt (works for any status)."""
    pool = await db.create_pool(settings().database_url, min_size=1, max_size=1)
    try:
        row = await _find(pool, key, queue)
        attempts = await pool.fetch(query("list_attempts"), row["queue"], key)
        audit = await pool.fetch(query("list_audit"), row["queue"], key)
    finally:
        await pool.close()
    _print_entry(row, attempts, audit)


@app.command()
@run_async
async def replay(
    key: Annotated[str | None, typer.Argument(help="Replay this message_id.")] = None,
    queue: QueueOption = None,
    all_: Annotated[
        bool, typer.Option("--all", help="Replay every dead letter (of --queue, if given).")
    ] = False,
    error: Annotated[
        str | None, typer.Option("--error", "-e", help="Only this error type or reason.")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what would be replayed; change nothing.")
    ] = False,
) -> None:
    """Republish dead letters from the ledger with a fresh attempt budget.

    Give a KEY, or --queue Q, or --all. Each replay is recorded; replaying a message twice
    never creates two live copies.
    """
    if key is None and queue is None and not all_:
        raise UserError("say what to replay: a KEY, --queue QUEUE, or --all")
    if key is not None and all_:
        raise UserError("give either a KEY or --all, not both")
    config = settings()
    pool = await db.create_pool(config.database_url, min_size=1, max_size=2)
    try:
        if key is not None:
            row = await _find(pool, key, queue)
            if row["status"] != "dead":
                raise UserError(
                    f"{row['queue']}/{key} is {row['status']}, not dead: nothing to replay"
                )
            queue = row["queue"]
        selection = deadletters.Selection(queue=queue, message_id=key, error=error)
        targets = [r async for r in deadletters.select(pool, selection)]
        if not targets:
            out.print("no dead letters match")
            return
        if dry_run:
            _print_targets(targets)
            out.print(f"dry run: {len(targets)} dead letter(s) would be replayed")
            return
        await _replay(pool, config.amqp_url, targets)
    finally:
        await pool.close()


async def _replay(pool: Pool, amqp_url: str, targets: list[Record]) -> None:
    connection = await amqp.connect(amqp_url, name="rabbitretry-replay")
    replayed = skipped = 0
    try:
        publisher = await amqp.ConfirmingPublisher.open(connection)
        with Progress(transient=True, console=out) as progress:
            task = progress.add_task("replaying", total=len(targets))
            for row in targets:
                entry = ledger.Key(row["queue"], row["message_id"])
                if await deadletters.replay_one(pool, publisher, entry, actor=_actor()):
                    replayed += 1
                else:
                    skipped += 1
                progress.advance(task)
    finally:
        await connection.close()
    out.print(
        f"replayed {replayed} dead letter(s)"
        + (f", {skipped} no longer dead (skipped)" if skipped else "")
    )


def _actor() -> str:
    return f"cli:{getpass.getuser()}@{socket.gethostname()}"


async def _find(pool: Pool, key: str, queue: str | None) -> Record:
    if queue is not None:
        row = await ledger.get(pool, ledger.Key(queue, key))
        if row is None:
            raise UserError(f"no message {key!r} in queue {queue!r}")
        return row
    rows = await pool.fetch(query("find_entries"), key)
    if not rows:
        raise UserError(f"no message with key {key!r} in the ledger")
    if len(rows) > 1:
        queues = ", ".join(r["queue"] for r in rows)
        raise UserError(f"key {key!r} exists in several queues ({queues}): add --queue")
    return rows[0]


def _print_targets(rows: list[Record]) -> None:
    table = Table()
    for column in ("queue", "key", "attempts", "error"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            row["queue"],
            row["message_id"],
            str(row["attempts"]),
            row["error_type"] or row["reason"] or "",
        )
    out.print(table)


def _print_entry(row: Record, attempts: list[Record], audit: list[Record]) -> None:
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
    for name, value in fields:
        summary.add_row(name, str(value))
    out.print(summary)
    out.print("\n[bold]payload[/bold]")
    out.print(_pretty_payload(bytes(row["payload"])), markup=False, highlight=False)
    headers = json.loads(row["headers"])
    out.print("\n[bold]headers[/bold]")
    out.print(json.dumps(headers, indent=2, sort_keys=True) if headers else "(none)", markup=False)
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
            f"{attempt['error_type']}: {_one_line(attempt['error_message'] or '', 60)}"
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
            out.print(
                f"{entry['at']:%Y-%m-%d %H:%M:%S} {entry['actor']} {entry['action']}", markup=False
            )


def _pretty_payload(body: bytes) -> str:
    try:
        return json.dumps(json.loads(body), indent=2, ensure_ascii=False)
    except (ValueError, UnicodeDecodeError):
        text = body.decode("utf-8", errors="replace")
        return text if len(text) <= 4000 else text[:4000] + f"… ({len(body)} bytes)"


def _one_line(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"
