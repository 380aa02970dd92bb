"""The worker's side of the downstream breakers: its view of their shared state, and the
blocks a handler runs its calls in (``ctx.downstream(name)``).

The state lives in the ledger database (:mod:`rabbitretry.ledger.downstreams`), so every
worker sees one breaker. A worker refreshes its view every :data:`POLL` seconds, and at once
from the answer of each failure it counts. A call costs no database work while its breaker is
closed and healthy: only a failure is written (by the pipeline, once per attempt, after the
attempt's verdict), and the first success after failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from rabbitretry.db import Pool, answering, is_outage
from rabbitretry.delivery.limits import Limiter, NoTurn
from rabbitretry.downstream import Downstream, declared
from rabbitretry.errors import DownstreamUnavailable
from rabbitretry.ledger import Key
from rabbitretry.ledger import downstreams as rows
from rabbitretry.ledger.downstreams import State, View

log = logging.getLogger("rabbitretry.worker")

POLL = 1.0  # seconds between two refreshes of a worker's view of the shared state
MEMBER_FOR = 3 * POLL  # a worker not seen for this long no longer has a share of a limit


class Breakers:
    """One worker's view of the breakers of the downstreams its consumers declare, in one
    ledger database."""

    def __init__(self, pool: Pool, worker: str, downstreams: Sequence[Downstream]) -> None:
        self.pool = pool
        self.worker = worker
        self.downstreams = {d.name: d for d in downstreams}
        self.limiters = {
            d.name: Limiter(d.max_per_second, d.max_at_once)
            for d in self.downstreams.values()
            if d.max_per_second is not None or d.max_at_once is not None
        }
        """The local share of each rate-limited downstream's limits."""
        self._views: dict[str, View] = {}
        self.changed = asyncio.Event()
        """Set when a breaker's state changes in this view (the watcher clears it)."""

    def state(self, name: str) -> State:
        view = self._views.get(name)
        return "closed" if view is None else view.state

    def view(self, name: str) -> View | None:
        return self._views.get(name)

    def admits(self, names: Sequence[str], probe: str | None = None) -> bool:
        """Whether a delivery that may call ``names`` may be taken (the probe's downstream
        counts as closed for its probe)."""
        return all(name == probe or self.state(name) == "closed" for name in names)

    async def declare(self, names: Sequence[str], queue: str) -> None:
        """Record, for operators and alerts, that ``queue``'s handlers call ``names``."""
        if not names:
            return
        try:
            async with answering(self.pool) as conn:
                await rows.declare(conn, names, queue)
        except Exception as error:
            if not is_outage(error):
                raise
            log.warning("%s: its downstreams could not be recorded (%s)", queue, error)

    async def refresh(self) -> None:
        """Read the shared state of every downstream this worker calls."""
        if not self.downstreams:
            return
        async with answering(self.pool) as conn:
            views = await rows.views(conn, list(self.downstreams))
            for name in self.downstreams:
                self._see(name, views.get(name))
            if self.limiters:  # a write: a read-only ledger keeps the shares as they were
                shares = await rows.members(conn, list(self.limiters), self.worker, MEMBER_FOR)
                for name, (members, rank) in shares.items():
                    self.limiters[name].share(members, rank)

    def _see(self, name: str, view: View | None) -> None:
        before = self.state(name)
        if view is None:
            self._views.pop(name, None)
        else:
            self._views[name] = view
        if self.state(name) != before:
            self.changed.set()
            if self.state(name) == "closed":
                log.warning("downstream %s answers again: its breaker is closed", name)

    def calls(
        self,
        downstreams: Sequence[Downstream],
        consumer: str,
        max_wait: float,
        probe: str | None = None,
    ) -> BreakerCalls:
        return BreakerCalls(self, downstreams, consumer, max_wait, probe)

    async def count_failure(self, error: DownstreamUnavailable, key: Key, attempt: int) -> State:
        """Count a failure of ``error.downstream`` met by ``attempt`` of ``key``; the breaker's
        state after it. A ledger that cannot be reached leaves the view as it was: the
        attempt's own write meets the same outage."""
        downstream = self.downstreams[error.downstream]
        try:
            async with answering(self.pool) as conn:
                failed = await rows.failed(
                    conn, downstream, self.worker, str(error)[:500], key, attempt
                )
        except Exception as write_error:
            log.warning("downstream %s: its failure was not counted: %r", error, write_error)
            return self.state(downstream.name)
        view = self._views.get(downstream.name)
        self._see(
            downstream.name,
            View(failed.state, failed.failures, None, view.probe_due if view else False),
        )
        if failed.opened:
            log.error(
                "downstream %s is unavailable (%d failures, the last: %s): its breaker is open; "
                "its consumers pause, %d charged attempt(s) forgiven",
                downstream.name,
                failed.failures,
                error,
                failed.forgiven,
            )
        return failed.state

    async def count_success(self, name: str) -> None:
        """A call succeeded: written only when it matters (failures to forget, or the probe
        that closes the breaker)."""
        view = self._views.get(name)
        if view is None or (view.state == "closed" and view.failures == 0):
            return
        try:
            async with answering(self.pool) as conn:
                state = await rows.succeeded(conn, name, self.worker)
        except Exception as write_error:
            log.warning("downstream %s: a success was not recorded: %r", name, write_error)
            return
        self._see(name, View(state, 0, None, False))

    async def take_probe(self, name: str, hold: float) -> bool:
        async with answering(self.pool) as conn:
            taken = await rows.take_probe(conn, name, self.worker, hold)
        if taken:
            self._see(name, View("half-open", 0, self.worker, False))
            log.info("downstream %s: probing with one delivery", name)
        return taken

    async def return_probe(self, name: str) -> None:
        """The probe tried nothing: the breaker is open again, the next probe due soon."""
        if self.state(name) != "half-open":
            return
        async with answering(self.pool) as conn:
            await rows.return_probe(conn, name, self.worker, self.downstreams[name].first_pause)
        self._see(name, View("open", 0, None, False))


@dataclass(frozen=True)
class BreakerCalls:
    """The blocks of one delivery's handler (``ctx.downstream(name)``)."""

    breakers: Breakers
    downstreams: Sequence[Downstream]
    consumer: str
    max_wait: float
    """Seconds a call may wait for its turn under a rate limit before it is not made."""
    probe: str | None = None
    """The downstream this delivery probes, if it is a probe."""

    def call(self, name: str) -> contextlib.AbstractAsyncContextManager[None]:
        return _Call(self, declared(self.downstreams, name, self.consumer))


class _Call:
    """One ``ctx.downstream(name)`` block: refused while the breaker is open (unless it is the
    probe), waiting for its turn under a rate limit, its errors attributed, its success told to
    the breaker. A plain class rather than a generator: it runs around every call."""

    def __init__(self, calls: BreakerCalls, downstream: Downstream) -> None:
        self._calls = calls
        self._downstream = downstream
        self._turn: contextlib.AbstractAsyncContextManager[None] | None = None

    async def __aenter__(self) -> None:
        name = self._downstream.name
        breakers = self._calls.breakers
        state = breakers.state(name)
        if state != "closed" and name != self._calls.probe:
            raise _not_made(name, f"its breaker is {state}; the call was not made")
        limiter = breakers.limiters.get(name)
        if limiter is not None:
            turn = limiter.turn(self._calls.max_wait)
            try:
                await turn.__aenter__()
            except NoTurn as no_turn:
                raise _not_made(
                    name,
                    f"no turn under its rate limit within {self._calls.max_wait:g} s ({no_turn})",
                ) from None
            self._turn = turn

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._turn is not None:
            await self._turn.__aexit__(None, None, None)
        if error is None:
            await self._calls.breakers.count_success(self._downstream.name)
            return
        if (
            isinstance(error, Exception)
            and not isinstance(error, DownstreamUnavailable)
            and self._downstream.is_unavailable(error)
        ):
            raise DownstreamUnavailable(
                self._downstream.name, f"{type(error).__name__}: {error}"
            ) from error


def _not_made(name: str, why: str) -> DownstreamUnavailable:
    """The error of a call that was not made: nothing to count, the attempt is deferred."""
    error = DownstreamUnavailable(name, why)
    error.call_made = False
    return error
