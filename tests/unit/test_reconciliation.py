"""Pure parts of the reconciler: classification, windows, pacing, validity, job outcomes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from rabbitretry.consumer import Consumer, Context
from rabbitretry.delivery.validity import EXPIRED, is_expired, skip_reason
from rabbitretry.errors import ConfigurationError
from rabbitretry.reconcile.expected import Expected, Reconciliation, classify, reconciliation
from rabbitretry.reconcile.pacing import RateLimiter
from rabbitretry.scheduled_jobs import JobOutcome, job

NOW = datetime(2026, 1, 31, 12, 0, tzinfo=UTC)

# --- classification --------------------------------------------------------------------------


def test_expected_keys_are_sorted_by_ledger_status() -> None:
    statuses = {
        "a": "succeeded",
        "b": "processing",
        "c": "retrying",
        "d": "dead",
        "e": "ignored",
        "f": "skipped",
        "orphan": "succeeded",  # not expected: classification ignores it
    }
    result = classify(["a", "b", "c", "d", "e", "f", "g"], statuses)
    assert result.succeeded == ["a"]
    assert result.in_flight == ["b", "c"]
    assert result.dead == ["d", "e"]
    assert result.skipped == ["f"]
    assert result.missing == ["g"]
    assert result.total == 7


def test_a_key_expected_twice_counts_once() -> None:
    result = classify(["a", "a", "b"], {})
    assert result.missing == ["a", "b"] and result.total == 2


def test_nothing_expected_is_nothing_missing() -> None:
    assert classify([], {"a": "succeeded"}).total == 0


# --- reconciliation definitions --------------------------------------------------------------


async def _none(start: datetime, end: datetime) -> AsyncIterator[Expected]:
    for _ in ():
        yield Expected("never", b"")


def test_the_window_ends_settle_seconds_ago_and_spans_lookback() -> None:
    item = Reconciliation("paid", "orders", _none, lookback=3600, settle=120)
    assert item.window(NOW) == (NOW - timedelta(hours=1), NOW - timedelta(minutes=2))


@pytest.mark.parametrize(("lookback", "settle"), [(60, 60), (60, 120), (60, -1)])
def test_a_window_that_is_empty_or_in_the_future_is_refused(lookback: float, settle: float) -> None:
    with pytest.raises(ValueError, match="settle < lookback"):
        Reconciliation("paid", "orders", _none, lookback=lookback, settle=settle)


def test_the_decorator_names_the_reconciliation_after_its_function() -> None:
    item = reconciliation(queue="orders", lookback=600, settle=0)(_none)
    assert (item.name, item.queue, item.lookback, item.settle) == ("_none", "orders", 600, 0)
    assert reconciliation(queue="orders", name="paid")(_none).name == "paid"


def test_a_reconciliation_needs_a_queue() -> None:
    with pytest.raises(ValueError, match="queue"):
        Reconciliation("paid", "", _none)


# --- pacing ----------------------------------------------------------------------------------


def test_the_rate_limiter_spaces_calls_without_bursts() -> None:
    limiter = RateLimiter(per_second=10)
    assert limiter.delay(100.0) == 0.0
    assert limiter.delay(100.0) == pytest.approx(0.1)
    assert limiter.delay(100.0) == pytest.approx(0.2)
    # After a long quiet spell the next call goes at once, but credit does not pile up.
    assert limiter.delay(200.0) == 0.0
    assert limiter.delay(200.0) == pytest.approx(0.1)


def test_the_rate_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        RateLimiter(0)


# --- business validity -----------------------------------------------------------------------


def test_a_message_expires_only_past_its_age_limit() -> None:
    assert not is_expired(60, NOW - timedelta(seconds=60), NOW)
    assert is_expired(60, NOW - timedelta(seconds=61), NOW)


def test_without_a_limit_or_an_age_nothing_expires() -> None:
    assert not is_expired(None, NOW - timedelta(days=999), NOW)
    assert not is_expired(60, None, NOW)


def test_a_naive_timestamp_is_read_as_utc() -> None:
    assert is_expired(60, (NOW - timedelta(seconds=61)).replace(tzinfo=None), NOW)


class Coupon(Consumer[dict[str, str]]):
    queue = "coupons"
    expires_after = 60.0

    async def should_skip(self, msg: dict[str, str], ctx: Context) -> str | None:
        return "user deleted" if msg.get("user") == "gone" else None

    async def handle(self, msg: dict[str, str], ctx: Context) -> None:
        raise AssertionError("never called here")


CTX = Context(queue="coupons", message_id="m", attempt=1, max_attempts=5, redelivered=False)


async def test_expiry_comes_before_the_consumers_own_check() -> None:
    old = NOW - timedelta(minutes=5)
    assert await skip_reason(Coupon(), {"user": "gone"}, CTX, old, NOW) == EXPIRED
    assert await skip_reason(Coupon(), {"user": "gone"}, CTX, NOW, NOW) == "user deleted"
    assert await skip_reason(Coupon(), {"user": "here"}, CTX, NOW, NOW) is None


def test_expires_after_must_be_positive() -> None:
    with pytest.raises(ConfigurationError, match="expires_after"):

        class Bad(Consumer[dict[str, str]]):
            queue = "bad"
            expires_after = 0.0

            async def handle(self, msg: dict[str, str], ctx: Context) -> None:
                pass


# --- jobs ------------------------------------------------------------------------------------


def test_job_outcomes_say_what_happened() -> None:
    assert "already running" in JobOutcome("nightly", "overlap").message
    assert JobOutcome("nightly", "failed", error="OSError: x").message.endswith("OSError: x")
    assert JobOutcome("nightly", "ran", counts={"rows": 3}).message == "job nightly done: rows 3"


def test_the_job_decorator_names_the_job_and_checks_its_period() -> None:
    async def nightly(ctx: object) -> None:
        return None

    assert job(every=60)(nightly).name == "nightly"
    with pytest.raises(ValueError, match="positive"):
        job(every=0)(nightly)
