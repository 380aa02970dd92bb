"""``rabbitretry alerts``: deliver stored alerts to a webhook and see what was sent."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
from typing import Annotated
from urllib.parse import urlsplit

import typer
from rich.table import Table

from rabbitretry import db
from rabbitretry.cli.common import (
    DatabaseOption,
    JsonOption,
    UserError,
    VerboseOption,
    age,
    configure_logging,
    literal,
    out,
    print_json,
    run_async,
    settings,
)
from rabbitretry.errors import RabbitRetryError
from rabbitretry.monitoring import alerts
from rabbitretry.monitoring.alert_content import mask_secret_url, title

app = typer.Typer(
    help=(
        "Alerts when messages die, a heartbeat goes stale, a queue backs up or a downstream's "
        "breaker opens or closes: stored in the database first, then delivered to a webhook "
        "(JSON), retried until it accepts."
    ),
    no_args_is_help=True,
)

STATUSES = ("open", "pending", "sent")


def _webhook(option: str | None) -> str:
    url = option or settings().alert_webhook_url
    if not url:
        raise UserError("no webhook URL: set RABBITRETRY_ALERT_WEBHOOK_URL or pass --webhook-url")
    if urlsplit(url).scheme not in ("http", "https"):
        raise UserError(f"the webhook URL {mask_secret_url(url)} is not http(s)")
    return url


@app.command()
@run_async
async def deliver(
    webhook_url: Annotated[
        str | None,
        typer.Option(
            help="Where to POST alerts (JSON). Default: RABBITRETRY_ALERT_WEBHOOK_URL. "
            "Shown masked in every message."
        ),
    ] = None,
    once: Annotated[
        bool, typer.Option("--once", help="One round, then exit (1 if a delivery failed).")
    ] = False,
    interval: Annotated[
        float, typer.Option(min=0.1, help="Seconds between rounds when not --once.")
    ] = 10.0,
    window: Annotated[
        float,
        typer.Option(
            min=0,
            help="Seconds a dead-letter alert collects deaths of the same error before it is "
            "sent (one alert per error fingerprint per window).",
        ),
    ] = alerts.DEFAULT_WINDOW,
    repeat: Annotated[
        float,
        typer.Option(
            min=0, help="Seconds before a lasting heartbeat or backlog condition alerts again."
        ),
    ] = alerts.DEFAULT_REPEAT,
    backlog_threshold: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Alert when a work queue holds this many ready messages (asks the broker). "
            "Off when not given.",
        ),
    ] = None,
    queue: Annotated[
        list[str] | None,
        typer.Option(help="Queues to watch for backlog (repeatable). Default: all in the ledger."),
    ] = None,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds per webhook call.")] = 10.0,
    verbose: VerboseOption = False,
    database: DatabaseOption = None,
) -> None:
    """Check heartbeats and backlog, then send the alerts that are due.

    A downstream's alerts (its breaker opened, then closed) are sent in that
    order; the "unavailable" one says how many messages wait on the queues
    that call it (asked of the broker: "unknown" when it cannot be reached).

    A refused or failed delivery is retried with a doubling backoff (5 s up
    to 5 min), never given up. Several deliverers may run at once: each alert
    is sent once, unless a deliverer dies between the POST and recording it
    (receivers can drop such a repeat by the alert's id).
    """
    configure_logging(verbose)
    config = settings()
    url = _webhook(webhook_url)
    pool = await db.create_pool(config.database(database), min_size=1, max_size=2)
    try:
        deliverer = alerts.AlertDeliverer(
            pool,
            url,
            amqp_url=config.amqp_url,
            window=window,
            repeat=repeat,
            backlog_threshold=backlog_threshold,
            queues=queue or (),
            timeout=timeout,
        )
        if once:
            stats = await deliverer.round()
        else:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, deliverer.stop)
            out.print(f"delivering alerts to {mask_secret_url(url)} every {interval:g} s")
            stats = await deliverer.run(interval)
    finally:
        await pool.close()
    out.print(
        f"{stats.raised} raised, {stats.sent} delivered, {stats.failed} failed "
        f"(to {mask_secret_url(url)})",
        highlight=False,
    )
    if once and stats.failed:
        raise typer.Exit(1)


@app.command()
@run_async
async def test(
    webhook_url: Annotated[
        str | None,
        typer.Option(help="Default: RABBITRETRY_ALERT_WEBHOOK_URL."),
    ] = None,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds to wait for it.")] = 10.0,
) -> None:
    """Post a made-up alert (id 0) to the webhook now, to check that it arrives.

    Nothing is stored; exit 1 if the webhook does not accept it.
    """
    url = _webhook(webhook_url)
    try:
        await alerts.post_json(url, alerts.sample(), timeout)
    except alerts.AlertNotDelivered as error:
        raise RabbitRetryError(f"{mask_secret_url(url)} did not accept it: {error}") from None
    out.print(f"{mask_secret_url(url)} accepted the test alert", highlight=False)


@app.command("list")
@run_async
async def list_(
    status: Annotated[
        str | None, typer.Option(help=f"Only alerts in this state: {', '.join(STATUSES)}.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="How many, newest first.")] = 20,
    as_json: JsonOption = False,
    database: DatabaseOption = None,
) -> None:
    """Recent alerts and their delivery state: open (collecting), pending (to send), sent.

    Kinds: dead, heartbeat, backlog, downstream (a breaker opened or closed).

    With --json: an array of objects (id, kind, title, queue, group_key, error_type,
    error_message, count, sample_keys, first_seen, last_seen, status, tries, next_try_at,
    last_error, sent_at); [] when there are none.
    """
    if status is not None and status not in STATUSES:
        raise UserError(f"--status must be one of {', '.join(STATUSES)}, not {status!r}")
    pool = await db.create_pool(settings().database(database), min_size=1, max_size=1)
    try:
        found = await alerts.recent(pool, status=status, limit=limit)
    finally:
        await pool.close()
    if as_json:
        print_json([{"title": title(alert), **dataclasses.asdict(alert)} for alert in found])
        return
    if not found:
        out.print("no alerts")
        return
    table = Table()
    for column in ("id", "kind", "alert", "count", "first seen", "last seen", "state", "tries"):
        table.add_column(column, justify="right" if column in ("id", "count", "tries") else "left")
    table.add_column("last error")
    for alert in found:
        state = alert.status if alert.status != "sent" else f"sent {age(alert.sent_at)} ago"
        table.add_row(
            str(alert.id),
            alert.kind,
            literal(title(alert)),
            str(alert.count),
            age(alert.first_seen),
            age(alert.last_seen),
            state,
            str(alert.tries),
            literal(alert.last_error or ""),
        )
    out.print(table)
