"""The consumers of the WMS outage drill (:mod:`drills.downstream`): ``ShipOrder`` declares the
WMS as a downstream and calls it in ``ctx.downstream("wms")``; ``ShipOrderPlain`` is the same
handler with plain retries (no ``downstreams``, no block), the "before" of the drill.

Run by ``rabbitretry run drills.downstream_consumer:ShipOrder``. The queue comes from
``RABBITRETRY_DRILL_WMS_QUEUE`` and the WMS from ``RABBITRETRY_DRILL_WMS_URL``, so that every
drill has its own. Each attempt first writes its effect row (the drill's effects table) in
``ctx.transaction()``, then posts the order to the WMS: the row commits only with the ledger's
success mark, so an attempt the WMS failed leaves nothing behind, and a second row for an order
would be a duplicate effect.
"""

from __future__ import annotations

import asyncio
import os
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from pydantic import BaseModel

from drills.consumer import EFFECTS_TABLE
from rabbitretry import Consumer, Context, Downstream, Permanent, RetryPolicy

QUEUE_ENV = "RABBITRETRY_DRILL_WMS_QUEUE"
WMS_URL_ENV = "RABBITRETRY_DRILL_WMS_URL"
CALL_TIMEOUT = 5.0  # seconds a call to the WMS may take

# The scenario's policy: five attempts, 1 s, 2 s, 4 s, 8 s apart (± 20%).
POLICY = RetryPolicy(max_attempts=5, initial_delay=1.0, multiplier=2.0, jitter=0.2)
WMS = "wms"  # the downstream's name (its breaker's row in rabbitretry.downstream)


class WmsUnavailable(Exception):
    """The WMS answered 5xx or could not be reached: an outage, not a bad order."""


class Order(BaseModel):
    order_id: str
    n: int


def post_order(wms_url: str, order: Order, key: str) -> None:
    """POST the order to the WMS (blocking: run it in a thread)."""
    request = urllib.request.Request(
        f"{wms_url}/shipments",
        data=order.model_dump_json().encode(),
        headers={"content-type": "application/json", "idempotency-key": key},
        method="POST",
    )
    try:
        urllib.request.urlopen(request, timeout=CALL_TIMEOUT).close()
    except urllib.error.HTTPError as error:  # before OSError: an HTTPError is one too
        error.close()
        if error.code < 500:
            raise Permanent(f"the WMS refuses order {order.order_id}: HTTP {error.code}") from None
        raise WmsUnavailable(f"HTTP {error.code}") from None
    except OSError as error:  # refused, reset, timed out
        raise WmsUnavailable(str(error)) from None


class _Shipping:
    """What both consumers share: the WMS's address, the threads its calls run in, the effect."""

    wms_url: str
    calls: ThreadPoolExecutor

    async def setup(self) -> None:
        self.wms_url = os.environ.get(WMS_URL_ENV, "http://127.0.0.1:8081")
        # A thread per slot (the default executor has 6 on two cores: slots would queue).
        self.calls = ThreadPoolExecutor(max_workers=64, thread_name_prefix="wms")

    async def teardown(self) -> None:
        self.calls.shutdown(wait=False)

    async def write_effect(self, msg: Order, ctx: Context) -> None:
        async with ctx.transaction() as conn:  # commits with the ledger's success mark
            await conn.execute(
                f"INSERT INTO {EFFECTS_TABLE} (message_id, attempt, pid, written_at)"
                " VALUES ($1, $2, $3, clock_timestamp())",
                ctx.message_id,
                ctx.attempt,
                os.getpid(),
            )

    async def ship(self, msg: Order, ctx: Context) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.calls, post_order, self.wms_url, msg, ctx.idempotency_key)


class ShipOrder(_Shipping, Consumer[Order]):
    """The order shipped through the WMS, a declared downstream with its breaker."""

    queue = os.environ.get(QUEUE_ENV, "rabbitretry-drill-wms")
    retry = POLICY
    timeout = 30.0
    # The breaker's defaults: 5 failures within 30 s open it, probes after 1 s doubling to 15 s.
    downstreams = (Downstream(WMS, unavailable_on=(WmsUnavailable,)),)

    async def handle(self, msg: Order, ctx: Context) -> None:
        await self.write_effect(msg, ctx)
        async with ctx.downstream(WMS):  # an outage in here pauses the queue, charges nothing
            await self.ship(msg, ctx)


class ShipOrderPlain(_Shipping, Consumer[Order]):
    """The same handler with plain retries: every 500 is a failed attempt."""

    queue = os.environ.get(QUEUE_ENV, "rabbitretry-drill-wms")
    retry = POLICY
    timeout = 30.0

    async def handle(self, msg: Order, ctx: Context) -> None:
        await self.write_effect(msg, ctx)
        await self.ship(msg, ctx)
