"""A worker's share of a downstream's rate limits: calls a second, calls at once, turns."""

from __future__ import annotations

import asyncio
import time

import pytest

from rabbitretry.delivery.limits import Limiter, NoTurn


async def starts_of(limiter: Limiter, calls: int, hold: float = 0.0) -> list[float]:
    began = time.monotonic()
    starts: list[float] = []

    async def call() -> None:
        async with limiter.turn(max_wait=10.0):
            starts.append(time.monotonic() - began)
            await asyncio.sleep(hold)

    await asyncio.gather(*(call() for _ in range(calls)))
    return sorted(starts)


async def test_calls_a_second_are_spaced_by_the_rate() -> None:
    starts = await starts_of(Limiter(per_second=50, at_once=None), 11)
    # One every 20 ms: 11 calls take 200 ms, never less.
    assert starts[-1] >= 0.2 - 0.005


async def test_calls_at_once_never_exceed_the_limit() -> None:
    limiter = Limiter(per_second=None, at_once=2)
    running = most = 0

    async def call() -> None:
        nonlocal running, most
        async with limiter.turn(max_wait=5.0):
            running += 1
            most = max(most, running)
            await asyncio.sleep(0.02)
            running -= 1

    await asyncio.gather(*(call() for _ in range(8)))
    assert most == 2
    assert limiter.waits >= 6


async def test_a_worker_takes_its_share_of_the_limits() -> None:
    limiter = Limiter(per_second=100, at_once=5)
    limiter.share(members=2, rank=0)
    starts = await starts_of(limiter, 6)
    assert starts[-1] >= 5 / 50 - 0.005  # half of 100 calls a second
    first, second, third = Limiter(None, 5), Limiter(None, 5), Limiter(None, 5)
    for rank, share in enumerate((first, second, third)):
        share.share(members=3, rank=rank)
    # 5 calls at once over 3 workers: 2, 2 and 1.
    assert [s._slots for s in (first, second, third)] == [2, 2, 1]


async def test_a_call_that_gets_no_turn_in_time_is_not_made() -> None:
    limiter = Limiter(per_second=None, at_once=1)
    ran = []

    async def hold() -> None:
        async with limiter.turn(max_wait=1.0):
            await asyncio.sleep(0.3)

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0.01)
    with pytest.raises(NoTurn, match="busy"):
        async with limiter.turn(max_wait=0.05):
            ran.append(1)
    await holder
    assert ran == []
    async with limiter.turn(max_wait=0.05):  # the slot was given back
        ran.append(2)
    assert ran == [2]


async def test_a_rate_too_slow_for_the_wait_is_refused_at_once() -> None:
    limiter = Limiter(per_second=1, at_once=None)
    async with limiter.turn(max_wait=0.1):
        pass
    # Refused by the schedule (the next start is a second away), without waiting for it.
    with pytest.raises(NoTurn, match="too far"):
        async with limiter.turn(max_wait=0.1):
            pass


async def test_a_worker_with_no_share_of_calls_at_once_makes_none() -> None:
    limiter = Limiter(per_second=None, at_once=1)
    limiter.share(members=2, rank=1)
    with pytest.raises(NoTurn):
        async with limiter.turn(max_wait=0.05):
            pass
