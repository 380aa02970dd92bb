"""Pacing the reconciler's publishes, so that a recovering downstream is not flooded."""

from __future__ import annotations

import asyncio
import time


class RateLimiter:
    """Spaces calls at least ``1 / per_second`` apart (no bursts: a recovering queue is fragile)."""

    def __init__(self, per_second: float) -> None:
        if per_second <= 0:
            raise ValueError("the publish rate must be positive")
        self.interval = 1.0 / per_second
        self._next = 0.0

    def delay(self, now: float) -> float:
        """Seconds to wait before a call at monotonic time ``now``; books that call."""
        start = max(now, self._next)
        self._next = start + self.interval
        return start - now

    async def wait(self) -> None:
        pause = self.delay(time.monotonic())
        if pause > 0:
            await asyncio.sleep(pause)
