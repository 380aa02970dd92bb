"""The outside world of the WMS outage drill (:mod:`drills.downstream`): the steady publisher of
orders, the outage of the stub WMS, the workers (``rabbitretry run`` subprocesses), and what the
broker says of the work queue.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aio_pika

from drills.downstream_consumer import Order
from drills.downstream_stub import StubWms
from drills.supervisor import Supervisor

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT = 60.0  # seconds the workers may take to start consuming


async def publish_orders(
    amqp_url: str, queue: str, orders: int, rate: float, started: float
) -> dict[str, float]:
    """``orders`` orders at a steady ``rate`` a second from ``started`` (wall-clock time), with
    confirms; each order's message_id -> when it was published."""
    published: dict[str, float] = {}
    connection = await aio_pika.connect(amqp_url, timeout=10)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        for n in range(orders):
            await asyncio.sleep(max(0.0, started + n / rate - time.time()))
            order = Order(order_id=f"order-{n:06d}", n=n)
            published[order.order_id] = time.time()
            await channel.default_exchange.publish(
                aio_pika.Message(
                    order.model_dump_json().encode(),
                    message_id=order.order_id,
                    content_type="application/json",
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                ),
                routing_key=queue,
                mandatory=True,
                timeout=10,
            )
    finally:
        await connection.close()
    return published


@dataclass
class Outage:
    """The WMS's outage: down ``after`` seconds from ``started`` for ``seconds`` (or for good)."""

    wms: StubWms
    started: float
    after: float
    seconds: float
    never_recovers: bool
    say: Callable[[str], None]
    down_at: float = 0.0
    up_at: float | None = None

    async def run(self) -> None:
        await asyncio.sleep(max(0.0, self.started + self.after - time.time()))
        self.wms.down = True
        self.down_at = time.time()
        if self.never_recovers:
            self.say(f"the WMS goes down (HTTP 500), for good; watching for {self.seconds:g} s")
        else:
            self.say(f"the WMS goes down for {self.seconds:g} s (HTTP 500)")
        await asyncio.sleep(max(0.0, self.down_at + self.seconds - time.time()))
        if not self.never_recovers:
            self.wms.down = False
            self.up_at = time.time()
            self.say("the WMS answers again")


@dataclass
class Workers:
    """``count`` supervised ``rabbitretry run CONSUMER --concurrency N`` processes."""

    consumer: str
    env: dict[str, str]
    logs: Path
    count: int
    concurrency: int
    supervisors: list[Supervisor] = field(default_factory=list)

    def start(self) -> None:
        for n in range(self.count):
            supervisor = Supervisor(
                self.consumer,
                self.env,
                self.logs / f"worker-{n + 1}.log",
                concurrency=self.concurrency,
                cwd=ROOT,
            )
            supervisor.start()
            self.supervisors.append(supervisor)

    async def stop(self) -> None:
        """SIGKILL every worker: the broker puts back what they held (nothing, or a probe)."""
        for supervisor in self.supervisors:
            await supervisor.stop()

    @property
    def exits(self) -> dict[int, int]:
        total: dict[int, int] = {}
        for supervisor in self.supervisors:
            for code, n in supervisor.exits.items():
                total[code] = total.get(code, 0) + n
        return total

    async def consuming(self, amqp_url: str, queue: str) -> None:
        """Wait until every slot of every worker consumes ``queue``."""
        wanted = self.count * self.concurrency
        deadline = time.monotonic() + START_TIMEOUT
        while (found := (await queue_counts(amqp_url, queue))[1]) < wanted:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{found} of {wanted} consumers on {queue} after {START_TIMEOUT:g} s; "
                    f"see the worker logs in {self.logs}"
                )
            await asyncio.sleep(0.5)


async def queue_counts(amqp_url: str, queue: str) -> tuple[int, int]:
    """Messages ready in ``queue`` and its consumers (a passive declare)."""
    connection = await aio_pika.connect(amqp_url, timeout=10)
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        result = declared.declaration_result
        return int(result.message_count or 0), int(result.consumer_count or 0)
    finally:
        await connection.close()
