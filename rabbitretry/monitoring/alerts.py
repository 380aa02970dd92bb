"""Alerts: stored first, then delivered to a webhook, retried with backoff until it accepts.

Four kinds, all rows of ``rabbitretry.alert``:

- ``dead``: a trigger on the ledger records every transition to ``dead`` in the transaction
  that makes it, joining the *open* alert of the error fingerprint (one alert per fingerprint
  per window, with a count and sample keys). When the window has closed, a deliverer sends it.
- ``heartbeat``: a periodic component (the reconciler, this deliverer) is stale or failing.
- ``backlog``: a work queue holds at least the threshold of ready messages.
- ``downstream``: a downstream's breaker opened or closed, stored in SQL by the transition
  itself (one alert per transition). The deliverer adds the messages waiting on the queues
  that call it (:mod:`~rabbitretry.monitoring.downstream_alerts`), and sends a downstream's
  alerts in the order they were raised: a refused one holds back the later ones.

Condition alerts (heartbeat, backlog) are raised by the deliverer's checks and repeat at most
once per ``repeat`` seconds while the condition lasts. Delivery is at least once: several
deliverers may run (``FOR UPDATE SKIP LOCKED`` and a lease), and a receiver can drop a
duplicate by the alert's ``id``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rabbitretry.db import UNAVAILABLE, Executor, Pool, Record, query
from rabbitretry.errors import RabbitRetryError
from rabbitretry.monitoring import downstream_alerts, heartbeat, levels
from rabbitretry.monitoring.alert_content import (
    BACKOFF_BASE,
    Alert,
    backoff,
    mask_secret_url,
    payload,
)
from rabbitretry.monitoring.thresholds import heartbeat_breaches, heartbeat_level

log = logging.getLogger("rabbitretry.monitoring.alerts")

DEFAULT_WINDOW = 60.0
DEFAULT_REPEAT = 3600.0
DEFAULT_TIMEOUT = 10.0
HEARTBEAT_NAME = "alerts"


class AlertNotDelivered(RabbitRetryError):
    """The webhook did not accept an alert (unreachable, timed out, or not a 2xx answer)."""


@dataclass
class RoundStats:
    raised: int = 0
    sent: int = 0
    failed: int = 0


async def post_json(url: str, body: dict[str, Any], timeout: float) -> None:
    """POST ``body`` as JSON; :class:`AlertNotDelivered` unless the answer is a 2xx."""
    data = json.dumps(body, default=str).encode()
    request = urllib.request.Request(
        url,
        data=data,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "rabbitretry-alerts"},
    )

    def send() -> None:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read(4096)

    try:
        await asyncio.to_thread(send)
    except urllib.error.HTTPError as error:
        raise AlertNotDelivered(f"HTTP {error.code} {error.reason}") from None
    except urllib.error.URLError as error:
        raise AlertNotDelivered(str(error.reason)) from None
    except (OSError, ValueError) as error:
        raise AlertNotDelivered(f"{type(error).__name__}: {error}") from None


async def take_due(executor: Executor, *, window: float, limit: int, lease: float) -> list[Alert]:
    """The alerts due, oldest first (a downstream's opened before its closed)."""
    rows = await executor.fetch(query("alerts_take"), window, limit, lease)
    return sorted((alert_of(row) for row in rows), key=lambda alert: alert.id)


async def deliver_due(
    pool: Pool,
    webhook_url: str,
    *,
    window: float = DEFAULT_WINDOW,
    batch_size: int = 50,
    timeout: float = DEFAULT_TIMEOUT,
    retry_base: float = BACKOFF_BASE,
    amqp_url: str | None = None,
) -> RoundStats:
    """Send every alert that is due, oldest first; a refused one is tried again after a
    backoff. ``amqp_url``: the broker to ask how many messages wait on a downstream's queues
    (without it, or when it cannot be asked, a downstream alert says they are unknown)."""
    stats = RoundStats()
    # The lease covers the whole batch sent one after another, each call up to `timeout`,
    # and the broker's count for downstream alerts.
    lease = 2 * batch_size * timeout + levels.BROKER_TIMEOUT + 30
    alerts = await take_due(pool, window=window, limit=batch_size, lease=lease)
    alerts = await downstream_alerts.with_waiting(pool, alerts, amqp_url)
    refused: dict[str, float] = {}  # downstream -> the backoff of its refused alert
    for alert in alerts:
        group = downstream_alerts.ordered_group(alert)
        if group is not None and group in refused:
            # Sent after the older one, or not at all: it waits as long as that one.
            await pool.execute(query("alerts_hold"), alert.id, refused[group])
            continue
        try:
            await post_json(webhook_url, payload(alert), timeout)
        except AlertNotDelivered as error:
            delay = backoff(alert.tries, base=retry_base)
            log.warning(
                "alert %d (%s %s) not delivered to %s (try %d): %s; next try in %.0f s",
                alert.id,
                alert.kind,
                alert.group_key,
                mask_secret_url(webhook_url),
                alert.tries,
                error,
                delay,
            )
            await pool.execute(query("alerts_failed_try"), alert.id, delay, str(error)[:500])
            stats.failed += 1
            if group is not None:
                refused[group] = delay
        else:
            await pool.execute(query("alerts_sent"), alert.id)
            log.info("alert %d delivered: %s", alert.id, payload(alert)["text"])
            stats.sent += 1
    return stats


async def raise_condition(
    pool: Pool,
    kind: str,
    group_key: str,
    *,
    queue: str | None,
    error_type: str,
    message: str,
    detail: dict[str, Any],
    repeat: float,
) -> bool:
    """Store a condition alert unless the same one was raised within ``repeat`` seconds."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(query("alerts_lock_group"), kind, group_key)
        new_id = await conn.fetchval(
            query("alerts_raise"),
            kind,
            group_key,
            queue,
            error_type,
            message,
            json.dumps(detail, default=str),
            repeat,
        )
    return new_id is not None


async def check_heartbeats(pool: Pool, *, repeat: float = DEFAULT_REPEAT) -> int:
    """Raise an alert for every stale or failing heartbeat but the deliverers' own (a restarted
    deliverer would otherwise report its own downtime); how many were new."""
    now: datetime = await pool.fetchval(query("status_now"))
    raised = 0
    for beat in await heartbeat.read_all(pool):
        if beat.name == HEARTBEAT_NAME:
            continue
        level = heartbeat_level(beat, now)
        for breach in heartbeat_breaches(level):
            raised += await raise_condition(
                pool,
                "heartbeat",
                beat.name,
                queue=None,
                error_type="failing" if level.failing and not level.stale else "stale",
                message=breach.value,
                detail={"age_seconds": level.age, "instance": beat.instance, "error": beat.error},
                repeat=repeat,
            )
    return raised


async def check_backlog(
    pool: Pool, depths: dict[str, int | None], threshold: int, *, repeat: float = DEFAULT_REPEAT
) -> int:
    """Raise an alert for every queue with at least ``threshold`` ready messages."""
    raised = 0
    for queue, depth in depths.items():
        if depth is not None and depth >= threshold:
            raised += await raise_condition(
                pool,
                "backlog",
                queue,
                queue=queue,
                error_type="backlog",
                message=f"{depth} messages ready (threshold {threshold})",
                detail={"depth": depth, "threshold": threshold},
                repeat=repeat,
            )
    return raised


async def recent(executor: Executor, *, status: str | None = None, limit: int = 20) -> list[Alert]:
    rows = await executor.fetch(query("alerts_recent"), status, limit)
    return [alert_of(row) for row in rows]


def sample(kind: str = "dead") -> dict[str, Any]:
    """A made-up alert body, for checking that a webhook receives and shows alerts."""
    now = datetime.now(UTC)
    return payload(
        Alert(
            id=0,
            kind=kind,
            group_key="test",
            queue="example.queue",
            error_type="TestAlert",
            error_message="a test alert from rabbitretry alerts test; nothing is wrong",
            count=1,
            sample_keys=["example-key"],
            first_seen=now,
            last_seen=now,
            detail={"test": True},
            status="pending",
            tries=0,
            next_try_at=now,
            last_error=None,
            sent_at=None,
        )
    )


@dataclass
class AlertDeliverer:
    """Checks conditions and delivers due alerts, once or every ``interval`` seconds."""

    pool: Pool
    webhook_url: str
    amqp_url: str | None = None
    window: float = DEFAULT_WINDOW
    repeat: float = DEFAULT_REPEAT
    backlog_threshold: int | None = None
    queues: Sequence[str] = ()
    batch_size: int = 50
    timeout: float = DEFAULT_TIMEOUT
    retry_base: float = BACKOFF_BASE
    instance: str = "rabbitretry-alerts"
    _stopping: asyncio.Event = field(default_factory=asyncio.Event, init=False)

    def stop(self) -> None:
        self._stopping.set()

    async def round(self) -> RoundStats:
        raised = await check_heartbeats(self.pool, repeat=self.repeat)
        if self.backlog_threshold is not None and self.amqp_url is not None:
            queues = list(self.queues) or await levels.known_queues(self.pool)
            depths = await levels.queue_depths(self.amqp_url, queues)
            raised += await check_backlog(
                self.pool, depths, self.backlog_threshold, repeat=self.repeat
            )
        stats = await deliver_due(
            self.pool,
            self.webhook_url,
            window=self.window,
            batch_size=self.batch_size,
            timeout=self.timeout,
            retry_base=self.retry_base,
            amqp_url=self.amqp_url,
        )
        stats.raised = raised
        return stats

    async def run(self, interval: float) -> RoundStats:
        """Rounds every ``interval`` seconds until :meth:`stop`; a heartbeat per round."""
        total = RoundStats()
        while not self._stopping.is_set():
            try:
                await heartbeat.started(self.pool, HEARTBEAT_NAME, self.instance, interval)
                stats = await self.round()
                await heartbeat.finished(self.pool, HEARTBEAT_NAME, counts=vars(stats))
                total.raised += stats.raised
                total.sent += stats.sent
                total.failed += stats.failed
            except UNAVAILABLE as error:
                log.error("alert round failed, the database is unreachable: %s", error)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), interval)
        return total


def alert_of(row: Record) -> Alert:
    return Alert(
        id=row["id"],
        kind=row["kind"],
        group_key=row["group_key"],
        queue=row["queue"],
        error_type=row["error_type"],
        error_message=row["error_message"],
        count=row["count"],
        sample_keys=list(row["sample_keys"]),
        first_seen=row["first_seen"],
        last_seen=row["last_seen"],
        detail=json.loads(row["detail"]),
        status=row["status"],
        tries=row["tries"],
        next_try_at=row["next_try_at"],
        last_error=row["last_error"],
        sent_at=row["sent_at"],
    )
