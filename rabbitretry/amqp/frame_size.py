"""Whether a message's properties and headers fit in one frame of its connection.

AMQP splits a body over as many frames as it needs, but sends a message's properties (its
header table included) in one *content header* frame, which must fit in the ``frame_max`` the
broker set when the connection opened (RabbitMQ's default: 131,072 bytes). RabbitMQ answers a
larger one by closing the whole connection (``FRAME_ERROR ... frame_too_large``), failing every
publish in flight on it as if the broker had gone away. Such a message is at fault, not the
broker: it is refused before it is sent.

The check depends on the connection (its ``frame_max``) and on the encoder (pamqp), so it lives
here rather than with the pure checks of :mod:`rabbitretry.message.wire`.
"""

from __future__ import annotations

from typing import Any

import aio_pika
from pamqp import frame
from pamqp.header import ContentHeader


def frame_max(connection: aio_pika.abc.AbstractConnection) -> int | None:
    """The largest frame the broker accepts on ``connection``, in bytes; None when it is not
    connected (nothing can be sent then) or sets no limit (0)."""
    transport: Any = getattr(connection, "transport", None)
    tune = getattr(getattr(transport, "connection", None), "connection_tune", None)
    limit = getattr(tune, "frame_max", None)
    return limit if isinstance(limit, int) and limit > 0 else None


def why_over_a_frame(message: aio_pika.Message, message_id: str, limit: int | None) -> str | None:
    """Why ``message`` cannot be sent on a connection whose frames hold ``limit`` bytes; None
    if its content header fits (or there is no limit)."""
    if limit is None:
        return None
    header = ContentHeader(properties=message.properties, body_size=message.body_size)
    size = len(frame.marshal(header, 1))
    if size <= limit:
        return None
    return (
        f"message {message_id!r} cannot be published: its properties and headers take {size} "
        f"bytes, more than one frame of this connection holds ({limit} bytes, the frame_max "
        "the broker set); RabbitMQ would close the connection"
    )
