"""Starting and stopping a consumer's deliveries by the state of the downstreams it calls.

Each consumer has a :class:`Valve` over its slots (one channel each, prefetch 1). While a
downstream it declares is unavailable (its breaker open or half-open) the valve is closed:
every slot cancels its consumer (``basic.cancel``), so the messages wait on the broker, in
order, none held in a prefetch; a delivery already taken is requeued. The worker's
:func:`watch` reopens it when the breakers close, and when a breaker's probe is due and this
worker wins it, takes exactly one message (``basic.get``) and runs it as the probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from rabbitretry import amqp
from rabbitretry.amqp import IncomingMessage
from rabbitretry.delivery.breakers import POLL, Breakers

log = logging.getLogger("rabbitretry.worker")

PROBE_MARGIN = 30.0  # seconds a probe's hold lasts beyond its consumer's attempt timeout


@dataclass
class Slot:
    """One channel consuming one queue (or not, while its valve is closed)."""

    queue: amqp.Queue
    on_message: Callable[[IncomingMessage], Awaitable[None]]
    tag: str | None = None

    async def consume(self) -> None:
        if self.tag is None:
            self.tag = await self.queue.consume(self.on_message)

    async def cancel(self) -> None:
        if self.tag is not None:
            tag, self.tag = self.tag, None
            await self.queue.cancel(tag)


@dataclass
class Valve:
    """One consumer's slots, consuming or not as the breakers of its downstreams say."""

    queue: str
    downstreams: Sequence[str]
    breakers: Breakers
    probe_hold: float
    run_probe: Callable[[IncomingMessage, str], Awaitable[None]] | None = None
    """Runs a delivery taken as the probe of a downstream, to its end."""
    slots: list[Slot] = field(default_factory=list)
    is_open: bool = False
    paused: bool = False
    """Closed because a downstream it calls is unavailable (not for a shutdown)."""
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def open(self) -> None:
        async with self._lock:
            if self.is_open:
                return
            for slot in self.slots:
                await slot.consume()
            self.is_open = True

    async def close(self) -> None:
        """Stop taking deliveries (idempotent; bounded, as a cancel waits for a lost broker)."""
        async with self._lock:
            if not self.is_open:
                return
            self.is_open = False
            for slot in self.slots:
                with contextlib.suppress(*amqp.CHANNEL_ERRORS, TimeoutError):
                    await asyncio.wait_for(slot.cancel(), 5.0)

    async def pause(self) -> None:
        """Stop taking deliveries because a downstream is unavailable (said once)."""
        if not self.paused:
            closed = [d for d in self.downstreams if self.breakers.state(d) != "closed"]
            log.warning(
                "%s: deliveries pause while %s is unavailable (its breaker is open)",
                self.queue,
                " and ".join(closed) or "a downstream it calls",
            )
        self.paused = True
        await self.close()

    async def settle(self) -> None:
        """Open or close as the breakers of this consumer's downstreams now say."""
        if not self.breakers.admits(self.downstreams):
            await self.pause()
            return
        if self.paused:
            log.warning("%s: its downstreams answer again; deliveries resume", self.queue)
            self.paused = False
        await self.open()

    async def probe(self, name: str) -> bool:
        """Try one waiting delivery as the probe of ``name``; False if none waited."""
        if not self.slots or self.run_probe is None:
            return False
        message = await self.slots[0].queue.get(no_ack=False, fail=False)
        if message is None:
            return False
        await self.run_probe(message, name)
        return True


async def watch(valves: Sequence[Valve], every: float = POLL) -> None:
    """Keep every valve as its breakers say, and run the probes this worker wins; until
    cancelled. A ledger that cannot be read leaves each view as it was."""
    breakers = list({id(v.breakers): v.breakers for v in valves}.values())
    probing: dict[str, asyncio.Task[None]] = {}
    try:
        await _keep(breakers, valves, probing, every)
    finally:
        for task in probing.values():
            task.cancel()


async def _keep(
    breakers: Sequence[Breakers],
    valves: Sequence[Valve],
    probing: dict[str, asyncio.Task[None]],
    every: float,
) -> None:
    while True:
        for view in breakers:
            view.changed.clear()
            try:
                await view.refresh()
            except Exception as error:
                log.debug("the breakers could not be read: %r", error)
        for valve in valves:
            await valve.settle()
        for view in breakers:
            for name in view.downstreams:
                state = view.view(name)
                if state is not None and state.probe_due and name not in probing:
                    task = asyncio.create_task(_probe(view, name, valves))
                    probing[name] = task
                    task.add_done_callback(functools.partial(_done_probing, probing, name))
        await _changed_or(breakers, every)


def _done_probing(probing: dict[str, asyncio.Task[None]], name: str, _: object) -> None:
    probing.pop(name, None)


async def _probe(breakers: Breakers, name: str, valves: Sequence[Valve]) -> None:
    """Take the probe of ``name`` if no other worker has, and try one delivery with it."""
    candidates = [
        v
        for v in valves
        if v.breakers is breakers
        and name in v.downstreams
        and breakers.admits(v.downstreams, probe=name)
    ]
    if not candidates:
        return
    try:
        if not await breakers.take_probe(name, max(v.probe_hold for v in candidates)):
            return
        for valve in candidates:
            if await valve.probe(name):
                break
    except Exception as error:
        log.warning("downstream %s: the probe failed to run: %r", name, error)
    finally:
        # Nothing waited, or the delivery never called the downstream: give it back.
        with contextlib.suppress(Exception):
            await breakers.return_probe(name)


async def _changed_or(breakers: Sequence[Breakers], timeout: float) -> None:
    waits = [asyncio.ensure_future(b.changed.wait()) for b in breakers]
    if not waits:
        await asyncio.sleep(timeout)
        return
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
