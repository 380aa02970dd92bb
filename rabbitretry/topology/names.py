"""Names of the queues rabbitretry derives from a work queue.

Pure functions, no I/O. For a work queue ``Q``, ``Q.dead`` holds its dead letters, with no
TTL: kept until someone replays or inspects them. Retries wait in the delay chain shared by
every work queue of one queue type (:mod:`rabbitretry.topology.delays`).
"""

from __future__ import annotations

DEAD_SUFFIX = ".dead"


def dead_queue(queue: str) -> str:
    return f"{queue}{DEAD_SUFFIX}"


RECOVER_SUFFIX = ".recover"


def recover_queue(queue: str) -> str:
    """Where the recover hook runs of ``queue``'s dead messages wait (``Consumer.on_dead``)."""
    return f"{queue}{RECOVER_SUFFIX}"
