"""Measure the service levels: latencies and counts from the ledger, backlog from the broker.

The broker is asked with a passive declare per queue; when it cannot be reached (or a queue
does not exist) the backlog is unknown (None) rather than an error, so that a status check
still reports what the ledger knows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from rabbitretry import amqp
from rabbitretry.db import Executor, query
from rabbitretry.errors import RabbitRetryError
from rabbitretry.monitoring.thresholds import RETRIED_OVER, QueueLevels

log = logging.getLogger("rabbitretry.monitoring.levels")

BROKER_TIMEOUT = 10.0


@dataclass(frozen=True)
class OutboxBacklog:
    pending: int
    failed: int
    oldest_pending_seconds: float | None


async def known_queues(executor: Executor) -> list[str]:
    """Every work queue that has rows in the ledger."""
    return [row["queue"] for row in await executor.fetch(query("status_queues"))]


async def queue_depths(amqp_url: str, queues: Sequence[str]) -> dict[str, int | None]:
    """Messages ready in each queue; None for a queue that is missing or a broker away."""
    depths: dict[str, int | None] = dict.fromkeys(queues)
    if not queues:
        return depths
    try:
        async with asyncio.timeout(BROKER_TIMEOUT):
            connection = await amqp.connect(amqp_url, name="rabbitretry-status")
            try:
                async with amqp.Prober(connection) as prober:
                    for queue in queues:
                        depths[queue] = await _depth(prober, queue)
            finally:
                with contextlib.suppress(*amqp.CHANNEL_ERRORS):
                    await connection.close()
    except (RabbitRetryError, TimeoutError, *amqp.CHANNEL_ERRORS) as error:
        log.warning("backlog unknown: %s", error)
    return depths


async def _depth(prober: amqp.Prober, queue: str) -> int | None:
    found: list[int] = []

    async def declare(channel: amqp.Channel) -> None:
        declared = await channel.declare_queue(queue, passive=True)
        found.append(int(declared.declaration_result.message_count or 0))

    await prober.attempt(declare)
    return found[0] if found else None


async def measure(
    executor: Executor,
    queues: Sequence[str],
    depths: dict[str, int | None],
    window: float,
) -> list[QueueLevels]:
    """The levels of ``queues`` over the last ``window`` seconds."""
    recent = {
        row["queue"]: row
        for row in await executor.fetch(query("status_latency"), window, RETRIED_OVER)
    }
    dead: dict[str, int] = {}
    retried: dict[str, int] = {}
    for row in await executor.fetch(query("status_unfinished"), RETRIED_OVER):
        if row["status"] == "dead":
            dead[row["queue"]] = row["messages"]
        retried[row["queue"]] = retried.get(row["queue"], 0) + row["retried"]
    levels = []
    for queue in queues:
        latency = recent.get(queue)
        levels.append(
            QueueLevels(
                queue=queue,
                finished=latency["finished"] if latency else 0,
                p95=_rounded(latency["p95"]) if latency else None,
                p99=_rounded(latency["p99"]) if latency else None,
                backlog=depths.get(queue),
                retried=(latency["retried"] if latency else 0) + retried.get(queue, 0),
                dead=dead.get(queue, 0),
            )
        )
    return levels


async def outbox_backlog(executor: Executor) -> OutboxBacklog:
    rows = {row["status"]: row for row in await executor.fetch(query("status_outbox"))}
    pending = rows.get("pending")
    failed = rows.get("failed")
    return OutboxBacklog(
        pending=pending["messages"] if pending else 0,
        failed=failed["messages"] if failed else 0,
        oldest_pending_seconds=pending["oldest_seconds"] if pending else None,
    )


async def unfinished_counts(executor: Executor) -> dict[tuple[str, str], int]:
    """(queue, status) → messages, for the statuses retrying, processing and dead."""
    rows = await executor.fetch(query("status_unfinished"), RETRIED_OVER)
    return {(row["queue"], row["status"]): row["messages"] for row in rows}


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
