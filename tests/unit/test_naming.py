"""Derived queue names, the delay ladder and how a delay is covered by hops along it."""

from __future__ import annotations

import math
import random

import pytest

from rabbitretry.naming import (
    MAX_LADDER_SECONDS,
    choose_rung,
    dead_queue,
    delay_ladder,
    delay_queue,
)


def test_queue_names() -> None:
    assert dead_queue("points.award") == "points.award.dead"
    assert delay_queue("points.award", 16) == "points.award.delay.16s"


@pytest.mark.parametrize(
    ("max_delay", "ladder"),
    [
        (0.01, [1]),
        (0.5, [1]),
        (0, [1]),
        (1, [1]),
        (1.99, [1]),
        (2, [1, 2]),
        (3, [1, 2]),
        (4, [1, 2, 4]),
        (255.9, [1, 2, 4, 8, 16, 32, 64, 128]),
        (256, [1, 2, 4, 8, 16, 32, 64, 128, 256]),
        (300, [1, 2, 4, 8, 16, 32, 64, 128, 256]),
        (3600, [2**n for n in range(12)]),
    ],
)
def test_the_ladder_is_powers_of_two_up_to_max_delay(max_delay: float, ladder: list[int]) -> None:
    assert delay_ladder(max_delay) == ladder


@pytest.mark.parametrize("max_delay", [2**16, 2**16 + 1, 10**6, 10**12, 1e300])
def test_the_ladder_is_capped_at_max_ladder_seconds(max_delay: float) -> None:
    ladder = delay_ladder(max_delay)
    assert ladder[-1] == MAX_LADDER_SECONDS
    assert ladder == [2**n for n in range(17)]


def test_every_rung_is_an_int() -> None:
    assert all(type(rung) is int for rung in delay_ladder(5000.5))


# --- choose_rung -----------------------------------------------------------------------------

LADDER = delay_ladder(300)  # 1 .. 256


@pytest.mark.parametrize(
    ("remaining", "rung"),
    [
        (0.001, 1),
        (0.5, 1),
        (0.999, 1),
        (1, 1),
        (1.5, 1),
        (2, 2),
        (3.99, 2),
        (4, 4),
        (100, 64),
        (255.99, 128),
        (256, 256),
        (10_000, 256),
    ],
)
def test_choose_rung_picks_the_longest_rung_that_fits(remaining: float, rung: int) -> None:
    assert choose_rung(LADDER, remaining) == rung


def test_choose_rung_never_overshoots_unless_less_than_a_second_is_left() -> None:
    rng = random.Random(2024)
    samples = [rng.uniform(0, 600) for _ in range(2000)] + [rng.uniform(0, 1) for _ in range(200)]
    for remaining in samples:
        rung = choose_rung(LADDER, remaining)
        assert rung in LADDER
        if remaining >= 1:
            assert rung <= remaining, remaining
            # and no longer rung would have fitted
            assert all(r <= rung or r > remaining for r in LADDER), remaining
        else:
            assert rung == 1, remaining


def test_choose_rung_works_with_an_unsorted_ladder() -> None:
    assert choose_rung([8, 1, 4, 2], 5) == 4
    assert choose_rung([8, 1, 4, 2], 0.2) == 1


def test_choose_rung_refuses_an_empty_ladder() -> None:
    with pytest.raises(ValueError, match="empty"):
        choose_rung([], 3)


# --- hops ------------------------------------------------------------------------------------


def park(ladder: list[int], delay: float) -> tuple[float, int]:
    """Park a copy repeatedly, as the worker does, until it is due: (time parked, hops)."""
    parked = 0
    hops = 0
    while parked < delay:
        remaining = delay - parked
        rung = choose_rung(ladder, remaining)
        assert rung <= remaining or (remaining < 1 and rung == 1), (delay, remaining, rung)
        parked += rung
        hops += 1
        assert hops < 1000, delay
    return parked, hops


def _delays() -> list[float]:
    rng = random.Random(31337)
    # log-uniform over 0.01 .. 5000 s, plus the awkward values around powers of two
    spread = [10 ** rng.uniform(-2, math.log10(5000)) for _ in range(3000)]
    edges = [0.01, 0.5, 0.999, 1.0, 5000.0]
    for n in range(13):
        edges += [2**n - 0.001, 2**n, 2**n + 0.001, 2 ** (n + 1) - 1, 2**n + 0.5]
    return spread + [d for d in edges if 0.01 <= d <= 5000]


@pytest.mark.parametrize("ladder_for", ["delay", "5000"])
def test_hops_cover_the_delay_without_arriving_early_or_a_second_late(ladder_for: str) -> None:
    fixed = delay_ladder(5000)
    for delay in _delays():
        ladder = delay_ladder(delay) if ladder_for == "delay" else fixed
        parked, hops = park(ladder, delay)
        assert delay <= parked < delay + 1, (delay, parked)
        # a delay under a second still needs one hop
        assert hops <= max(1, math.log2(delay) + 2), (delay, hops)


def test_whole_second_delays_arrive_exactly_on_time() -> None:
    for delay in range(1, 3000):
        parked, hops = park(delay_ladder(delay), delay)
        assert parked == delay
        assert hops == bin(delay).count("1")


def test_delays_beyond_the_ladder_loop_on_the_top_rung() -> None:
    delay = 3 * MAX_LADDER_SECONDS + 0.25
    parked, hops = park(delay_ladder(delay), delay)
    assert delay <= parked < delay + 1
    assert hops == 4  # three top rungs, then one short one for the quarter second
