"""The transactional outbox: enqueue a message in your own transaction, a relay publishes it.

::

    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("UPDATE orders SET paid = true WHERE id = $1", order_id)
        await outbox.enqueue(conn, "orders", OrderPaid(...), routing_key="order.paid",
                             message_id=f"order-{order_id}-paid")

The row commits with the business write or not at all: a paid order without its message, or
a message for an order that was rolled back, cannot happen. The relay publishes pending rows
with confirms and marks them ``sent`` only after the broker confirmed; a relay that dies in
between publishes the row again, and the consumer's ledger drops the duplicate by its
``message_id``. Several relays can run: each takes rows with ``FOR UPDATE SKIP LOCKED``.

Ordering: rows that share an ``ordering_key`` are published in the order they were enqueued,
each once the broker confirmed the one before it (a row waits while an older row of its key
is pending; a row that ends ``failed`` stops holding the others back). A relay takes a key's
pending rows as a run, up to its batch, so a key with a backlog leaves a batch a poll. Rows
without a key have no order among themselves.

A row whose message AMQP cannot carry (a ``message_id`` over 255 bytes, a header integer
beyond 64 bits, an infinite number...) is never sent: it ends ``failed`` at once with the
reason in ``last_error``, and the rest of its batch goes on as if it were not there.
"""

from rabbitretry.outbox.enqueue import Outbox
from rabbitretry.outbox.relay import OutboxRelay, RelayStats
from rabbitretry.outbox.rows import (
    fail_unpublishable,
    failed_try,
    publish_row,
    publish_run,
    take_runs,
)
from rabbitretry.outbox.scan import ScanFloor

__all__ = [
    "Outbox",
    "OutboxRelay",
    "RelayStats",
    "ScanFloor",
    "fail_unpublishable",
    "failed_try",
    "publish_row",
    "publish_run",
    "take_runs",
]
