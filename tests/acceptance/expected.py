"""A reconciliation the CLI can load by name (``tests.acceptance.expected:two_orders``).

Its queue is ``RR_EXPECTED_QUEUE``, so that each test has its own.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from datetime import datetime

from rabbitretry.reconcile.expected import Expected, reconciliation


@reconciliation(
    queue=os.environ.get("RR_EXPECTED_QUEUE", "rr-acceptance-expected"), lookback=3600, settle=0
)
async def two_orders(start: datetime, end: datetime) -> AsyncIterator[Expected]:
    for order in (1, 2):
        yield Expected(f"order-{order}-paid", {"order_id": order})
