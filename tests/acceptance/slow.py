"""A consumer whose handler outlasts any shutdown, for the signal tests.

``tests.acceptance.slow:Slow``: its queue is ``RR_SLOW_QUEUE`` (each test has its own), and
with ``RR_SLOW_SETUP`` set its ``setup()`` hangs, to catch a signal during start-up. Its handler
takes an hour, or ``RR_SLOW_SECONDS``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from rabbitretry import Consumer, Context


class Slow(Consumer[dict[str, Any]]):
    queue = os.environ.get("RR_SLOW_QUEUE", "rr-acceptance-slow")

    async def setup(self) -> None:
        if os.environ.get("RR_SLOW_SETUP"):
            print("slow setup started", file=sys.stderr, flush=True)
            await asyncio.sleep(3600)

    async def handle(self, msg: dict[str, Any], ctx: Context) -> None:
        print(f"handling {ctx.message_id}", file=sys.stderr, flush=True)
        await asyncio.sleep(float(os.environ.get("RR_SLOW_SECONDS", 3600)))
