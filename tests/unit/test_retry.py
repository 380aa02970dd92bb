"""RetryPolicy: backoff, jitter, classification of errors and the attempt budget."""

from __future__ import annotations

import random
from typing import Any

import pytest
from pydantic import ValidationError

from rabbitretry.errors import Permanent, Retry
from rabbitretry.retry import MAX_DELAY, Decision, RetryPolicy


class Transient(Exception):
    pass


class Broken(Exception):
    pass


class BrokenTransient(Transient):
    """Both a Transient (retry_on) and, by name in permanent_on, a permanent error."""


# --- backoff ---------------------------------------------------------------------------------


def test_backoff_doubles_from_the_initial_delay() -> None:
    policy = RetryPolicy(initial_delay=1.0, multiplier=2.0, max_delay=1000.0, jitter=0)
    assert [policy.backoff(n) for n in range(1, 8)] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]


def test_backoff_follows_a_custom_multiplier() -> None:
    policy = RetryPolicy(initial_delay=0.5, multiplier=3.0, max_delay=1000.0)
    assert [policy.backoff(n) for n in range(1, 5)] == [0.5, 1.5, 4.5, 13.5]


def test_multiplier_one_gives_a_constant_delay() -> None:
    policy = RetryPolicy(initial_delay=7.0, multiplier=1.0, max_delay=10.0)
    assert {policy.backoff(n) for n in range(1, 50)} == {7.0}


def test_backoff_is_capped_at_max_delay() -> None:
    policy = RetryPolicy(initial_delay=1.0, multiplier=2.0, max_delay=300.0)
    delays = [policy.backoff(n) for n in range(1, 20)]
    assert delays[:9] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0]
    assert delays[9:] == [300.0] * 10
    assert policy.backoff(999) == 300.0


def test_backoff_is_a_float() -> None:
    assert isinstance(RetryPolicy(initial_delay=1, max_delay=10).backoff(1), float)


@pytest.mark.parametrize("attempt", [0, -1])
def test_backoff_counts_attempts_from_one(attempt: int) -> None:
    with pytest.raises(ValueError, match="from 1"):
        RetryPolicy().backoff(attempt)


def test_backoff_stays_finite_and_capped_for_huge_attempt_numbers() -> None:
    policy = RetryPolicy(max_attempts=1000, multiplier=10.0, max_delay=60.0)
    assert policy.backoff(400) == 60.0
    decision = policy.decide(RuntimeError("boom"), 400, random.Random(0))
    assert decision.action == "retry"
    assert 0 < decision.delay <= 60.0
    assert RetryPolicy().backoff(1025) == 300.0


# --- jitter ----------------------------------------------------------------------------------


@pytest.mark.parametrize("jitter", [0.1, 0.2, 0.5, 0.9])
@pytest.mark.parametrize("max_delay", [10.0, 300.0])
def test_jittered_delays_stay_within_bounds(jitter: float, max_delay: float) -> None:
    policy = RetryPolicy(
        max_attempts=20, initial_delay=1.0, multiplier=2.0, max_delay=max_delay, jitter=jitter
    )
    rng = random.Random(1234)
    for attempt in range(1, 15):
        base = policy.backoff(attempt)
        low, high = base * (1 - jitter), min(max_delay, base * (1 + jitter))
        for _ in range(300):
            delay = policy.delay_after(attempt, rng)
            assert low <= delay <= high, (attempt, delay, low, high)


def test_jitter_actually_spreads_the_delays() -> None:
    policy = RetryPolicy(initial_delay=10.0, max_delay=100.0, jitter=0.2)
    rng = random.Random(42)
    delays = [policy.delay_after(1, rng) for _ in range(1000)]
    assert len(set(delays)) > 900
    # Values reach close to both ends of [8, 12] and fall on both sides of the base delay.
    assert min(delays) < 8.2
    assert max(delays) > 11.8
    below = sum(d < 10.0 for d in delays)
    assert 350 < below < 650


def test_jitter_at_the_cap_only_spreads_downwards() -> None:
    policy = RetryPolicy(initial_delay=1.0, max_delay=16.0, jitter=0.5)
    rng = random.Random(7)
    delays = [policy.delay_after(10, rng) for _ in range(500)]
    assert all(8.0 <= d <= 16.0 for d in delays)
    assert max(delays) == 16.0  # draws above the cap are clamped to it
    assert min(delays) < 9.0


def test_the_same_seed_gives_the_same_delays() -> None:
    policy = RetryPolicy(jitter=0.3)
    first = [policy.delay_after(n, random.Random(5)) for n in range(1, 6)]
    second = [policy.delay_after(n, random.Random(5)) for n in range(1, 6)]
    assert first == second


def test_zero_jitter_gives_the_exact_backoff() -> None:
    policy = RetryPolicy(
        max_attempts=20, initial_delay=0.25, multiplier=3.0, max_delay=500.0, jitter=0
    )
    rng = random.Random(99)
    for attempt in range(1, 15):
        for _ in range(20):
            assert policy.delay_after(attempt, rng) == policy.backoff(attempt)
    assert policy.decide(RuntimeError(), 3, rng) == Decision("retry", delay=2.25)


def test_delay_after_without_an_rng_stays_within_bounds() -> None:
    policy = RetryPolicy(initial_delay=4.0, max_delay=100.0, jitter=0.25)
    for _ in range(200):
        assert 3.0 <= policy.delay_after(1) <= 5.0


# --- classification --------------------------------------------------------------------------


def test_permanent_is_dead_even_when_listed_in_retry_on() -> None:
    policy = RetryPolicy(retry_on=(Permanent, Exception))
    assert policy.decide(Permanent("no"), 1) == Decision("dead", reason="permanent-error")
    assert policy.is_retryable(Permanent("no")) is False


def test_permanent_is_dead_on_the_last_attempt_too() -> None:
    policy = RetryPolicy(max_attempts=3)
    assert policy.decide(Permanent("no"), 3).reason == "permanent-error"


def test_retry_is_retried_even_when_not_in_retry_on() -> None:
    policy = RetryPolicy(retry_on=(Transient,), jitter=0, initial_delay=2.0)
    decision = policy.decide(Retry("later"), 1)
    assert decision == Decision("retry", delay=2.0)


def test_retry_is_retried_even_when_in_permanent_on() -> None:
    policy = RetryPolicy(permanent_on=(Retry,), jitter=0, initial_delay=2.0)
    assert policy.decide(Retry("later"), 1).action == "retry"


def test_retry_with_a_delay_uses_that_delay() -> None:
    policy = RetryPolicy(initial_delay=1.0, max_delay=10.0, jitter=0.5)
    assert policy.decide(Retry(delay=3.5), 2, random.Random(0)) == Decision("retry", delay=3.5)
    assert policy.decide(Retry(delay=0), 1) == Decision("retry", delay=0)


def test_retry_with_a_delay_still_counts_against_the_budget() -> None:
    policy = RetryPolicy(max_attempts=2)
    assert policy.decide(Retry(delay=3.5), 2) == Decision("dead", reason="attempts-exhausted")


def test_retry_without_a_delay_uses_the_backoff() -> None:
    policy = RetryPolicy(initial_delay=1.0, max_delay=10.0, jitter=0)
    assert policy.decide(Retry(), 3) == Decision("retry", delay=4.0)


def test_permanent_on_beats_retry_on() -> None:
    policy = RetryPolicy(retry_on=(Transient,), permanent_on=(BrokenTransient,))
    assert policy.decide(BrokenTransient(), 1) == Decision("dead", reason="permanent-error")
    assert policy.decide(Transient(), 1).action == "retry"


def test_permanent_on_matches_subclasses() -> None:
    policy = RetryPolicy(permanent_on=(Transient,))
    assert policy.decide(BrokenTransient(), 1).reason == "permanent-error"
    assert policy.decide(Broken(), 1).action == "retry"


def test_without_retry_on_every_other_error_is_retried() -> None:
    policy = RetryPolicy(permanent_on=(Broken,), jitter=0)
    for error in (RuntimeError(), KeyError("k"), Transient(), TimeoutError(), ValueError()):
        assert policy.decide(error, 1) == Decision("retry", delay=1.0), error
    assert policy.decide(Broken(), 1).action == "dead"


def test_with_retry_on_other_errors_are_dead() -> None:
    policy = RetryPolicy(retry_on=(Transient, TimeoutError))
    assert policy.decide(Transient(), 1).action == "retry"
    assert policy.decide(BrokenTransient(), 1).action == "retry"  # subclass of Transient
    assert policy.decide(TimeoutError(), 1).action == "retry"
    for error in (Broken(), RuntimeError(), ValueError()):
        assert policy.decide(error, 1) == Decision("dead", reason="permanent-error"), error


def test_an_empty_retry_on_retries_nothing_but_retry() -> None:
    policy = RetryPolicy(retry_on=())
    assert policy.decide(RuntimeError(), 1).action == "dead"
    assert policy.decide(Retry(), 1).action == "retry"


# --- attempt budget --------------------------------------------------------------------------


def test_attempts_are_exhausted_exactly_at_max_attempts() -> None:
    policy = RetryPolicy(max_attempts=4, jitter=0)
    actions = [policy.decide(RuntimeError(), n).action for n in range(1, 5)]
    assert actions == ["retry", "retry", "retry", "dead"]
    assert policy.decide(RuntimeError(), 4) == Decision("dead", reason="attempts-exhausted")
    assert policy.decide(RuntimeError(), 5).reason == "attempts-exhausted"


def test_a_single_attempt_policy_never_retries() -> None:
    policy = RetryPolicy(max_attempts=1)
    assert policy.decide(RuntimeError(), 1) == Decision("dead", reason="attempts-exhausted")
    assert policy.decide(Retry(), 1) == Decision("dead", reason="attempts-exhausted")


def test_retry_decisions_carry_no_reason_and_dead_ones_no_delay() -> None:
    policy = RetryPolicy(max_attempts=2)
    retry = policy.decide(RuntimeError(), 1)
    dead = policy.decide(RuntimeError(), 2)
    assert retry.reason == ""
    assert retry.delay > 0
    assert dead.delay == 0.0


# --- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings",
    [
        {"initial_delay": 10.0, "max_delay": 5.0},
        {"jitter": 1.0},
        {"jitter": 1.5},
        {"jitter": -0.1},
        {"max_attempts": 0},
        {"max_attempts": -3},
        {"max_attempts": 1001},
        {"multiplier": 0.5},
        {"max_delay": 0},
        {"initial_delay": -1.0},
        {"immediate_retries": -1},
        {"immediate_retries": 11},
        {"immediate_delay": -0.1},
    ],
)
def test_bad_settings_are_refused(settings: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        RetryPolicy(**settings)  # type: ignore[arg-type]


def test_initial_delay_over_max_delay_names_both_values() -> None:
    with pytest.raises(ValidationError, match=r"initial_delay \(10.0\).*max_delay \(5.0\)"):
        RetryPolicy(initial_delay=10.0, max_delay=5.0)


def test_boundary_settings_are_accepted() -> None:
    policy = RetryPolicy(
        max_attempts=1, initial_delay=5.0, max_delay=5.0, jitter=0.999, multiplier=1.0
    )
    assert policy.backoff(3) == 5.0
    assert RetryPolicy(initial_delay=0, max_delay=1).backoff(5) == 0.0


def test_defaults() -> None:
    policy = RetryPolicy()
    assert (policy.max_attempts, policy.initial_delay, policy.multiplier) == (5, 1.0, 2.0)
    assert (policy.max_delay, policy.jitter) == (300.0, 0.2)
    assert policy.retry_on is None
    assert policy.permanent_on == ()


def test_a_policy_is_frozen() -> None:
    policy = RetryPolicy()
    with pytest.raises(ValidationError):
        policy.max_attempts = 10  # type: ignore[misc]


@pytest.mark.parametrize(
    "delay", [-1, -0.001, float("nan"), float("inf"), float("-inf"), "5", True, None.__class__]
)
def test_retry_refuses_a_delay_that_could_never_be_scheduled(delay: Any) -> None:
    with pytest.raises(ValueError, match=r"^Retry delay must be a finite number of seconds >= 0"):
        Retry(delay=delay)


def test_a_retry_asking_for_more_than_max_delay_waits_max_delay() -> None:
    policy = RetryPolicy(max_attempts=3, max_delay=60.0)
    assert policy.decide(Retry(delay=1e12), 1) == Decision("retry", delay=60.0, capped_from=1e12)
    assert policy.decide(Retry(delay=60), 1) == Decision("retry", delay=60)


@pytest.mark.parametrize(
    ("set_later", "waits"), [(float("nan"), 60.0), (float("inf"), 60.0), (-5.0, 0.0)]
)
def test_a_delay_set_on_the_error_after_it_was_made_is_bounded_too(
    set_later: float, waits: float
) -> None:
    error = Retry(delay=1)
    error.delay = set_later
    decision = RetryPolicy(max_delay=60.0).decide(error, 1)
    assert (decision.action, decision.delay) == ("retry", waits)
    assert decision.capped_from is not None


def test_retry_keeps_its_reason_and_delay() -> None:
    error = Retry("rate limited", delay=2.5)
    assert str(error) == "rate limited"
    assert error.delay == 2.5
    assert Retry().delay is None


# --- the absolute bound on delays -----------------------------------------------------------


def test_the_absolute_bound_fits_the_delay_chain_and_the_retention_window() -> None:
    from rabbitretry.ledger.retention import MIN_WINDOW
    from rabbitretry.topology import delays

    assert MAX_DELAY == 46 * 3600
    # A copy waiting the longest delay allowed leaves the chain once, when due, never early.
    assert delays.ticks(MAX_DELAY) < delays.MAX_TICKS
    assert MAX_DELAY < delays.MAX_DELAY_SECONDS
    assert MIN_WINDOW.total_seconds() > MAX_DELAY  # its row is still there when it returns


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        ({"max_delay": float("inf")}, r"max_delay must be a finite number of seconds, not inf"),
        ({"max_delay": float("nan")}, r"max_delay must be a finite number of seconds, not nan"),
        ({"max_delay": "inf"}, r"max_delay must be a finite number of seconds, not inf"),
        ({"max_delay": -1.0}, r"greater than 0"),
        ({"max_delay": 1e300}, r"max_delay \(1e\+300 s\) is over the bound of 165600 s"),
        ({"max_delay": MAX_DELAY + 1}, r"max_delay \(165601.0 s\) is over the bound"),
        (
            {"initial_delay": float("inf")},
            r"initial_delay must be a finite number of seconds, not inf",
        ),
        (
            {"initial_delay": float("nan")},
            r"initial_delay must be a finite number of seconds, not nan",
        ),
        ({"initial_delay": -0.5}, r"greater than or equal to 0"),
        ({"initial_delay": 1e9, "max_delay": 1e9}, r"initial_delay \(1000000000.0 s\) is over"),
        ({"multiplier": float("inf")}, r"multiplier must be a finite number, not inf"),
        ({"multiplier": float("nan")}, r"multiplier must be a finite number, not nan"),
        ({"immediate_delay": float("inf")}, r"immediate_delay must be a finite number"),
        ({"immediate_delay": 61.0}, r"immediate_delay \(61.0 s\) is over the bound of 60 s"),
    ],
    ids=lambda value: repr(value) if isinstance(value, dict) else "",
)
def test_a_delay_setting_no_chain_can_hold_is_refused_with_its_reason(
    settings: dict[str, Any], reason: str
) -> None:
    with pytest.raises(ValidationError, match=reason):
        RetryPolicy(**settings)


def test_an_absurd_policy_fails_at_class_definition() -> None:
    from rabbitretry import Consumer, Context

    with pytest.raises(ValidationError, match=r"max_delay must be a finite number"):

        class Forever(Consumer[dict[str, Any]]):
            retry = RetryPolicy(max_delay=float("inf"))

            async def handle(self, msg: dict[str, Any], ctx: Context) -> None:
                pass


def test_the_largest_delay_allowed_is_accepted_and_caps_a_retry() -> None:
    policy = RetryPolicy(max_attempts=3, initial_delay=MAX_DELAY, max_delay=MAX_DELAY, jitter=0.5)
    assert policy.backoff(1) == MAX_DELAY
    assert all(
        MAX_DELAY / 2 <= policy.delay_after(1, random.Random(n)) <= MAX_DELAY for n in range(50)
    )
    assert policy.decide(Retry(delay=1e300), 1) == Decision(
        "retry", delay=MAX_DELAY, capped_from=1e300
    )
    assert RetryPolicy(multiplier=1e6, max_attempts=1000, max_delay=MAX_DELAY).backoff(999) == (
        MAX_DELAY
    )
