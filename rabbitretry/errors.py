"""The exceptions rabbitretry raises or understands.

Every one derives from :class:`RabbitRetryError`; those not defined here live where they are
raised, named in parentheses (the tests check that this tree lists every subclass)::

    RabbitRetryError                  root of everything below
    ├── Retry                         raised by a handler: retry this message (optional delay)
    │   └── DownstreamUnavailable     a service the handler calls is down: its breaker counts
    │                                 it; while the breaker is open nothing is charged
    ├── Permanent                     raised by a handler: dead-letter now, never retry
    ├── TransactionRolledBack         a handler returned although its transaction rolled back
    ├── ConfigurationError            a consumer, policy or topology that cannot work
    │   └── MissingMessageId          Publisher.publish() without a message_id: nothing sent
    ├── TopologyError                 the broker's queues do not match what is needed
    ├── ServiceUnavailable            RabbitMQ or Postgres cannot be reached
    │   └── MigrationLocked           a migration could not take its locks: run it again
    │                                 (rabbitretry.ledger.migrations)
    ├── UnpublishableError            a message AMQP cannot carry: never sent, no retry helps
    ├── OperationError                an operator's request that cannot be done: a bad rate,
    │                                 an invalid payload (rabbitretry.operations)
    ├── UserError                     a command called the wrong way: one line, exit code 2
    │                                 (rabbitretry.cli.common)
    ├── RecordNotFound                StateMachine.move() on a record its table does not hold
    │                                 (rabbitretry.callbacks; rabbitretry exports it)
    ├── ConsoleRefused                the console's configuration is unsafe: it does not start
    │                                 (rabbitretry.console)
    ├── AlertNotDelivered             the webhook did not accept an alert
    │                                 (rabbitretry.monitoring.alerts)
    ├── MissingConnection             a unit test's handler used ctx.transaction() without a
    │                                 connection (rabbitretry.testing; also a RuntimeError)
    └── PublishError                  the broker did not confirm a message
        ├── UnroutableError           the broker took it but no queue was bound to receive it
        ├── PublishRefused            the broker refused this message: its exchange does not
        │                             exist, or the user may not write to it
        └── ConnectionLost            the channel or connection failed before the confirm
"""

from __future__ import annotations

import math

__all__ = [
    "ConfigurationError",
    "ConnectionLost",
    "DownstreamUnavailable",
    "MissingMessageId",
    "Permanent",
    "PublishError",
    "PublishRefused",
    "RabbitRetryError",
    "Retry",
    "ServiceUnavailable",
    "TopologyError",
    "TransactionRolledBack",
    "UnpublishableError",
    "UnroutableError",
]


class RabbitRetryError(Exception):
    """Base class of all rabbitretry exceptions."""


class Retry(RabbitRetryError):
    """Raise from a handler to retry the message, optionally after ``delay`` seconds.

    The attempt still counts against the policy's ``max_attempts``, and the delay is capped at
    its ``max_delay``. A delay that is not a finite number of seconds >= 0 is refused here, with
    a ``ValueError``: it could never be scheduled.
    """

    def __init__(self, reason: str = "retry requested", *, delay: float | None = None) -> None:
        super().__init__(reason)
        if delay is not None and not _is_seconds(delay):
            raise ValueError(f"Retry delay must be a finite number of seconds >= 0, not {delay!r}")
        self.delay = delay


class DownstreamUnavailable(Retry):
    """A service the handler calls (a :class:`~rabbitretry.downstream.Downstream`) is
    unavailable.

    ``async with ctx.downstream("wms")`` raises it for the errors the downstream declares
    (``unavailable_on``), and at once, without the call, while its breaker is open; a handler
    may also raise it itself (``raise DownstreamUnavailable("wms", "HTTP 503")``). The failure
    counts towards the shared breaker; once the breaker is open, the attempt is not charged and
    the message waits on the broker until the downstream answers again.
    """

    def __init__(self, downstream: str, detail: str = "") -> None:
        super().__init__(f"{downstream} is unavailable" + (f": {detail}" if detail else ""))
        self.downstream = downstream
        self.call_made = True
        """False when the breaker refused the call (it was open): no failure to count."""


def _is_seconds(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and value >= 0


class Permanent(RabbitRetryError):
    """Raise from a handler when retrying cannot help: the message goes to the dead letters now."""


class TransactionRolledBack(RabbitRetryError):
    """The handler's transaction rolled back, yet the handler returned as if it had succeeded.

    Swallowing the exception that rolled it back would report a success whose effects never
    happened; the attempt fails instead, and is retried.
    """


class ConfigurationError(RabbitRetryError):
    """A consumer class, retry policy or topology file that cannot work as written."""


class MissingMessageId(ConfigurationError, ValueError):
    """``Publisher.publish`` was called without a ``message_id``: nothing was sent."""

    def __init__(self) -> None:
        super().__init__(
            "publish() needs a message_id: the consumer's ledger deduplicates by it, and a "
            "random id would make every copy look new; pass a key of the fact the message "
            'states, the same on every publish of it (message_id=f"order-{order_id}-paid")'
        )


class TopologyError(RabbitRetryError):
    """The broker's exchanges or queues are missing or declared with other arguments."""


class ServiceUnavailable(RabbitRetryError):
    """RabbitMQ or Postgres could not be reached."""


class UnpublishableError(RabbitRetryError):
    """The message cannot be encoded as AMQP (a ``message_id`` over 255 bytes, a header the
    protocol cannot carry): it was not sent. Its content is at fault, not the broker, so
    publishing it again cannot help; the message says what is wrong.

    Not a :class:`PublishError`: callers that retry a failed publish must not retry this.
    """


class PublishError(RabbitRetryError):
    """The broker did not confirm a message: it refused it (nack) or the channel failed."""


class UnroutableError(PublishError):
    """The broker returned a mandatory message: no queue is bound for its routing key."""


class PublishRefused(PublishError):
    """The broker refused this message: its exchange does not exist, or the user may not write
    to it. Nothing was delivered; the same publish fails again until the topology changes."""


class ConnectionLost(PublishError):
    """The channel or connection failed before the broker confirmed: the message may or may
    not have arrived. Publishing it again is safe when consumers deduplicate by message_id."""
