"""A consumer whose handler outlasts any shutdown, for the signal tests.

``tests.acceptance.slow:Slow``: its queue is ``RR_SLOW_QUEUE`` (each test has its own), and
with ``RR_SLOW_SETUP`` set its ``setup()`` hangs, to catch a signal during start-up. Its handler
takes an hour, or ``RR_SLOW_SECONDS``. With ``RR_SLOW_IMPORT`` its module takes that many
seconds to import, to catch a signal before the worker has any handler of its own.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

from rabbitretry import Consumer, Context

if os.environ.get("RR_SLOW_IMPORT"):
    print("slow import started", file=sys.stderr, flush=True)
    time.sleep(float(os.environ["RR_SLOW_IMPORT"]))


class Slow(Consumer[dict[str, Any]]):
    queue = os.environ.get("RR_SLOW_QUEUE", "rr-acceptance-slow")

    async def setup(self) -> None:
        if os.environ.get("RR_SLOW_SETUP"):
            print("slow setup started", file=sys.stderr, flush=True)
            await asyncio.sleep(3600)

    async def handle(self, msg: dict[str, Any], ctx: Context) -> None:
        print(f"handling {ctx.message_id}", file=sys.stderr, flush=True)
        await asyncio.sleep(float(os.environ.get("RR_SLOW_SECONDS", 3600)))
