"""How a ``dead`` command picks its messages: the filter options, a key found in the ledger,
and the actor its audit rows name."""

from __future__ import annotations

import getpass
import socket
from typing import Annotated

import typer

from rabbitretry import ledger, operations
from rabbitretry.cli.common import UserError, parse_time
from rabbitretry.db import Pool, Record

QueueOption = Annotated[str | None, typer.Option("--queue", "-q", help="Only this work queue.")]


StatusOption = Annotated[
    list[str] | None,
    typer.Option(
        "--status",
        "-s",
        help="dead (default), retrying or ignored; repeat the option for several.",
    ),
]
ErrorOption = Annotated[
    str | None,
    typer.Option(
        "--error",
        "-e",
        help="Only this error type or reason, e.g. TimeoutError or invalid-payload.",
    ),
]
FingerprintOption = Annotated[
    str | None,
    typer.Option("--fingerprint", "-f", help="Only this error group (see `dead list --group`)."),
]
SinceOption = Annotated[
    str | None,
    typer.Option("--since", help="Only those that changed since: 30m, 2h, 7d or a timestamp."),
]
UntilOption = Annotated[
    str | None, typer.Option("--until", help="Only those that changed up to: 2h or a timestamp.")
]
SearchOption = Annotated[
    str | None,
    typer.Option("--search", help="Text to find in the key, error type or error message."),
]


def filter_from(
    status: list[str] | None,
    queue: str | None,
    error: str | None,
    fingerprint: str | None,
    since: str | None,
    until: str | None,
    search: str | None,
    limit: int,
) -> operations.Filter:
    return operations.Filter(
        statuses=tuple(status or ("dead",)),
        queue=queue,
        error=error,
        fingerprint=fingerprint,
        since=parse_time(since) if since else None,
        until=parse_time(until) if until else None,
        text=search,
        limit=limit,
    )


def actor() -> str:
    return f"cli:{getpass.getuser()}@{socket.gethostname()}"


async def find(pool: Pool, key: str, queue: str | None) -> Record:
    """The ledger row of ``key``. The ledger is keyed by queue and message_id together, so a
    message_id found in several queues needs ``--queue`` to say which one is meant."""
    rows = await operations.find(pool, key, queue)
    if not rows:
        where = f"in queue {queue!r}" if queue else "in the ledger"
        compacted = await operations.compacted(pool, ledger.Key(queue, key)) if queue else None
        if compacted is not None:
            raise UserError(
                f"{queue}/{key} succeeded {compacted['finished_at']:%Y-%m-%d %H:%M %Z} and was "
                "compacted by `ledger prune`: only its key's hash is kept"
            )
        raise UserError(f"no message with key {key!r} {where}")
    if len(rows) > 1:
        queues = ", ".join(r["queue"] for r in rows)
        raise UserError(f"key {key!r} exists in several queues ({queues}): add --queue")
    return rows[0]


async def dead_key(pool: Pool, key: str, queue: str | None) -> ledger.Key:
    row = await find(pool, key, queue)
    if row["status"] != "dead":
        raise UserError(f"{row['queue']}/{key} is {row['status']}, not dead: nothing to replay")
    return ledger.Key(row["queue"], key)
