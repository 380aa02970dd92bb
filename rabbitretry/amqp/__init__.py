"""Everything that talks to aio-pika: the only package that imports it (import-linter checks).

- :mod:`~rabbitretry.amqp.connection`: connecting (one URL or a cluster's several, failing over
  between them, with a bounded heartbeat), why a connection could not be made, a lost
  connection said once (the libraries' own lines demoted), and the types aio-pika hands out;
- :mod:`~rabbitretry.amqp.probe`: declarations the broker may refuse (:class:`Prober`);
- :mod:`~rabbitretry.amqp.confirms`: publishing with confirms and ``mandatory``
  (:class:`ConfirmingPublisher`);
- :mod:`~rabbitretry.amqp.frame_size`: whether a message's headers fit in one frame of its
  connection (checked by the publisher before sending);
- :mod:`~rabbitretry.amqp.properties`: the AMQP properties a republished copy keeps;
- :mod:`~rabbitretry.amqp.lenient_frames`: decoding what a foreign producer sends that the
  codec would refuse (installed on import).
"""

from __future__ import annotations

from rabbitretry.amqp import lenient_frames
from rabbitretry.amqp.confirms import ConfirmingPublisher
from rabbitretry.amqp.connection import (
    CHANNEL_ERRORS,
    CONNECT_TIMEOUT,
    HEARTBEAT,
    Channel,
    Connection,
    FailoverConnection,
    IncomingMessage,
    Queue,
    cancelled_by_a_closing_connection,
    connect,
    error_text,
    is_connection_loss_noise,
    is_up,
    node_url,
)
from rabbitretry.amqp.probe import ProbeOutcome, Prober
from rabbitretry.amqp.properties import message_properties

# A foreign message the client cannot decode would close the connection, again on every
# redelivery: decode what can be decoded leniently (rabbitretry/amqp/lenient_frames.py).
lenient_frames.install()

__all__ = [
    "CHANNEL_ERRORS",
    "CONNECT_TIMEOUT",
    "HEARTBEAT",
    "Channel",
    "ConfirmingPublisher",
    "Connection",
    "FailoverConnection",
    "IncomingMessage",
    "ProbeOutcome",
    "Prober",
    "Queue",
    "cancelled_by_a_closing_connection",
    "connect",
    "error_text",
    "is_connection_loss_noise",
    "is_up",
    "message_properties",
    "node_url",
]
