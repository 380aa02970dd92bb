"""A downstream's rate limits, shared by the workers that call it: each takes its share.

``Downstream(max_per_second=N, max_at_once=K)`` bounds the calls of every worker together.
Rather than a database round trip per call, each worker keeps a local limiter and takes a
share of the limits: the workers that call a downstream note themselves in the ledger every
second (``rabbitretry.downstream_member``), and each gives itself ``N / members`` calls a
second and its part of the ``K`` calls at once (the first ``K % members`` workers by name get
one more; with more workers than ``K``, the extra ones get none and leave the calls to the
others). When a worker joins or leaves, the shares move within about a second; until then
the total may be off by one worker's share.

A call waits for its turn inside ``ctx.downstream(name)``, first in line first served. While
it waits its delivery holds what any running attempt holds: its prefetch slot, its claim and
lease (renewed), and nothing else. A call that does not get its turn within ``max_wait`` is
not made: the attempt is deferred (not counted) and the message goes back to the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator


class NoTurn(Exception):
    """No turn came within the wait allowed."""


class Limiter:
    """One worker's share of a downstream's limits."""

    def __init__(self, per_second: float | None, at_once: int | None) -> None:
        self.per_second = per_second
        self.at_once = at_once
        self._rate = per_second
        self._slots = at_once
        self._busy = 0
        self._freed = asyncio.Condition()
        self._next_start = 0.0  # monotonic time of the next free start (the rate's schedule)
        self.waits = 0
        """Calls that had to wait for their turn."""
        self.waited_seconds = 0.0

    def share(self, members: int, rank: int) -> None:
        """Take this worker's share, being ``rank`` (from 0) of ``members`` workers."""
        members = max(1, members)
        if self.per_second is not None:
            self._rate = self.per_second / members
        if self.at_once is not None:
            self._slots = self.at_once // members + (1 if rank < self.at_once % members else 0)

    @contextlib.asynccontextmanager
    async def turn(self, max_wait: float) -> AsyncIterator[None]:
        """Hold a turn for the block; :class:`NoTurn` if none came within ``max_wait`` s."""
        began = time.monotonic()
        deadline = began + max_wait
        await self._take_slot(deadline)
        try:
            await self._wait_for_start(deadline)
            waited = time.monotonic() - began
            if waited > 0.001:
                self.waits += 1
                self.waited_seconds += waited
            yield
        finally:
            await self._free_slot()

    async def _take_slot(self, deadline: float) -> None:
        if self._slots is None:
            return
        async with self._freed:
            try:
                await asyncio.wait_for(
                    self._freed.wait_for(lambda: self._busy < (self._slots or 0)),
                    max(0.0, deadline - time.monotonic()),
                )
            except TimeoutError:
                raise NoTurn(
                    f"all {self._slots} of this worker's calls at once were busy"
                ) from None
            self._busy += 1

    async def _free_slot(self) -> None:
        if self._slots is None:
            return
        async with self._freed:
            self._busy -= 1
            self._freed.notify()

    async def _wait_for_start(self, deadline: float) -> None:
        if self._rate is None:
            return
        now = time.monotonic()
        start = max(now, self._next_start)
        if start > deadline:
            raise NoTurn(f"the next free start under {self._rate:g} calls/s is too far")
        self._next_start = start + 1.0 / self._rate
        if start > now:
            await asyncio.sleep(start - now)
