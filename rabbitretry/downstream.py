"""``Downstream``: a service a handler calls, whose outage must cost nothing.

::

    wms = Downstream("wms", unavailable_on=(httpx.TransportError, WmsUnavailable))

    class ShipOrder(Consumer[Order]):
        queue = "orders.ship"
        downstreams = (wms,)

        async def handle(self, msg: Order, ctx: Context) -> None:
            async with ctx.downstream("wms"):
                await wms_client.ship(msg)

Inside the block, an error of one of the ``unavailable_on`` types becomes
:class:`~rabbitretry.errors.DownstreamUnavailable`, and counts towards the downstream's
breaker, which every worker on the ledger database shares. ``failure_threshold`` failures
within ``failure_window`` seconds, with no success between them, open it: the consumers that
declare it stop taking deliveries (the messages wait on the broker, in order), the attempts
those failures charged are forgiven, and no attempt is charged while it stays open. After
``first_pause`` seconds one worker tries one delivery (the probe); its success closes the
breaker, its failure doubles the pause, up to ``max_pause``. Errors outside the block, or of
other types, keep the consumer's retry policy.

``max_per_second`` and ``max_at_once`` bound the calls of every worker together: a call waits
for its turn at the start of the block (:mod:`rabbitretry.delivery.limits` says how the
workers share the limits).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from rabbitretry.errors import ConfigurationError, DownstreamUnavailable

__all__ = ["Downstream", "DownstreamCalls", "Unbroken", "attributed", "declared"]

MAX_NAME_LENGTH = 200


@dataclass(frozen=True)
class Downstream:
    """A service a handler calls, with its breaker's settings (the defaults are explained in
    docs/downstreams.md)."""

    name: str
    unavailable_on: tuple[type[BaseException], ...] = ()
    """The errors that mean "the service is unavailable" (not "this request is wrong")."""
    failure_threshold: int = 5
    """Failures, with no success between them, that open the breaker."""
    failure_window: float = 30.0
    """Seconds within which those failures must fall (counted from the first)."""
    first_pause: float = 1.0
    """Seconds the breaker stays open before the first probe."""
    max_pause: float = 15.0
    """The pause doubles after each failed probe, up to this."""
    max_per_second: float | None = None
    """At most this many calls a second, by every worker together (None: no limit)."""
    max_at_once: int | None = None
    """At most this many calls at once, by every worker together (None: no limit)."""

    def __post_init__(self) -> None:
        where = f"Downstream({self.name!r})"
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigurationError("a Downstream needs a name, e.g. Downstream('wms')")
        if len(self.name) > MAX_NAME_LENGTH or not self.name.isprintable():
            raise ConfigurationError(
                f"{where}: a name is printable and at most {MAX_NAME_LENGTH} characters"
            )
        if not isinstance(self.unavailable_on, tuple) or not all(
            isinstance(kind, type) and issubclass(kind, BaseException)
            for kind in self.unavailable_on
        ):
            raise ConfigurationError(f"{where}: unavailable_on must be a tuple of exception types")
        if self.failure_threshold < 1:
            raise ConfigurationError(f"{where}: failure_threshold must be at least 1")
        if self.failure_window <= 0:
            raise ConfigurationError(f"{where}: failure_window must be a positive number")
        if self.max_per_second is not None and not self.max_per_second > 0:
            raise ConfigurationError(f"{where}: max_per_second must be a positive number")
        if self.max_at_once is not None and self.max_at_once < 1:
            raise ConfigurationError(f"{where}: max_at_once must be at least 1")
        if not 0 < self.first_pause <= self.max_pause:
            raise ConfigurationError(
                f"{where}: first_pause must be positive and at most max_pause ({self.max_pause})"
            )

    def is_unavailable(self, error: BaseException) -> bool:
        """Whether ``error``, raised by a call to this downstream, means it is unavailable."""
        return isinstance(error, self.unavailable_on)


class DownstreamCalls(Protocol):
    """What ``ctx.downstream(name)`` returns a block of: the worker's breakers, or
    ``rabbitretry.testing``'s stand-in."""

    def call(self, name: str) -> contextlib.AbstractAsyncContextManager[None]: ...


def declared(downstreams: Sequence[Downstream], name: str, consumer: str) -> Downstream:
    """The downstream ``name`` among those a consumer declares (a ConfigurationError if not)."""
    for downstream in downstreams:
        if downstream.name == name:
            return downstream
    raise ConfigurationError(
        f"{consumer} has no downstream named {name!r}: add Downstream({name!r}, ...) to its "
        "`downstreams`"
    )


@contextlib.asynccontextmanager
async def attributed(downstream: Downstream) -> AsyncIterator[None]:
    """The block's errors that mean ``downstream`` is unavailable, raised as
    :class:`DownstreamUnavailable` (the original error is its cause)."""
    try:
        yield
    except DownstreamUnavailable:
        raise
    except Exception as error:
        if not downstream.is_unavailable(error):
            raise
        raise DownstreamUnavailable(downstream.name, f"{type(error).__name__}: {error}") from error


@dataclass(frozen=True)
class Unbroken:
    """Downstream calls without breakers: errors are attributed, nothing is counted (what
    ``rabbitretry.testing`` gives a handler)."""

    downstreams: Sequence[Downstream]
    consumer: str

    def call(self, name: str) -> contextlib.AbstractAsyncContextManager[None]:
        return attributed(declared(self.downstreams, name, self.consumer))
