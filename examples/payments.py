"""Payment gateway callbacks: `python -m examples.payments` (`make demo-payments`).

A fake gateway posts callbacks over HTTP to the receiver: a payment, a duplicate of it, a
refund before its payment, a late second payment while the order is refunding, and one with a
bad signature. The receiver stores each in the outbox; the relay publishes it; the consumer
moves the order along the declared transitions only. Then the gateway's statement (every
event it settled) is reconciled against the ledger: a payment whose callback never came is
found and re-driven.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Literal

import uvicorn
from pydantic import BaseModel
from rich.console import Console

from rabbitretry import (
    Consumer,
    Context,
    Expected,
    OutboxRelay,
    Reconciler,
    RetryPolicy,
    Worker,
    amqp,
    db,
    topology_of,
)
from rabbitretry.callbacks import CallbackKind, CallbackReceiver, HmacSignature, StateMachine
from rabbitretry.ledger import migrations
from rabbitretry.reconcile.expected import ExpectedSource, reconciliation
from rabbitretry.settings import Settings
from rabbitretry.topology import declare

GATEWAY_SECRET = "demo-shared-secret"  # in production: from the environment, never in code

ORDERS_TABLE = """
CREATE TABLE IF NOT EXISTS payments_order (
    id     text PRIMARY KEY,
    amount integer NOT NULL,
    state  text NOT NULL DEFAULT 'pending'
)
"""


class GatewayEvent(BaseModel):
    """What the gateway posts: one event of one transaction."""

    transaction_id: str
    order_id: str
    type: Literal["paid", "closed", "refunding", "refunded"]
    amount: int


ORDER = StateMachine(
    name="order",
    table="payments_order",
    transitions={
        "pending": {"paid", "closed"},
        "paid": {"refunding", "refunded"},
        "refunding": {"refunded"},
    },
    retry_delay=1.0,  # an event ahead of its predecessor waits a second, then tries again
)


class SettlePayment(Consumer[GatewayEvent]):
    """Applies a gateway event to its order: the event's type is the order's target state."""

    queue = "payments.settle"
    retry = RetryPolicy(max_attempts=10, initial_delay=1.0, max_delay=8.0)

    async def handle(self, msg: GatewayEvent, ctx: Context) -> None:
        async with ctx.transaction() as conn:
            change = await ORDER.move(conn, msg.order_id, msg.type, message_id=ctx.message_id)
        change.settle()  # not yet possible: retried through the delay chain


def payment_key(event: GatewayEvent) -> str:
    """One transaction's event is one message, however often the gateway sends it."""
    return f"payment-{event.transaction_id}-{event.type}"


payment_callbacks = CallbackKind(
    name="payment",
    model=GatewayEvent,
    consumer=SettlePayment,
    message_id=payment_key,
    signature=HmacSignature(secret=GATEWAY_SECRET),
)


class FakeGateway:
    """Posts signed callbacks and keeps its statement: every event it settled."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.statement: list[GatewayEvent] = []

    async def post(self, event: GatewayEvent, *, secret: str = GATEWAY_SECRET) -> str:
        if secret == GATEWAY_SECRET:  # a forger's request is not on the gateway's statement
            self.statement.append(event)
        body = event.model_dump_json().encode()
        headers = HmacSignature(secret=secret).headers(body, time.time())
        return await asyncio.to_thread(_post, self.url, body, headers)

    def settle_silently(self, event: GatewayEvent) -> None:
        """A payment whose callback never arrives (the gateway gave up on us)."""
        self.statement.append(event)


def _post(url: str, body: bytes, headers: dict[str, str]) -> str:
    """The receiver's answer: its status code and message."""
    request = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json", **headers}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return f"{response.status} {json.load(response)['message']}"
    except urllib.error.HTTPError as error:
        return f"{error.code} {json.load(error)['message']}"


def gateway_statement(gateway: FakeGateway) -> ExpectedSource:
    """The gateway's statement as the expected set of the consumer's queue: each event it
    settled should have been handled under its key."""

    async def settled(start: datetime, end: datetime) -> AsyncIterator[Expected]:
        for event in gateway.statement:
            yield Expected(payment_key(event), event)

    return settled


console = Console()


async def main() -> None:
    # The consumer's retries and the receiver's refusals, inline with the demo's story.
    logging.basicConfig(format="    log: %(message)s", level=logging.WARNING, stream=sys.stdout)
    config = Settings()
    started = time.monotonic()
    run = secrets.token_hex(3)
    orders = {name: f"{run}-{name}" for name in "ABCDE"}
    pool = await db.create_pool(config.database_url, max_size=8)
    connection = await amqp.connect(config.amqp_url, name="rabbitretry-payments-demo")
    receiver = CallbackReceiver([payment_callbacks], pool=pool)
    server = uvicorn.Server(uvicorn.Config(receiver, host="127.0.0.1", port=0, log_level="error"))
    tasks: list[asyncio.Task[None]] = [asyncio.create_task(server.serve())]
    try:
        async with pool.acquire() as conn:
            await migrations.migrate(conn)
            await conn.execute(ORDERS_TABLE)
            for order in orders.values():
                await conn.execute(
                    "INSERT INTO payments_order (id, amount) VALUES ($1, 100)", order
                )
        await declare(connection, topology_of([SettlePayment]))
        worker = Worker([SettlePayment], config.amqp_url, pool=pool, concurrency=2)
        relay = OutboxRelay(pool, config.amqp_url)
        tasks += [asyncio.create_task(worker.run()), asyncio.create_task(relay.run())]

        async def listening() -> bool:
            return server.started

        await wait_until(listening)
        port = server.servers[0].sockets[0].getsockname()[1]
        gateway = FakeGateway(f"http://127.0.0.1:{port}/payment")
        console.print(f"receiver on http://127.0.0.1:{port}/payment; orders {run}-A..E pending")

        def event(order: str, kind: str, transaction: str = "1") -> GatewayEvent:
            return GatewayEvent.model_validate(
                {
                    "transaction_id": f"t{orders[order]}-{transaction}",
                    "order_id": orders[order],
                    "type": kind,
                    "amount": 100,
                }
            )

        async def show(what: str, answer: str) -> None:
            console.print(f"  gateway → {what}: [bold]{answer}[/bold]")

        console.print("the gateway calls back:")
        await show("A paid", await gateway.post(event("A", "paid")))
        await show("A paid again (its retry)", await gateway.post(event("A", "paid")))
        await show("B refunded, before B's paid", await gateway.post(event("B", "refunded")))
        await show("C paid", await gateway.post(event("C", "paid")))
        await show("D paid, forged signature", await gateway.post(event("D", "paid"), secret="x"))
        await wait_for_states(pool, {orders["A"]: "paid", orders["C"]: "paid"})
        await show("B paid, late", await gateway.post(event("B", "paid")))
        await show("C refunding", await gateway.post(event("C", "refunding")))
        await wait_for_states(pool, {orders["B"]: "refunded", orders["C"]: "refunding"})
        late = event("C", "paid", transaction="2")
        await show("C paid by a second transaction, late", await gateway.post(late))
        await wait_for_finished(pool, payment_key(late))
        gateway.settle_silently(event("E", "paid"))
        console.print("  (E was paid at the gateway, but its callback never came)")

        await print_histories(pool, orders)

        await reconcile_statement(pool, config.amqp_url, gateway, since=started)
        await wait_for_states(pool, {orders["E"]: "paid"})
        console.print(f"  order {orders['E']} is now paid")
        worker.stop()
        relay.stop()
    finally:
        server.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
        await connection.close()
        await pool.close()


async def reconcile_statement(
    pool: db.Pool, amqp_url: str, gateway: FakeGateway, *, since: float
) -> None:
    """One reconciler pass with the gateway's statement as the consumer's expected set."""
    console.print("\nreconciling the gateway's statement against the ledger:")
    # The window covers this run only: earlier runs' events are not on this statement.
    statement = reconciliation(
        queue=SettlePayment.queue,
        name="gateway-statement",
        lookback=time.monotonic() - since + 1,
        settle=0,
    )(gateway_statement(gateway))
    reconciler = Reconciler(pool, amqp_url, consumers=[SettlePayment], reconciliations=[statement])
    try:
        (window,) = (await reconciler.run_once()).windows
    finally:
        await reconciler.close()
    console.print(
        f"  {window.expected} events on the statement, {window.succeeded} handled, "
        f"{window.missing} missing ({', '.join(window.missing_keys)}): "
        f"{window.republished} re-published; {window.orphaned} handled but not on it"
    )


async def wait_until(check: Callable[[], Awaitable[bool]], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise RuntimeError("the demo did not settle in time")
        await asyncio.sleep(0.2)


async def wait_for_states(pool: db.Pool, expected: dict[str, str]) -> None:
    async def reached() -> bool:
        rows = await pool.fetch(
            "SELECT id, state FROM payments_order WHERE id = ANY($1)", list(expected)
        )
        return {row["id"]: row["state"] for row in rows} == expected

    await wait_until(reached)


async def wait_for_finished(pool: db.Pool, message_id: str) -> None:
    async def finished() -> bool:
        status = await pool.fetchval(
            "SELECT status FROM rabbitretry.ledger WHERE queue = $1 AND message_id = $2",
            SettlePayment.queue,
            message_id,
        )
        return bool(status == "succeeded")

    await wait_until(finished)


async def print_histories(pool: db.Pool, orders: dict[str, str]) -> None:
    console.print("\neach order's history (rabbitretry.state_transition):")
    async with pool.acquire() as conn:
        for order in orders.values():
            state = await conn.fetchval("SELECT state FROM payments_order WHERE id = $1", order)
            console.print(f"  {order}: now [bold]{state}[/bold]")
            for row in await ORDER.history(conn, order):
                console.print(
                    f"    {row['from_state']} → {row['to_state']}: {row['outcome']}"
                    f"  ({row['message_id']})"
                )


if __name__ == "__main__":
    asyncio.run(main())
