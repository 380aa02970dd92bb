"""The consumer of :mod:`bench.supervised`, run by ``rabbitretry run --processes``.

Its queue is ``RABBITRETRY_BENCH_QUEUE``; it does nothing, as the other variants' handlers do.
"""

from __future__ import annotations

import os
from typing import Any

from rabbitretry import Consumer, Context


class Noop(Consumer[dict[str, Any]]):
    queue = os.environ.get("RABBITRETRY_BENCH_QUEUE", "bench-noop")

    async def handle(self, msg: dict[str, Any], ctx: Context) -> None:
        pass
