"""A consumer the CLI can import by name (``tests.acceptance.models:Orders``) for its model."""

from __future__ import annotations

from rabbitretry import Consumer, Context
from tests.integration.dead_harness import Order


class Orders(Consumer[Order]):
    queue = "rr-acceptance-orders"

    async def handle(self, msg: Order, ctx: Context) -> None:
        """Never run: the CLI only reads the payload model."""
