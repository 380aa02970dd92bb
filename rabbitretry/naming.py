"""Names of the queues rabbitretry derives from a work queue, and the delay ladder.

Pure functions, no I/O. For a work queue ``Q``:

* ``Q.dead``           dead letters, no TTL: kept until someone replays or inspects them;
* ``Q.delay.<n>s``     one queue per rung of a binary ladder (1 s, 2 s, 4 s, ...). Every
  message in a rung has the same TTL, so expiry happens in arrival order (no head-of-line
  blocking), and each rung dead-letters through the default exchange back to ``Q`` alone.

A delay of ``d`` seconds is covered by hops: the copy is parked in the longest rung that does
not overshoot the time still remaining; when it comes back early, the worker parks it again
for the rest. A copy therefore never arrives before its due time and at most one short rung
(< 1 s) after it, with at most ``log2(d) + 2`` hops and ``log2(max_delay) + 1`` queues.
"""

from __future__ import annotations

import math

DEAD_SUFFIX = ".dead"
DELAY_INFIX = ".delay."
MAX_LADDER_SECONDS = 2**16  # about 18 hours: longer waits simply loop on the top rung


def dead_queue(queue: str) -> str:
    return f"{queue}{DEAD_SUFFIX}"


def delay_queue(queue: str, seconds: int) -> str:
    return f"{queue}{DELAY_INFIX}{seconds}s"


def delay_ladder(max_delay: float) -> list[int]:
    """The rungs (in seconds) needed to cover delays up to ``max_delay``: 1, 2, 4, ..."""
    top = min(max(max_delay, 1.0), MAX_LADDER_SECONDS)
    return [2**n for n in range(math.floor(math.log2(top)) + 1)]


def choose_rung(ladder: list[int], remaining: float) -> int:
    """The rung to park a copy in when ``remaining`` seconds are left before it is due.

    The longest rung that does not overshoot; when less than the shortest rung is left, the
    shortest one (the only overshoot, bounded by that rung's length).
    """
    if not ladder:
        raise ValueError("the delay ladder is empty")
    fitting = [rung for rung in ladder if rung <= remaining]
    return max(fitting) if fitting else min(ladder)
