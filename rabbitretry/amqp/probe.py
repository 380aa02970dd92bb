"""Declarations the broker may refuse, run on a channel that may be closed by the refusal."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Literal

import aio_pika
import aiormq

from rabbitretry.amqp.connection import (
    CHANNEL_ERRORS,
    Channel,
    Connection,
    cancelled_by_a_closing_connection,
    error_text,
)
from rabbitretry.errors import ServiceUnavailable, TopologyError

ProbeOutcome = Literal["ok", "not-found", "precondition-failed"]

PROBE_TIMEOUT = 30.0
"""Seconds a probe (opening its channel included) may take before the broker is taken for
silent: a :class:`ServiceUnavailable`, like a lost connection."""


class Prober:
    """Runs declarations that the broker may refuse, on a plain (non-robust) channel.

    A 404 or 406 closes the channel it happened on; a robust channel would reopen itself and
    remember the declaration for later restores, so probes use a plain one and open a fresh one
    after each refusal. Any other refusal is a :class:`TopologyError`, a lost connection a
    :class:`ServiceUnavailable`.
    """

    def __init__(self, connection: Connection, *, timeout: float = PROBE_TIMEOUT) -> None:
        self._connection = connection
        self._channel: Channel | None = None
        self._timeout = timeout

    async def channel(self) -> Channel:
        if self._channel is None or self._channel.is_closed:
            await asyncio.wait_for(self._connection.ready(), timeout=30)  # if reconnecting
            channel = aio_pika.Channel(self._connection, publisher_confirms=False)
            await channel.initialize()
            self._channel = channel
        return self._channel

    async def attempt(
        self, action: Callable[[Channel], Awaitable[object]]
    ) -> tuple[ProbeOutcome, str]:
        """Run ``action``: the outcome and, for a refusal, the broker's reply text."""
        try:
            # Bounded as a whole: a broker that keeps the connection but stops answering
            # would hold it until the heartbeat noticed, or for ever with heartbeats off.
            async with asyncio.timeout(self._timeout):
                await action(await self.channel())
        except TimeoutError as error:
            raise ServiceUnavailable(
                f"RabbitMQ did not answer within {self._timeout:g} s"
            ) from error
        except asyncio.CancelledError as error:
            if not cancelled_by_a_closing_connection():
                raise
            raise ServiceUnavailable(
                "lost the connection to RabbitMQ: it closed before the broker answered"
            ) from error
        except aiormq.exceptions.ChannelNotFoundEntity as error:
            return "not-found", str(error)
        except aiormq.exceptions.ChannelPreconditionFailed as error:
            return "precondition-failed", str(error)
        except aiormq.exceptions.ChannelClosed as error:
            raise TopologyError(f"RabbitMQ refused: {error}") from error
        except (*CHANNEL_ERRORS, aiormq.exceptions.ChannelInvalidStateError) as error:
            raise ServiceUnavailable(
                f"lost the connection to RabbitMQ: {error_text(error)}"
            ) from error
        return "ok", ""

    async def close(self) -> None:
        if self._channel is not None and not self._channel.is_closed:
            await self._channel.close()
        self._channel = None

    async def __aenter__(self) -> Prober:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()
