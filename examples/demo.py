"""The demo: `make demo` (or `python -m examples.demo`).

Migrates the ledger, declares the topology, publishes a batch of "order paid" messages (some
succeed, some time out and then succeed, some can never succeed), runs a worker until the
ledger is quiet, prints every message's final state, then fixes one cause and replays its
dead letter.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time

import aio_pika
from rich.console import Console
from rich.table import Table

from examples.points import SUSPENDED_USERS, AwardPoints
from rabbitretry import Worker, amqp, db, topology_of
from rabbitretry.errors import RabbitRetryError
from rabbitretry.ledger import Key, migrations
from rabbitretry.operations import dead_letter
from rabbitretry.settings import Settings, mask_url
from rabbitretry.topology import declare

console = Console()
QUEUE = AwardPoints.queue


def batch(run: str) -> list[tuple[str, bytes]]:
    """(message_id, body) pairs: 12 fine, 4 flaky, 1 suspended user, 1 over the limit, 1 garbled."""
    orders: list[tuple[str, dict[str, object]]] = []
    for n in range(1, 13):
        orders.append((f"{run}-ok-{n}", {"user_id": n % 4 + 1, "points": 10 * n}))
    for n in range(1, 5):
        orders.append((f"{run}-flaky-{n}", {"user_id": 7, "points": 5, "flaky": 1 + n % 2}))
    orders.append((f"{run}-suspended", {"user_id": 13, "points": 50}))
    orders.append((f"{run}-too-many", {"user_id": 2, "points": 50_000}))
    messages = [(key, json.dumps({"order_id": key, **body}).encode()) for key, body in orders]
    messages.append((f"{run}-garbled", b'{"order_id": "garbled", "user_id": "someone"'))
    return messages


async def publish_batch(connection: amqp.Connection, messages: list[tuple[str, bytes]]) -> None:
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    orders = await channel.get_exchange("orders")
    for message_id, body in messages:
        await orders.publish(
            aio_pika.Message(
                body,
                message_id=message_id,
                content_type="application/json",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            ),
            routing_key="order.paid",
        )
    await channel.close()


async def states(pool: db.Pool, keys: list[str]) -> list[db.Record]:
    return await pool.fetch(
        "SELECT message_id, status, attempts, reason, error_type, error_message"
        " FROM rabbitretry.ledger WHERE queue = $1 AND message_id = ANY($2) ORDER BY first_seen",
        QUEUE,
        keys,
    )


async def wait_quiet(pool: db.Pool, keys: list[str], timeout: float = 90) -> None:
    """Until every message of the batch has reached a final state."""
    deadline = time.monotonic() + timeout
    with console.status("worker running") as status:
        while time.monotonic() < deadline:
            rows = await states(pool, keys)
            open_ = [r for r in rows if r["status"] in ("processing", "retrying")]
            status.update(f"worker running: {len(rows) - len(open_)}/{len(keys)} settled")
            if len(rows) == len(keys) and not open_:
                return
            await asyncio.sleep(0.3)
    raise RuntimeError(f"the batch did not settle within {timeout} s")


def print_states(rows: list[db.Record], title: str) -> None:
    table = Table(title=title)
    for column in ("key", "status", "attempts", "why"):
        table.add_column(column)
    colours = {"succeeded": "green", "dead": "red"}
    for row in rows:
        why = row["reason"] or ""
        if row["error_message"]:
            why = f"{why}: {row['error_message']}" if why else row["error_message"]
        colour = colours.get(row["status"], "yellow")
        table.add_row(
            row["message_id"],
            f"[{colour}]{row['status']}[/{colour}]",
            str(row["attempts"]),
            why[:90],
        )
    console.print(table)


async def main() -> None:
    config = Settings()
    run = f"demo-{secrets.token_hex(3)}"
    console.print(f"[bold]rabbitretry demo[/bold] run {run}")
    console.print(
        f"  RabbitMQ   {mask_url(config.amqp_url)}\n  PostgreSQL {mask_url(config.database_url)}"
    )

    pool = await db.create_pool(config.database_url, max_size=4)
    connection = await amqp.connect(config.amqp_url, name="rabbitretry-demo")
    try:
        async with pool.acquire() as conn:
            applied = await migrations.migrate(conn)
        console.print(f"1. ledger migrated ({', '.join(applied) or 'already up to date'})")
        await declare(connection, topology_of([AwardPoints]))
        console.print(
            f"2. topology declared: exchange orders -> {QUEUE}, {QUEUE}.dead, the delay chain"
        )

        messages = batch(run)
        keys = [key for key, _ in messages]
        await publish_batch(connection, messages)
        console.print(f"3. published {len(messages)} orders to exchange 'orders'")

        worker = Worker([AwardPoints], config.amqp_url, config.database_url, concurrency=4)
        worker_task = asyncio.create_task(worker.run())
        try:
            await wait_quiet(pool, keys)
            print_states(await states(pool, keys), "4. final ledger states")

            SUSPENDED_USERS.discard(13)
            console.print("5. user 13 is no longer suspended: replaying its dead letter")
            publisher = await amqp.ConfirmingPublisher.open(connection)
            suspended = Key(QUEUE, f"{run}-suspended")
            await dead_letter.replay_one(pool, publisher, suspended, actor="demo")
            await wait_quiet(pool, [suspended.message_id])
            print_states(await states(pool, [suspended.message_id]), "after the replay")
        finally:
            worker.stop()
            await worker_task
        awarded = await pool.fetch(
            "SELECT user_id, sum(points) AS points FROM points_flow"
            " WHERE idempotency_key LIKE $1 GROUP BY user_id ORDER BY user_id",
            f"{QUEUE}:{run}-%",
        )
        totals = {row["user_id"]: row["points"] for row in awarded}
        console.print(f"points recorded in points_flow in this run (user -> points): {totals}")
        console.print(
            "Try: [bold].venv/bin/rabbitretry dead list[/bold], "
            f"[bold].venv/bin/rabbitretry dead show {run}-too-many[/bold]"
        )
    finally:
        await connection.close()
        await pool.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="   %(levelname)s %(message)s")
    try:
        asyncio.run(main())
    except RabbitRetryError as error:
        console.print(f"[red]error:[/red] {error}")
        raise SystemExit(1) from None
