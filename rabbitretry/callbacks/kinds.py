"""``CallbackKind``: one route of the receiver, declared next to the consumer that handles it.

::

    payment_callbacks = CallbackKind(
        name="payment",                      # POST /payment
        model=GatewayEvent,                  # what a valid body is
        consumer=SettlePayment,              # whose queue the event goes to
        message_id=lambda e: f"payment-{e.transaction_id}-{e.type}",
        signature=HmacSignature(secret=os.environ["GATEWAY_SECRET"]),
    )

The pure decisions about one request live here: is the body a valid event, and what is its
message id. The receiver (:mod:`rabbitretry.callbacks.receiver`) does the I/O.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from rabbitretry.callbacks.signatures import HmacSignature
from rabbitretry.consumer import Consumer
from rabbitretry.errors import ConfigurationError

# AMQP carries a message_id as a short string (at most 255 bytes), and PostgreSQL text
# cannot hold a NUL: an id outside these bounds could be stored but never relayed.
MAX_MESSAGE_ID_BYTES = 255
INVALID_PREFIX = "invalid-callback:"
_ROUTE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class CallbackKind:
    """A kind of callback: its route, its body's model, its message id and its sender check.

    ``name``            the route: ``POST /{name}`` (letters, digits, ``.``, ``_``, ``-``)
    ``model``           the pydantic type a body must validate into (JSON)
    ``consumer``        the :class:`Consumer` whose queue receives the event (or ``queue``)
    ``message_id``      the event → its business key: the same on every retry of the same
                        callback (a gateway's transaction id plus the event type), so that the
                        retries are one message
    ``signature``       how the sender proves itself (None: anyone may post; only behind a
                        gateway that checks senders itself)
    ``max_body_bytes``  larger bodies are refused with 413, unread
    """

    name: str
    model: Any
    message_id: Callable[[Any], str]
    consumer: type[Consumer[Any]] | None = None
    queue: str | None = None
    signature: HmacSignature | None = None
    max_body_bytes: int = 64 * 1024
    adapter: TypeAdapter[Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not _ROUTE_NAME.match(self.name):
            raise ConfigurationError(
                f"callback kind {self.name!r}: a name is letters, digits, '.', '_' or '-'"
            )
        if (self.consumer is None) == (self.queue is None):
            raise ConfigurationError(
                f"callback kind {self.name!r}: name either its consumer or its queue"
            )
        if self.max_body_bytes < 1:
            raise ConfigurationError(f"callback kind {self.name!r}: max_body_bytes must be > 0")
        object.__setattr__(self, "adapter", TypeAdapter(self.model))

    @property
    def target_queue(self) -> str:
        """The work queue the events are published to (through the default exchange)."""
        if self.consumer is not None:
            return self.consumer.queue
        assert self.queue is not None
        return self.queue

    def parse(self, body: bytes) -> Any:
        """The body validated into the model (raises ``pydantic.ValidationError``)."""
        return self.adapter.validate_json(body)

    def key_of(self, event: Any) -> str:
        """The event's message id, checked (raises ``ValueError`` saying what is wrong)."""
        message_id = self.message_id(event)
        if not isinstance(message_id, str) or not message_id:
            raise ValueError(f"the message id of this event is {message_id!r}, not a text")
        if "\x00" in message_id or len(message_id.encode()) > MAX_MESSAGE_ID_BYTES:
            raise ValueError(
                f"the message id {message_id[:60]!r}… cannot be carried: it holds a NUL or is "
                f"longer than {MAX_MESSAGE_ID_BYTES} bytes"
            )
        return message_id


def invalid_key(kind: str, body: bytes) -> str:
    """The dead letter's key for a body that was refused: the same body gives the same key,
    so a gateway's retries of one bad request are one dead letter, not one per try."""
    return f"{INVALID_PREFIX}{kind}:{hashlib.sha256(body).hexdigest()[:32]}"


def reasons(error: ValidationError | ValueError) -> list[str]:
    """What is wrong with a body, one line per problem, for the 400 answer and the dead letter."""
    if isinstance(error, ValidationError):
        return [
            f"{'.'.join(map(str, item['loc'])) or 'body'}: {item['msg']}"
            for item in error.errors(include_url=False, include_input=False)
        ]
    return [str(error)]
