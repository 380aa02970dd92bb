"""The worker: N consumers per queue, each on its own channel with prefetch 1, and a clean stop.

On SIGTERM, SIGINT or SIGHUP the worker cancels its consumers (no new deliveries), lets
in-flight attempts finish for ``shutdown_timeout`` seconds, then interrupts the rest: an
interrupted attempt is recorded as such, not counted against the budget, and its delivery is
requeued, never dead-lettered. A second signal stops the waiting: the attempts still running
are interrupted at once, and a third gets the default action. A signal during start-up
abandons the start-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rabbitretry import amqp, db, urls
from rabbitretry.amqp import ConfirmingPublisher, IncomingMessage
from rabbitretry.consumer import Consumer, topology_of
from rabbitretry.delivery.breakers import Breakers
from rabbitretry.delivery.outage import Gates, Health, OutageGate, broker_probe, ledger_checks
from rabbitretry.delivery.outcome import Outcome
from rabbitretry.delivery.pipeline import Pipeline
from rabbitretry.delivery.recovery import recovery_consumers
from rabbitretry.delivery.shutdown import close_connection, drain
from rabbitretry.delivery.valves import PROBE_MARGIN, Slot, Valve, watch
from rabbitretry.errors import ConfigurationError
from rabbitretry.ledger import AttemptLedger, migrations
from rabbitretry.topology import declare, verify

log = logging.getLogger("rabbitretry.worker")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass
class Worker:
    """Runs consumers until :meth:`stop` (or SIGTERM, SIGINT or SIGHUP with
    ``install_signal_handlers``).

    The ledger is reached through ``database_url``, or through an application's own asyncpg
    ``pool`` on the same database (then ``ctx.transaction()`` uses that pool too). A consumer
    whose class names a ``database_url`` of its own keeps its ledger (and its
    ``ctx.transaction()``) in that database instead: one pool per database, each checked for
    pending migrations and with an outage gate of its own.
    """

    consumers: Sequence[type[Consumer[Any]]]
    amqp_url: str
    database_url: str | None = None
    pool: db.Pool | None = None
    concurrency: int = 1
    shutdown_timeout: float = 30.0
    declare_topology: bool = False
    name: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")

    started: bool = field(default=False, init=False)
    """True once every consumer is consuming."""
    _stopping: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _abandoning: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _cancelled_start: bool = field(default=False, init=False)
    _inflight: set[asyncio.Task[Any]] = field(default_factory=set, init=False)
    _gates: Gates | None = field(default=None, init=False)  # once the worker is connected
    on_outcome: Callable[[str, Outcome], Awaitable[None]] | None = None
    """Called with the queue and outcome of every delivery (metrics); must not raise."""
    outcomes: list[Outcome] = field(default_factory=list, init=False)
    """Every delivery's outcome, most recent last (bounded), for tests and the demo."""
    _connections: tuple[amqp.Connection, ...] = field(default=(), init=False)
    _channels: list[amqp.Channel] = field(default_factory=list, init=False)
    _watcher: asyncio.Task[None] | None = field(default=None, init=False)
    _main: asyncio.Task[Any] | None = field(default=None, init=False)
    signals_escalate: bool = field(default=True, init=False)
    """Whether a second stop signal interrupts the in-flight attempts (see :meth:`run`)."""
    on_started: Callable[[], None] | None = None
    """Called once every consumer is consuming (a supervisor's sign that the start-up held)."""

    def stop(self) -> None:
        """Ask the worker to stop; safe to call from a signal handler."""
        self._stopping.set()

    def shut_down(self, cause: str) -> None:
        """What a first stop signal does, for ``cause`` (a signal, or who asked): give the
        start-up up, or stop as :meth:`stop` does and say so; once stopping, nothing."""
        if self._stopping.is_set():
            return
        if not self.started:
            log.info("worker %s: %s during start-up, giving up", self.name, cause)
            self._cancelled_start = True
            self._stopping.set()
            if self._main is not None:
                self._main.cancel()
            return
        again = " (send it again to interrupt in-flight attempts)" if self.signals_escalate else ""
        log.info("worker %s: %s, stopping%s", self.name, cause, again)
        self.stop()

    def interrupt(self, cause: str) -> None:
        """What a second stop signal does: :meth:`abandon`, and say so."""
        log.warning(
            "worker %s: %s, no longer waiting: %d in-flight attempt(s) interrupted now, "
            "their deliveries requeued (not counted against their budget)",
            self.name,
            cause,
            len(self._inflight),
        )
        self.abandon()

    def abandon(self) -> None:
        """Stop waiting for in-flight attempts: interrupt them now (their deliveries are
        requeued). Implies :meth:`stop`."""
        self._abandoning.set()
        self._stopping.set()

    async def run(
        self, *, install_signal_handlers: bool = False, signals_escalate: bool = True
    ) -> None:
        """Consume until :meth:`stop`; with ``install_signal_handlers``, until SIGTERM, SIGINT
        or SIGHUP (a second one interrupts the in-flight attempts instead of waiting, unless
        ``signals_escalate`` is false: a supervisor that counts the signals says when)."""
        if self._cancelled_start:  # shut down before it ran
            log.info("worker %s stopped before it started consuming", self.name)
            return
        if not install_signal_handlers:
            await self._run()
            return
        loop = asyncio.get_running_loop()
        self._main = main = asyncio.current_task()
        self.signals_escalate = signals_escalate
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self._on_signal, sig)
        # Stop signals held back while the process started (a supervisor's worker processes
        # start with them blocked) arrive now, at these handlers.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        try:
            await self._run()
        except asyncio.CancelledError:
            if not self._cancelled_start or main is None:
                raise
            main.uncancel()
            log.info("worker %s stopped before it started consuming", self.name)
        finally:
            for sig in STOP_SIGNALS:
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        if not self._stopping.is_set() or not self.signals_escalate:
            self.shut_down(sig.name)
            return
        self.interrupt(f"{sig.name} again")
        for stop_signal in STOP_SIGNALS:  # a third one gets the default action: exit at once
            asyncio.get_running_loop().remove_signal_handler(stop_signal)

    async def _run(self) -> None:
        async with contextlib.AsyncExitStack() as stack:
            pools = await self._ledger_pools(stack)
            for database, pool in pools.items():
                async with pool.acquire() as conn:
                    where = "" if database is None else f" at {urls.mask_url(database)}"
                    await migrations.require_current(conn, where)
            consume_conn = await amqp.connect(
                self.amqp_url, name=f"rabbitretry-consume {self.name}"
            )
            stack.push_async_callback(close_connection, consume_conn)
            publish_conn = await amqp.connect(
                self.amqp_url, name=f"rabbitretry-publish {self.name}"
            )
            stack.push_async_callback(close_connection, publish_conn)
            self._connections = (consume_conn, publish_conn)

            topology = topology_of(self.consumers)
            if self.declare_topology:
                await declare(consume_conn, topology)
            else:
                await verify(consume_conn, topology)

            instances = [consumer_type() for consumer_type in self.consumers]
            for instance in instances:
                await instance.setup()
                stack.push_async_callback(instance.teardown)

            # One gate per service, shared by every slot: an outage is logged once, and all
            # slots pause until it ends.
            self._gates = gates = Gates(
                ledgers={
                    database: OutageGate(_ledger_service(database), AttemptLedger(pool).reconnect)
                    for database, pool in pools.items()
                },
                broker=OutageGate("broker", broker_probe(lambda: amqp.is_up(publish_conn))),
            )
            for gate in gates.ledgers.values():
                stack.push_async_callback(gate.close)
            stack.push_async_callback(gates.broker.close)
            instances += await recovery_consumers(instances, pools)
            valves = await self._start_consumers(instances, pools, consume_conn, publish_conn)
            self.started = True
            if self.on_started is not None:
                self.on_started()
            # What exists now (modules, connections, consumers) lives as long as the worker:
            # out of the collector's sight, a full collection no longer walks it, which took
            # tens of milliseconds in the middle of deliveries.
            gc.freeze()
            log.info(
                "worker %s consuming %s with concurrency %d from %s (event loop: %s)",
                self.name,
                ", ".join(c.queue for c in self.consumers),
                self.concurrency,
                amqp.node_url(consume_conn),
                type(asyncio.get_running_loop()).__module__.partition(".")[0],
            )
            await self._stopping.wait()
            log.info("worker %s stopping: no new deliveries, finishing in-flight work", self.name)
            if self._watcher is not None:
                self._watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._watcher
            for valve in valves:
                if self._abandoning.is_set():
                    break
                await valve.close()  # bounded: with the broker away, a cancel would wait
            await drain(self._inflight, self.shutdown_timeout, self._abandoning)
            log.info("worker %s stopped", self.name)

    async def _ledger_pools(self, stack: contextlib.AsyncExitStack) -> dict[str | None, db.Pool]:
        """A pool per ledger database, keyed by the consumers' ``database_url`` (None: the
        worker's own ``pool`` or ``database_url``)."""
        pools: dict[str | None, db.Pool] = {}
        for database in dict.fromkeys(c.database_url for c in self.consumers):
            if database is None and self.pool is not None:
                pools[None] = self.pool
                continue
            url = database or self.database_url
            if url is None:
                raise ConfigurationError("a Worker needs a database_url or a pool")
            # Per in-flight attempt: one connection for the ledger, one for ctx.transaction().
            queues = sum(
                1 + c.has_recover_hook() for c in self.consumers if c.database_url == database
            )
            slots = self.concurrency * queues
            pool = await db.create_pool(url, min_size=1, max_size=2 * slots + 2)
            stack.push_async_callback(pool.close)
            pools[database] = pool
        return pools

    async def _start_consumers(
        self,
        instances: Sequence[Consumer[Any]],
        pools: dict[str | None, db.Pool],
        consume_conn: amqp.Connection,
        publish_conn: amqp.Connection,
    ) -> list[Valve]:
        """Every consumer's slots, consuming unless a downstream it calls is unavailable; and
        the watcher that pauses and resumes them as the downstreams' breakers say."""
        breakers = {
            database: Breakers(
                pool,
                self.name,
                [
                    d
                    for i in instances
                    if type(i).database_url == database
                    for d in type(i).downstreams
                ],
            )
            for database, pool in pools.items()
        }
        valves = []
        for instance in instances:
            consumer_type = type(instance)
            view = breakers[consumer_type.database_url]
            valve = Valve(
                consumer_type.queue,
                [d.name for d in consumer_type.downstreams],
                view,
                probe_hold=consumer_type.timeout + PROBE_MARGIN,
            )
            pool = pools[consumer_type.database_url]
            for slot in range(self.concurrency):
                await self._start_slot(instance, pool, consume_conn, publish_conn, slot, valve)
            await view.declare(valve.downstreams, valve.queue)
            valves.append(valve)
        for view in breakers.values():
            try:
                await view.refresh()
            except Exception as error:  # the watcher tries again every second
                log.warning("the downstream breakers could not be read yet (%s)", error)
        for valve in valves:
            await valve.settle()
        if any(view.downstreams for view in breakers.values()):
            self._watcher = asyncio.create_task(watch(valves))
        return valves

    async def _start_slot(
        self,
        consumer: Consumer[Any],
        pool: db.Pool,
        consume_conn: amqp.Connection,
        publish_conn: amqp.Connection,
        slot: int,
        valve: Valve,
    ) -> None:
        channel = await consume_conn.channel()
        self._channels.append(channel)
        await channel.set_qos(prefetch_count=1)
        # declare (passively) rather than get: a robust channel restores only declared queues
        # and their consumers after a reconnect.
        queue = await channel.declare_queue(type(consumer).queue, passive=True)
        publisher = await ConfirmingPublisher.open(publish_conn)
        assert self._gates is not None  # set before the first slot starts
        pipeline = Pipeline(
            consumer,
            pool,
            publisher,
            f"{self.name}:{slot}",
            ledger_gate=self._gates.ledgers[type(consumer).database_url],
            broker_gate=self._gates.broker,
            breakers=valve.breakers,
            hold_back=valve.pause,
        )

        async def attempt(message: IncomingMessage, probe: str | None = None) -> None:
            try:
                outcome = await pipeline.process(message, probe)
                self.outcomes.append(outcome)
                del self.outcomes[:-10_000]
                if self.on_outcome is not None:
                    await self.on_outcome(pipeline.queue, outcome)
            except Exception:
                log.exception("unexpected error processing a delivery; the broker redelivers it")

        def start(message: IncomingMessage, probe: str | None = None) -> asyncio.Task[None]:
            # aiormq cancels its callback tasks when the channel closes (a connection blip);
            # the attempt runs in a task of the worker's own so that a blip cannot cut a
            # handler short. Its ack then fails, the broker redelivers, the ledger drops it.
            task = asyncio.create_task(attempt(message, probe))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)
            return task

        async def on_message(message: IncomingMessage) -> None:
            # Not awaited: prefetch 1 already holds the next delivery back, and waiting here
            # would cost two more turns of the event loop per message.
            start(message)

        async def run_probe(message: IncomingMessage, probe: str) -> None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(start(message, probe))

        valve.slots.append(Slot(queue, on_message))
        if valve.run_probe is None:
            valve.run_probe = run_probe

    @property
    def consuming_node(self) -> str | None:
        """The URL (password masked) of the node the consumers use, or used last."""
        if not self._connections:
            return None
        return amqp.node_url(self._connections[0])

    @property
    def ledger_databases(self) -> dict[str | None, str]:
        """The label of each ledger database the worker uses, keyed as its pools (None: the
        worker's own ``database_url`` or ``pool``): :func:`rabbitretry.urls.database_labels`,
        the labels of ``/healthz`` and of the metrics' ``database``."""
        keys = list(dict.fromkeys(c.database_url for c in self.consumers)) or [None]
        known = {key: key or self.database_url for key in keys}
        labels = urls.database_labels(url for url in known.values() if url is not None)
        return {key: labels[url] if url else "default" for key, url in known.items()}

    def health(self) -> Health:
        """The worker's own view of its health, without I/O (``/healthz`` adds a query): the
        broker connections, the outage gates (``ledger:LABEL`` per database), the consumers."""
        gates = self._gates
        broker = consumers = "ok"
        if any(conn.is_closed for conn in self._connections):
            broker = "the connection to RabbitMQ is closed"
        elif any(not conn.connected.is_set() for conn in self._connections):
            broker = "the connection to RabbitMQ is down; reconnecting"
        elif gates is not None and not gates.broker.is_open:
            broker = "RabbitMQ is unreachable; deliveries paused"
        ledgers = ledger_checks(self.ledger_databases, None if gates is None else gates.ledgers)
        if not self.started:
            consumers = "not started"
        elif self._stopping.is_set():
            consumers = "stopping"
        elif any(channel.is_closed for channel in self._channels):
            consumers = "a consumer's channel is closed"
        return Health({"broker": broker, **ledgers, "consumers": consumers})


def _ledger_service(database: str | None) -> str:
    """The name an outage gate logs: the ledger, or the ledger in a consumer's database."""
    return "ledger" if database is None else f"ledger at {urls.mask_url(database)}"
