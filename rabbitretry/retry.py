"""Retry policy: how many attempts, how long to wait between them, which errors are worth it.

Pure decisions, no I/O: the worker asks :meth:`RetryPolicy.decide` what to do after a failed
attempt and carries the answer out.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from rabbitretry.errors import Permanent, Retry

ExceptionTypes = tuple[type[BaseException], ...]

MAX_DELAY = 46 * 3600.0
"""The longest delay any policy may set, in seconds (46 hours), whatever its ``max_delay``.

A retry's copy waits in the delay chain, whose longest park is about 46.6 hours
(``topology.delays.MAX_DELAY_SECONDS``): a delay within this bound leaves the chain once, when
due. ``ledger prune``'s shortest window (3 days) outlasts it, so a copy always finds its row."""

MAX_IMMEDIATE_DELAY = 60.0
"""The longest in-process pause between immediate retries: a longer wait holds a consumer slot
and belongs in the delay chain (``initial_delay``)."""

_BOUNDS = {
    "initial_delay": MAX_DELAY,
    "max_delay": MAX_DELAY,
    "immediate_delay": MAX_IMMEDIATE_DELAY,
    "multiplier": math.inf,
}


@dataclass(frozen=True)
class Decision:
    """What to do after a failed attempt: retry after ``delay`` seconds, or dead-letter."""

    action: Literal["retry", "dead"]
    delay: float = 0.0
    reason: str = ""
    capped_from: float | None = None
    """The delay a :class:`Retry` asked for, when it was over ``max_delay`` (for the log)."""


class RetryPolicy(BaseModel):
    """Exponential backoff with jitter, bounded by ``max_attempts`` and ``max_delay``.

    The delay before attempt ``n + 1`` is ``initial_delay * multiplier ** (n - 1)``, capped at
    ``max_delay``, then spread by ``± jitter`` (a fraction) and capped again, so that a burst
    of failures does not come back as a burst.

    Classification, first match wins: :class:`Permanent` → dead; :class:`Retry` → retry (with
    its own delay if it gives one); an instance of ``permanent_on`` → dead; with ``retry_on``
    unset every other exception is retried, otherwise only instances of ``retry_on`` are.

    ``initial_delay`` and ``max_delay`` are finite and at most :data:`MAX_DELAY` (46 hours, what
    the delay chain holds), ``immediate_delay`` at most :data:`MAX_IMMEDIATE_DELAY`: a policy
    outside those bounds is refused where it is made, with the reason.

    ``immediate_retries`` re-runs the handler in-process that many times (``immediate_delay``
    apart) before the attempt counts as failed: cheap cover for blips such as a dropped
    connection, without a trip through the broker.
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    max_attempts: int = Field(default=5, ge=1, le=1000)
    initial_delay: float = Field(default=1.0, ge=0)
    multiplier: float = Field(default=2.0, ge=1.0)
    max_delay: float = Field(default=300.0, gt=0)
    jitter: float = Field(default=0.2, ge=0, lt=1)
    retry_on: ExceptionTypes | None = None
    permanent_on: ExceptionTypes = ()
    immediate_retries: int = Field(default=0, ge=0, le=10)
    immediate_delay: float = Field(default=0.05, ge=0)

    @field_validator(*_BOUNDS, mode="before")
    @classmethod
    def _finite(cls, value: object, info: ValidationInfo) -> object:
        """NaN and infinity are refused first, with a reason (NaN fails every comparison)."""
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(_not_finite(info.field_name, value))
        return value

    @field_validator(*_BOUNDS)
    @classmethod
    def _bounded(cls, value: float, info: ValidationInfo) -> float:
        name = info.field_name or ""
        if not math.isfinite(value):  # a text such as "inf", parsed
            raise ValueError(_not_finite(name, value))
        if value > _BOUNDS[name]:
            raise ValueError(
                f"{name} ({value} s) is over the bound of {_BOUNDS[name]:.0f} s"
                + (
                    " (46 hours, rabbitretry.retry.MAX_DELAY): the delay chain holds no longer wait"
                    if _BOUNDS[name] == MAX_DELAY
                    else ": a longer pause belongs in the delay chain (initial_delay)"
                )
            )
        return value

    @model_validator(mode="after")
    def _delays_consistent(self) -> RetryPolicy:
        if self.initial_delay > self.max_delay:
            raise ValueError(
                f"initial_delay ({self.initial_delay}) is larger than max_delay ({self.max_delay})"
            )
        return self

    def backoff(self, attempt: int) -> float:
        """The delay before the attempt after ``attempt`` (1-based), before jitter."""
        if attempt < 1:
            raise ValueError("attempts are counted from 1")
        if self.initial_delay == 0:
            return 0.0
        if self.multiplier > 1:
            # Compare exponents first: multiplier ** (attempt - 1) overflows a float long
            # before attempt counts stop being plausible.
            reaches_cap = math.log(self.max_delay / self.initial_delay) / math.log(self.multiplier)
            if attempt - 1 >= reaches_cap:
                return self.max_delay
        return min(self.max_delay, self.initial_delay * self.multiplier ** (attempt - 1))

    def delay_after(self, attempt: int, rng: random.Random | None = None) -> float:
        """The jittered delay before the next attempt, within ``[0, max_delay]``."""
        base = self.backoff(attempt)
        spread = (rng or random).uniform(1 - self.jitter, 1 + self.jitter)
        return min(self.max_delay, base * spread)

    def is_retryable(self, error: BaseException) -> bool:
        if isinstance(error, Permanent):
            return False
        if isinstance(error, Retry):
            return True
        if self.permanent_on and isinstance(error, self.permanent_on):
            return False
        return self.retry_on is None or isinstance(error, self.retry_on)

    def decide(
        self, error: BaseException, attempt: int, rng: random.Random | None = None
    ) -> Decision:
        """What to do after ``attempt`` (1-based, within this budget) failed with ``error``."""
        if not self.is_retryable(error):
            return Decision("dead", reason="permanent-error")
        if attempt >= self.max_attempts:
            return Decision("dead", reason="attempts-exhausted")
        if isinstance(error, Retry) and error.delay is not None:
            return self._asked_for(error.delay)
        return Decision("retry", delay=self.delay_after(attempt, rng))

    def _asked_for(self, delay: float) -> Decision:
        """A handler's own delay, within ``[0, max_delay]`` (whatever was set on the error)."""
        if math.isfinite(delay) and 0 <= delay <= self.max_delay:
            return Decision("retry", delay=delay)
        if math.isfinite(delay) and delay < 0:
            return Decision("retry", delay=0.0, capped_from=delay)
        return Decision("retry", delay=self.max_delay, capped_from=delay)


def _not_finite(name: str | None, value: object) -> str:
    unit = "" if name == "multiplier" else " of seconds"
    return f"{name} must be a finite number{unit}, not {value!r}"
