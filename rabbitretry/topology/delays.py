"""The delay chain: how a retry's copy waits inside the broker until it is due.

Pure decisions, no I/O. The chain is shared by every work queue of one queue type
(``classic`` or ``quorum``) and has :data:`LEVELS` levels. Level ``n`` is a topic exchange and
a queue of the same name, ``rabbitretry.delay.<type>.<nn>``, whose messages all share one TTL of
``TICK_MS * 2**n`` ms, so they expire in arrival order and a short wait never queues behind a
long one.

A delay is rounded *up* to whole ticks and written, most significant level first, as one
``0``/``1`` word per level in the copy's routing key, followed by the work queue's name::

    0.0. ... .1.0.0.1.1.0.1.0.points.award      (ticks = 0b1001101 0, level 23 first)

Level ``n``'s exchange routes a key whose word for ``n`` is ``1`` into its queue, and one whose
word is ``0`` straight on to level ``n - 1``'s exchange (an exchange-to-exchange binding). Each
queue dead-letters, on expiry, into level ``n - 1``'s exchange with the routing key unchanged;
level 0 hands over to :data:`DELIVER_EXCHANGE`, where each work queue is bound by ``LEVELS``
``*`` words and its own name, so a copy reaches its own queue and no other. The copy waits
exactly the sum of the levels whose bit is set: it reaches the worker once, when due, and
never early; only a wait past :data:`MAX_DELAY_SECONDS` (about 46 hours) comes back before it
is due, and the ledger's not-due check parks it again for the rest.

This is NServiceBus's delay infrastructure, with a tick of 10 ms instead of 1 s, so that a
retry is at most a tick plus the broker's hops late (measured in docs/benchmarks.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TICK_MS = 10
LEVELS = 24
PREFIX = "rabbitretry.delay"
DELIVER_EXCHANGE = f"{PREFIX}.deliver"
MAX_TICKS = (1 << LEVELS) - 1
MAX_DELAY_SECONDS = MAX_TICKS * TICK_MS / 1000


@dataclass(frozen=True)
class Route:
    """Where to publish a copy so that it reaches ``queue`` after the delay."""

    exchange: str
    routing_key: str


def level_name(queue_type: str, level: int) -> str:
    """The exchange and the queue of one level (they share the name)."""
    return f"{PREFIX}.{queue_type}.{level:02d}"


def level_ttl_ms(level: int) -> int:
    return TICK_MS << level


def next_hop(queue_type: str, level: int) -> str:
    """The exchange a level's queue dead-letters into, and its exchange passes ``0`` on to."""
    return DELIVER_EXCHANGE if level == 0 else level_name(queue_type, level - 1)


def ticks(seconds: float) -> int:
    """The delay in whole ticks, rounded up (never early), within ``[0, MAX_TICKS]``."""
    if not seconds > 0:  # also NaN
        return 0
    if seconds >= MAX_DELAY_SECONDS:
        return MAX_TICKS
    millis = math.ceil(round(seconds * 1000, 6))  # 1.3 s is 1300 ms, not 1300.0000000000002
    return min(-(-millis // TICK_MS), MAX_TICKS)


def route(queue: str, queue_type: str, seconds: float) -> Route:
    """The exchange and routing key that deliver a copy to ``queue`` after ``seconds``.

    The copy enters at the level of its highest set bit (the levels above would only pass it
    on); a copy with no wait goes straight to the deliver exchange.
    """
    count = ticks(seconds)
    bits = ".".join(format(count, f"0{LEVELS}b"))
    exchange = DELIVER_EXCHANGE if count == 0 else level_name(queue_type, count.bit_length() - 1)
    return Route(exchange, f"{bits}.{queue}")


def level_keys(level: int) -> tuple[str, str]:
    """The binding keys of level ``level``'s exchange: (into its queue, on to the next hop)."""
    higher = "*." * (LEVELS - 1 - level)
    return f"{higher}1.#", f"{higher}0.#"


def deliver_key(queue: str) -> str:
    """The deliver exchange's binding key for ``queue``: every level's word, then the name."""
    return "*." * LEVELS + queue
