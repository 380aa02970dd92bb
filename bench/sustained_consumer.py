"""The consumer of :mod:`bench.sustained`, run by ``rabbitretry run`` in a process of its own.

Its queue is ``RABBITRETRY_SUSTAINED_QUEUE``. A message's fate is in its ``message_id``
(``ok-...``, ``retry-...``, ``dead-...``): a ``retry`` one fails its first attempt and succeeds
after a 2 s retry, a ``dead`` one is refused for good, the rest succeed at once.
"""

from __future__ import annotations

import os
from typing import Any

from rabbitretry import Consumer, Context, Permanent, Retry, RetryPolicy


class Sustained(Consumer[dict[str, Any]]):
    queue = os.environ.get("RABBITRETRY_SUSTAINED_QUEUE", "bench-sustained")
    retry = RetryPolicy(max_attempts=3, initial_delay=2.0, jitter=0.0)

    async def handle(self, msg: dict[str, Any], ctx: Context) -> None:
        if ctx.message_id.startswith("dead-"):
            raise Permanent("refused for good, as one message in a hundred is")
        if ctx.message_id.startswith("retry-") and ctx.attempt == 1:
            raise Retry("failed once, as one message in twenty-five does", delay=2.0)
