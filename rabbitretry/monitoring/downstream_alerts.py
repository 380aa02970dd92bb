"""What a downstream's alerts need from outside the alert row: the messages waiting.

A breaker that opens raises its alert in SQL (``rabbitretry.downstream_failed``), in the
transaction that opens it, where the broker cannot be asked. The deliverer asks it just before
the first send: the ready messages of each work queue whose handlers call the downstream (the
breaker row's ``queues``), by the passive declare the backlog alerts use. What it learns is
kept with the alert (``detail["waiting"]``), so a retry sends the same text and ``rabbitretry
alerts list`` shows what was sent; when the broker cannot be asked, nothing is kept and the
next try asks again.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from rabbitretry.db import Executor, query
from rabbitretry.ledger import downstreams
from rabbitretry.monitoring import levels
from rabbitretry.monitoring.alert_content import Alert

KIND = "downstream"


def ordered_group(alert: Alert) -> str | None:
    """The downstream whose alerts must arrive in order (opened before closed), if any."""
    return alert.group_key if alert.kind == KIND else None


def wants_waiting(alert: Alert) -> bool:
    """A breaker's "unavailable" alert whose waiting messages have not been counted yet."""
    return alert.kind == KIND and alert.detail.get("state") == "open" and not _counted(alert)


async def with_waiting(
    executor: Executor, alerts: Sequence[Alert], amqp_url: str | None
) -> list[Alert]:
    """``alerts``, each downstream "unavailable" one with the messages waiting on its queues
    in ``detail["waiting"]`` (``[{"queue": q, "ready": n}]``, n None when unknown)."""
    todo = [alert for alert in alerts if wants_waiting(alert)]
    if not todo:
        return list(alerts)
    wanted = {alert.group_key for alert in todo}
    queues_of = {
        row["name"]: list(row["queues"])
        for row in await downstreams.breakers(executor)
        if row["name"] in wanted
    }
    queues = list(dict.fromkeys(q for names in queues_of.values() for q in names))
    if amqp_url is not None and queues:
        depths = await levels.queue_depths(amqp_url, queues)
    else:
        depths = dict.fromkeys(queues)
    done: dict[int, Alert] = {}
    for alert in todo:
        counted = [
            {"queue": queue, "ready": depths.get(queue)}
            for queue in queues_of.get(alert.group_key, [])
        ]
        detail: dict[str, Any] = {**alert.detail, "waiting": counted}
        if any(entry["ready"] is not None for entry in counted):
            await executor.execute(
                query("alerts_note_detail"), alert.id, json.dumps({"waiting": counted})
            )
        done[alert.id] = dataclasses.replace(alert, detail=detail)
    return [done.get(alert.id, alert) for alert in alerts]


def _counted(alert: Alert) -> bool:
    found = alert.detail.get("waiting")
    return isinstance(found, list) and any(
        isinstance(entry, dict) and entry.get("ready") is not None for entry in found
    )
