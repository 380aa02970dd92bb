"""Ship orders through a warehouse system (WMS) that goes down: `python -m examples.wms`.

``ShipOrder`` hands each order of the queue ``orders.ship`` to the WMS over HTTP, then records
the shipment in ``wms_shipments``, in the transaction that marks the message ``succeeded``. The
WMS is a declared downstream: while it answers 500, its breaker opens, the queue pauses and
no attempt is charged (docs/downstreams.md). ``rabbitretry run examples.wms:ShipOrder`` runs
it against the WMS at ``WMS_URL``.

``main()`` starts a stub WMS on a free port, a worker, and publishes 300 orders at 25 a
second; the WMS answers 500 for 10 s of them. It waits until every order is shipped and
prints a verdict; it exits 1 if an order is lost or dead.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import asyncpg
from pydantic import BaseModel

from rabbitretry import (
    Binding,
    Consumer,
    Context,
    Downstream,
    Permanent,
    Publisher,
    RetryPolicy,
    Worker,
    amqp,
    db,
    topology_of,
)
from rabbitretry.ledger import migrations
from rabbitretry.settings import Settings
from rabbitretry.topology import declare

SCHEMA = """
CREATE TABLE IF NOT EXISTS wms_shipments (
    idempotency_key text PRIMARY KEY,
    order_id        text NOT NULL,
    at              timestamptz NOT NULL DEFAULT now()
)
"""


class Order(BaseModel):
    order_id: str
    sku: str
    quantity: int


class WmsUnavailable(Exception):
    """The WMS answered 5xx or could not be reached: an outage, not a bad order."""


def ship(wms_url: str, order: Order, key: str) -> None:
    """POST the order to the WMS (blocking: run it in a thread); ``key`` makes a repeat harmless."""
    request = urllib.request.Request(
        f"{wms_url}/shipments",
        data=order.model_dump_json().encode(),
        headers={"content-type": "application/json", "idempotency-key": key},
        method="POST",
    )
    try:
        urllib.request.urlopen(request, timeout=5).close()
    except urllib.error.HTTPError as error:  # before OSError: an HTTPError is one too
        error.close()
        if error.code < 500:
            raise Permanent(f"the WMS refuses order {order.order_id}: HTTP {error.code}") from None
        raise WmsUnavailable(f"HTTP {error.code}") from None
    except OSError as error:  # refused, reset, timed out
        raise WmsUnavailable(str(error)) from None


class ShipOrder(Consumer[Order]):
    queue = "orders.ship"
    bindings = [Binding(exchange="orders", routing_key="order.ship")]
    retry = RetryPolicy(max_attempts=5, initial_delay=1.0, multiplier=2.0)
    downstreams = (Downstream("wms", unavailable_on=(WmsUnavailable,)),)

    async def setup(self) -> None:
        self.wms_url = os.environ.get("WMS_URL", "http://127.0.0.1:8081")
        conn = await asyncpg.connect(Settings().database_url)
        try:
            await conn.execute(SCHEMA)
        finally:
            await conn.close()

    async def handle(self, msg: Order, ctx: Context) -> None:
        async with ctx.downstream("wms"):  # an outage in here pauses the queue, charges nothing
            await asyncio.to_thread(ship, self.wms_url, msg, ctx.idempotency_key)
        async with ctx.transaction() as conn:  # commits with the ledger's success mark
            await conn.execute(
                "INSERT INTO wms_shipments (idempotency_key, order_id) VALUES ($1, $2)",
                ctx.idempotency_key,
                msg.order_id,
            )


# --- the demo: a stub WMS, an outage, a verdict ----------------------------------------------


class StubWms(ThreadingHTTPServer):
    """A WMS on 127.0.0.1 (a free port): accepts every shipment, or answers 500 while
    ``down``. ``requests`` says, for each request, whether it came while the WMS was down."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Answer)
        self.down = False
        self.requests: list[bool] = []
        self.url = f"http://127.0.0.1:{self.server_port}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


class _Answer(BaseHTTPRequestHandler):
    server: StubWms

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.server.requests.append(self.server.down)
        self.send_response(500 if self.server.down else 200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet: the verdict counts the requests


async def publish(amqp_url: str, run: str, orders: int, rate: float) -> None:
    """``orders`` orders at a steady ``rate`` a second, each with its business key."""
    started = time.monotonic()
    async with Publisher(amqp_url) as publisher:
        for n in range(orders):
            await asyncio.sleep(max(0.0, started + n / rate - time.monotonic()))
            order = Order(order_id=f"{run}-{n}", sku=f"SKU-{n % 17}", quantity=1 + n % 3)
            await publisher.publish(
                "orders", order, routing_key="order.ship", message_id=f"ship-{order.order_id}"
            )


async def outage(wms: StubWms, after: float, seconds: float) -> float:
    """Take the WMS down ``after`` seconds from now, for ``seconds``; when it came back."""
    await asyncio.sleep(after)
    print(f"the WMS goes down for {seconds:.0f} s (HTTP 500)")
    wms.down = True
    await asyncio.sleep(seconds)
    wms.down = False
    print("the WMS answers again")
    return time.monotonic()


VERDICT = """
SELECT (SELECT count(*) FROM wms_shipments WHERE order_id LIKE $1 || '-%') AS shipped,
       count(*) FILTER (WHERE status = 'dead') AS dead,
       coalesce(sum(attempts - attempts_forgiven - 1), 0) AS charged
FROM rabbitretry.ledger WHERE queue = 'orders.ship' AND message_id LIKE 'ship-' || $1 || '-%'
"""


async def settled(pool: db.Pool, run: str, orders: int, timeout: float = 60) -> db.Record:
    """The verdict's figures, once every order is shipped or dead (or after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        row = await pool.fetchrow(VERDICT, run)
        assert row is not None  # an aggregate: always one row
        if row["shipped"] + row["dead"] >= orders or time.monotonic() > deadline:
            return row
        await asyncio.sleep(0.2)


async def main(orders: int = 300, rate: float = 25.0, down_for: float = 10.0) -> int:
    config, run, wms = Settings(), secrets.token_hex(3), StubWms()
    os.environ["WMS_URL"] = wms.url
    pool = await db.create_pool(config.database_url, max_size=4)
    try:
        async with pool.acquire() as conn:
            await migrations.migrate(conn)
            await conn.execute(SCHEMA)
        connection = await amqp.connect(config.amqp_url, name="rabbitretry-wms-demo")
        await declare(connection, topology_of([ShipOrder]))
        await connection.close()
        last_alert = await pool.fetchval("SELECT coalesce(max(id), 0) FROM rabbitretry.alert")

        print(f"{orders} orders at {rate:.0f}/s to {ShipOrder.queue}, a stub WMS at {wms.url}")
        worker = Worker([ShipOrder], config.amqp_url, pool=pool, concurrency=8)
        worker_task = asyncio.create_task(worker.run())
        try:
            down = asyncio.create_task(outage(wms, orders / rate / 4, down_for))
            await publish(config.amqp_url, run, orders, rate)
            back = await down
            row = await settled(pool, run, orders)
            caught_up = time.monotonic() - back
        finally:
            worker.stop()
            await worker_task
        state = await pool.fetchval("SELECT state FROM rabbitretry.downstream WHERE name = 'wms'")
        alerts = await pool.fetch(
            "SELECT detail->>'state' AS state FROM rabbitretry.alert"
            " WHERE kind = 'downstream' AND group_key = 'wms' AND id > $1 ORDER BY id",
            last_alert,
        )
    finally:
        await pool.close()
        wms.shutdown()
        wms.server_close()

    lost = orders - row["shipped"] - row["dead"]
    print(f"orders: {orders}, shipped: {row['shipped']}, dead: {row['dead']}, lost: {lost}")
    print(f"requests to the WMS during the outage: {sum(wms.requests)}")
    print(f"attempts charged beyond the first: {row['charged']}")
    print(f"caught up: {caught_up:.1f} s after the WMS came back")
    print(f"breaker: {state}; alerts: {', '.join(a['state'] for a in alerts) or 'none'}")
    return 1 if lost or row["dead"] else 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="   %(levelname)s %(message)s")
    raise SystemExit(asyncio.run(main()))
