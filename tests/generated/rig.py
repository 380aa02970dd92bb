"""One worker at concurrency 1 on one queue, reused across Hypothesis examples, and the check.

Starting a worker per example would cost a second or more each; the rig starts one per test
function and keeps it while examples pass. After a failing example it starts a fresh worker on
a fresh queue, so that one stalled delivery does not fail every later example (and Hypothesis
shrinks towards the input that really fails, not towards whatever ran after a stall).

The invariant checked for every case (:meth:`Rig.check`):

(a) the message reaches a terminal ledger row (``succeeded``, ``dead`` or ``skipped``; a
    ``dead`` row with a reason) within :data:`BOUND` seconds, and the row keeps the body
    verbatim. The row is found without trusting the message_id (a worker may have to store an
    unstorable id under an escaped key): it is the one new non-sentinel row of the queue. A
    message without an id is published twice, and each delivery needs a row of its own
    (DESIGN.md: "each such delivery with a record of its own");
(b) a healthy message published right after it succeeds within the same bound: the queue
    never stalls;
(c) the worker is still running.

Three signs end a case early, because the bound could only confirm them: the worker logging
that it left a delivery unsettled (on a prefetch-1 channel nothing follows it); a delivery
requeued as if the ledger were unreachable again and again while the services are up (a
content failure taken for an outage: it comes back forever); and the worker's AMQP connection
dying twice on a frame it cannot decode (the broker redelivers the same frame after each
reconnect, so the queue is stuck behind it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import secrets
import time
import uuid
from collections.abc import Callable
from typing import Any

import aio_pika
import aiormq
import asyncpg
import pika  # type: ignore[import-untyped]
from hypothesis import assume, event

from rabbitretry import Consumer, Worker, topology_of
from tests.generated.strategies import TOKEN, Case, aio_pika_message, pika_properties
from tests.integration.conftest import BrokerCleanup

BOUND = 20.0  # seconds for (a) and (b); a retry policy of two attempts 1 s apart fits easily
POLL = 0.05
GRACE = 1.0  # seconds a case's row may lag the healthy message's (it never should)
REQUEUES_BEFORE_GIVING_UP = 3
UNDECODABLE_BEFORE_GIVING_UP = 2
UNSETTLED_LOG = "unexpected error processing a delivery"  # the worker's last-resort log line
WATCHED_LOGGERS = ("rabbitretry", "aiormq", "aio_pika")
TERMINAL = ("succeeded", "dead", "skipped")
SENTINEL_PREFIX = "sentinel-"

ConsumerFactory = Callable[[str], type[Consumer[Any]]]


class InvariantViolated(AssertionError):
    """A generated message broke the tier's invariant (the subclass says which part)."""


class WorkerDied(InvariantViolated):
    """(c): the worker's task ended."""


class UnsettledDelivery(InvariantViolated):
    """The worker gave up on a delivery without acking or requeueing it: the queue stalls."""


class UndecodableDelivery(InvariantViolated):
    """The worker's AMQP client cannot decode the delivery; its connection dies at each copy."""


class RequeuedForever(InvariantViolated):
    """(a): the delivery keeps being requeued as an outage although the services are up."""


class NoLedgerRow(InvariantViolated):
    """(a): no new ledger row for the message (it was dropped, or never processed)."""


class ExtraLedgerRows(InvariantViolated):
    """(a): more than one new ledger row for one message."""


class NotTerminal(InvariantViolated):
    """(a): the message's row is not terminal within the bound."""


class DeadWithoutReason(InvariantViolated):
    """(a): a dead row that does not say why."""


class BodyNotKept(InvariantViolated):
    """(a): the row's payload is not the body as published."""


class QueueStalled(InvariantViolated):
    """(b): the healthy message published after the case did not succeed within the bound."""


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclasses.dataclass(repr=False)
class Rig:
    factory: ConsumerFactory
    amqp_url: str
    database_url: str
    pool: asyncpg.Pool
    cleanup: BrokerCleanup
    sentinel_body: bytes

    queue: str = ""
    worker: Worker | None = None
    task: asyncio.Task[None] | None = None
    broken: bool = False
    known: set[str] = dataclasses.field(default_factory=set)
    keeps_payload: bool = False  # its consumer says keep_payload = "always"
    _connection: aio_pika.abc.AbstractConnection | None = None
    _channel: aio_pika.abc.AbstractChannel | None = None
    _pika: pika.BlockingConnection | None = None
    _pika_thread: concurrent.futures.ThreadPoolExecutor = dataclasses.field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(1, "generated-pika")
    )
    _log: _Records = dataclasses.field(default_factory=_Records)

    def __repr__(self) -> str:  # Hypothesis prints the fixture with each failing example
        return f"Rig(queue={self.queue!r})"

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        self.queue = f"rr-gen-{secrets.token_hex(5)}"
        consumer = self.factory(self.queue)
        self.keeps_payload = consumer.keep_payload == "always"
        self.cleanup.topology(topology_of([consumer]))
        self.known = set()
        self.worker = Worker(
            consumers=[consumer],
            amqp_url=self.amqp_url,
            database_url=self.database_url,
            concurrency=1,
            declare_topology=True,
            shutdown_timeout=2.0,
            name=f"generated:{self.queue}",
        )
        self.task = asyncio.create_task(self.worker.run())
        deadline = time.monotonic() + 30
        while not self.worker.started:
            if self.task.done():
                self.task.result()  # the startup error
            if time.monotonic() > deadline:
                raise RuntimeError("the worker did not start within 30 s")
            await asyncio.sleep(POLL)
        for name in WATCHED_LOGGERS:
            logging.getLogger(name).addHandler(self._log)
        self.broken = False

    async def stop(self) -> None:
        for name in WATCHED_LOGGERS:
            logging.getLogger(name).removeHandler(self._log)
        if self.worker is not None and self.task is not None:
            self.worker.stop()
            try:
                await asyncio.wait_for(asyncio.shield(self.task), 20)
            except BaseException:  # a dead worker's error was reported by the case that saw it
                self.task.cancel()
                await asyncio.gather(self.task, return_exceptions=True)
        self.worker = self.task = None

    async def close(self) -> None:
        await self.stop()
        if self._connection is not None:
            await self._connection.close()
        if self._pika is not None:
            await self._in_pika_thread(self._close_pika)
        self._pika_thread.shutdown(wait=True)

    # --- publishing -------------------------------------------------------------------------

    async def _aio_channel(self) -> aio_pika.abc.AbstractChannel:
        if self._connection is None or self._connection.is_closed:
            self._connection = await aio_pika.connect(self.amqp_url, name="generated-publisher")
            self._channel = None
        if self._channel is None or self._channel.is_closed:
            self._channel = await self._connection.channel(
                publisher_confirms=True, on_return_raises=True
            )
        return self._channel

    async def publish_aio(self, message: aio_pika.Message) -> None:
        channel = await self._aio_channel()
        await channel.default_exchange.publish(message, routing_key=self.queue, timeout=10)

    async def _in_pika_thread(self, fn: Callable[[], None]) -> None:
        await asyncio.get_running_loop().run_in_executor(self._pika_thread, fn)

    def _close_pika(self) -> None:
        if self._pika is not None and self._pika.is_open:
            self._pika.close()
        self._pika = None

    async def publish_pika(self, case: Case) -> None:
        def send() -> None:
            if self._pika is None or not self._pika.is_open:
                self._pika = pika.BlockingConnection(pika.URLParameters(self.amqp_url))
            channel = self._pika.channel()
            try:
                channel.confirm_delivery()
                channel.basic_publish(
                    "", self.queue, case.body, pika_properties(case), mandatory=True
                )
            finally:
                if channel.is_open:
                    channel.close()

        await self._in_pika_thread(send)

    async def publish(self, case: Case) -> None:
        """Publish the case; a broker that refuses it makes the case moot (skipped)."""
        try:
            if case.client == "aio-pika":
                await self.publish_aio(aio_pika_message(case))
            else:
                await self.publish_pika(case)
        except (aiormq.exceptions.AMQPError, pika.exceptions.AMQPError) as error:
            # Not expected after strategies.client_refuses; counted in Hypothesis' statistics.
            event(f"the broker refused a published case: {type(error).__name__}")
            if case.client == "pika":
                await self._in_pika_thread(self._close_pika)
            assume(False)

    # --- the check --------------------------------------------------------------------------

    async def check(self, case: Case) -> None:
        if self.broken or self.task is None or self.task.done():
            await self.stop()
            await self.start()
        case = with_fresh_ids(case)
        self.broken = True  # until the case passes
        self._log.records.clear()
        outcomes_before = len(self.worker.outcomes) if self.worker else 0
        copies = 1 if case.message_id else 2  # an id-less message: one record per delivery
        for _ in range(copies):
            await self.publish(case)
        sentinel = f"{SENTINEL_PREFIX}{uuid.uuid4().hex}"
        await self.publish_aio(
            aio_pika.Message(
                self.sentinel_body,
                message_id=sentinel,
                content_type="application/json",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
        )
        started = time.monotonic()
        deadline = started + BOUND
        sentinel_done_at: float | None = None
        while True:
            self._early_signs(outcomes_before)
            new = await self._new_rows()
            sentinel_status = await self.pool.fetchval(
                "SELECT status FROM rabbitretry.ledger WHERE queue = $1 AND message_id = $2",
                self.queue,
                sentinel,
            )
            if len(new) > copies:
                raise ExtraLedgerRows(f"{len(new)} new ledger rows: {_rows(new)}{self._logged()}")
            done = len(new) == copies and all(row["status"] in TERMINAL for row in new)
            if done and sentinel_status == "succeeded":
                break
            if sentinel_status == "succeeded" and sentinel_done_at is None:
                sentinel_done_at = time.monotonic()
            # One consumer takes the queue in order, and the case was confirmed before the
            # healthy message was published: once that one succeeded, the case was delivered
            # first. Without its row by now (a retry or a parked copy has one), it was dropped.
            lost = (
                len(new) < copies
                and sentinel_done_at is not None
                and time.monotonic() > sentinel_done_at + GRACE
            )
            if lost or time.monotonic() > deadline:
                if len(new) < copies:
                    raise NoLedgerRow(
                        f"{len(new)} new ledger row(s) for {copies} deliveries "
                        f"(waited {time.monotonic() - started:.1f} s; "
                        f"the healthy message after it: {sentinel_status}){self._logged()}"
                    )
                if not done:
                    raise NotTerminal(
                        f"the message's row is not terminal after {BOUND} s: "
                        f"{_rows(new)}{self._logged()}"
                    )
                raise QueueStalled(
                    f"the healthy message published after the case is {sentinel_status} "
                    f"after {BOUND} s{self._logged()}"
                )
            await asyncio.sleep(POLL)
        self.known.update(row["message_id"] for row in new)
        for row in new:
            if row["status"] == "dead" and not row["reason"]:
                raise DeadWithoutReason(f"dead without a reason: {_rows(new)}")
            payload = await self.pool.fetchval(
                "SELECT payload FROM rabbitretry.ledger WHERE queue = $1 AND message_id = $2",
                self.queue,
                row["message_id"],
            )
            if row["status"] == "succeeded" and not self.keeps_payload:
                if payload is not None:  # a succeeded message keeps no snapshot
                    raise BodyNotKept(f"a succeeded row kept {len(payload)} bytes")
            elif payload is None or bytes(payload) != case.body:
                kept = "none" if payload is None else f"{len(payload)} bytes"
                raise BodyNotKept(f"a {row['status']} row keeps {kept}, {len(case.body)} published")
            event(f"{row['status']} {row['reason'] or ''}".strip())
        self._early_signs(outcomes_before)  # (c) once more, after the last write
        self.broken = False

    async def _new_rows(self) -> list[asyncpg.Record]:
        rows = await self.pool.fetch(
            "SELECT message_id, status, reason, error_type, error_message, attempts"
            " FROM rabbitretry.ledger WHERE queue = $1 AND message_id NOT LIKE 'sentinel-%'",
            self.queue,
        )
        return [r for r in rows if r["message_id"] not in self.known]

    def _early_signs(self, outcomes_before: int) -> None:
        assert self.task is not None and self.worker is not None
        if self.task.done():
            error = None if self.task.cancelled() else self.task.exception()
            raise WorkerDied(f"the worker's task ended: {error!r}") from error
        for record in self._log.records:
            if record.name.startswith("rabbitretry") and _text(record).startswith(UNSETTLED_LOG):
                cause = record.exc_info[1] if record.exc_info else None
                raise UnsettledDelivery(
                    f"the worker left a delivery unsettled: {cause!r}{self._logged()}"
                ) from cause
        undecodable = [
            error
            for record in self._log.records
            if record.exc_info and (error := _invalid_frame(record.exc_info[1]))
        ]
        if len(undecodable) >= UNDECODABLE_BEFORE_GIVING_UP:
            raise UndecodableDelivery(
                f"the worker's AMQP connection died {len(undecodable)} times on a frame it "
                f"cannot decode: {undecodable[-1]!r}"
            ) from undecodable[-1]
        requeued = [o for o in self.worker.outcomes[outcomes_before:] if o.result == "requeued"]
        if len(requeued) >= REQUEUES_BEFORE_GIVING_UP:
            causes = [
                arg
                for record in self._log.records
                for arg in (record.args if isinstance(record.args, tuple) else ())
                if isinstance(arg, BaseException)
            ]
            cause = causes[-1] if causes else None
            raise RequeuedForever(
                f"requeued {len(requeued)} times with the services up: {cause!r}{self._logged()}"
            ) from cause

    def _logged(self) -> str:
        lines = [f"  {r.levelname} {r.name}: {r.getMessage()[:300]}" for r in self._log.records[:8]]
        return ("\nworker log:\n" + "\n".join(lines)) if lines else ""


def with_fresh_ids(case: Case) -> Case:
    """The case with every :data:`TOKEN` replaced by a fresh id of the same length."""
    fresh = uuid.uuid4().hex
    assert len(fresh) == len(TOKEN)

    def swap(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace(TOKEN, fresh)
        if isinstance(value, bytes):
            return value.replace(TOKEN.encode(), fresh.encode())
        return value

    message_id = swap(case.message_id)
    if case.client == "aio-pika" and not message_id:
        # aiormq stamps an id on a message without one, drawn from the `random` module that
        # Hypothesis seeds alike for every example: each example would reuse the last one's
        # id. Such a message is not id-less anyway (only pika can send one).
        message_id = fresh
    return dataclasses.replace(
        case,
        message_id=message_id,
        correlation_id=swap(case.correlation_id),
        type=swap(case.type),
    )


def _text(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:  # aio-pika logs objects whose repr can raise
        return str(record.msg)


def _invalid_frame(error: BaseException | None) -> BaseException | None:
    """The frame-decoding error in ``error``'s chain, if any."""
    while error is not None:
        if isinstance(error, aiormq.exceptions.InvalidFrameError):
            return error.__cause__ or error
        error = error.__cause__ or error.__context__
    return None


def _rows(rows: list[asyncpg.Record]) -> str:
    return "; ".join(
        f"{r['message_id']!r} {r['status']} reason={r['reason']!r} attempts={r['attempts']} "
        f"error={r['error_type']}: {(r['error_message'] or '')[:200]!r}"
        for r in rows
    )
