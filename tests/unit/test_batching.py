"""Commit groups: lone writes go at once, concurrent ones share a statement, failures stay own."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from rabbitretry.ledger.commits import CommitGroup, Lane


class FakeConn:
    def __init__(self) -> None:
        self.closed = False

    def is_closed(self) -> bool:
        return self.closed


class FakePool:
    """Hands out fake connections and counts acquisitions."""

    def __init__(self) -> None:
        self.acquired = 0
        self.releasing = asyncio.Event()

    @contextlib.asynccontextmanager
    async def acquire(self, timeout: float | None = None) -> AsyncIterator[str]:
        self.acquired += 1
        self.conn = FakeConn()
        yield self.conn
        self.releasing.set()
        await asyncio.sleep(0.01)  # a real pool resets the connection: a round trip


class Recorder:
    """Group and single writes that double numbers; negative numbers are refused."""

    def __init__(self) -> None:
        self.groups: list[list[int]] = []
        self.singles: list[int] = []
        self.release = asyncio.Event()
        self.release.set()

    async def run_group(self, conn: Any, requests: Sequence[int]) -> list[int]:
        assert isinstance(conn, FakeConn) and not conn.closed
        self.groups.append(list(requests))
        await self.release.wait()
        if any(r < 0 for r in requests):
            raise ValueError("a negative number in the group")
        return [2 * r for r in requests]

    async def run_one(self, conn: Any, request: int) -> int:
        assert isinstance(conn, FakeConn) and not conn.closed
        self.singles.append(request)
        await self.release.wait()
        if request < 0:
            raise ValueError(f"negative: {request}")
        return 2 * request


class BrokenPool:
    """A pool whose database is down: it cannot give a connection."""

    @contextlib.asynccontextmanager
    async def acquire(self, timeout: float | None = None) -> AsyncIterator[str]:
        raise OSError("database is down")
        yield "never"


def group_of(
    recorder: Recorder, pool: FakePool, max_group: int = 256, writers: int = 1
) -> CommitGroup[int, int]:
    return CommitGroup(
        Lane(pool, writers),  # type: ignore[arg-type]
        recorder.run_group,
        recorder.run_one,
        max_group,
    )


async def test_a_lone_write_goes_out_at_once_on_its_own() -> None:
    recorder, pool = Recorder(), FakePool()
    group = group_of(recorder, pool)
    assert await group.submit(21) == 42
    assert recorder.singles == [21]
    assert recorder.groups == []


async def test_writes_arriving_during_a_write_share_the_next_statement() -> None:
    recorder, pool = Recorder(), FakePool()
    group = group_of(recorder, pool)
    recorder.release.clear()
    first = asyncio.create_task(group.submit(1))
    await asyncio.sleep(0)  # the first write is on its way
    others = [asyncio.create_task(group.submit(n)) for n in (2, 3, 4)]
    await asyncio.sleep(0)
    recorder.release.set()
    assert await first == 2
    assert [await t for t in others] == [4, 6, 8]
    assert recorder.singles == [1]
    assert recorder.groups == [[2, 3, 4]]
    assert pool.acquired == 1  # one connection for the whole burst


async def test_a_write_arriving_while_the_connection_is_handed_back_is_not_forgotten() -> None:
    recorder, pool = Recorder(), FakePool()
    group = group_of(recorder, pool)
    first = asyncio.create_task(group.submit(1))
    await pool.releasing.wait()
    assert await asyncio.wait_for(group.submit(2), 1) == 4
    assert await first == 2


async def test_the_connection_is_kept_between_writes_and_replaced_once_it_breaks() -> None:
    recorder, pool = Recorder(), FakePool()
    group = group_of(recorder, pool)
    assert await group.submit(1) == 2
    assert await group.submit(2) == 4  # within the linger: same connection
    assert pool.acquired == 1
    pool.conn.closed = True
    assert await group.submit(3) == 6
    assert pool.acquired == 2


async def test_a_second_writer_takes_what_arrives_while_the_first_is_busy_and_no_third() -> None:
    recorder, pool = Recorder(), FakePool()
    group = group_of(recorder, pool, writers=2)
    recorder.release.clear()
    first = asyncio.create_task(group.submit(1))
    await asyncio.sleep(0)
    second = [asyncio.create_task(group.submit(n)) for n in (2, 3, 4)]
    await asyncio.sleep(0)
    third = [asyncio.create_task(group.submit(n)) for n in (5, 6)]
    await asyncio.sleep(0)
    assert recorder.singles == [1]
    assert recorder.groups == [[2, 3, 4]]  # 5 and 6 wait: both writers are busy
    recorder.release.set()
    assert [await t for t in [first, *second, *third]] == [2, 4, 6, 8, 10, 12]
    assert recorder.groups == [[2, 3, 4], [5, 6]]
    assert pool.acquired == 2


async def test_groups_are_bounded() -> None:
    recorder, pool = Recorder(), FakePool()
    group = group_of(recorder, pool, max_group=2)
    results = await asyncio.gather(*(group.submit(n) for n in range(5)))
    assert results == [0, 2, 4, 6, 8]
    assert [len(g) for g in recorder.groups] == [2, 2]
    assert recorder.singles == [4]


async def test_a_failed_group_is_retried_write_by_write_and_each_caller_sees_its_own_error() -> (
    None
):
    recorder, pool = Recorder(), FakePool()
    group = group_of(recorder, pool)
    outcomes = await asyncio.gather(*(group.submit(n) for n in (5, -1, 7)), return_exceptions=True)
    assert outcomes[0] == 10
    assert isinstance(outcomes[1], ValueError) and "negative: -1" in str(outcomes[1])
    assert outcomes[2] == 14
    assert recorder.groups == [[5, -1, 7]]
    assert recorder.singles == [5, -1, 7]


async def test_a_cancelled_caller_does_not_disturb_the_others() -> None:
    recorder, pool = Recorder(), FakePool()
    group = group_of(recorder, pool)
    recorder.release.clear()
    doomed = asyncio.create_task(group.submit(1))
    kept = asyncio.create_task(group.submit(2))
    await asyncio.sleep(0)
    doomed.cancel()
    recorder.release.set()
    assert await kept == 4
    with pytest.raises(asyncio.CancelledError):
        await doomed


async def test_a_pool_that_cannot_give_a_connection_fails_every_waiting_write() -> None:
    recorder = Recorder()
    group: CommitGroup[int, int] = CommitGroup(
        Lane(BrokenPool()),  # type: ignore[arg-type]
        recorder.run_group,
        recorder.run_one,
    )
    outcomes = await asyncio.gather(*(group.submit(n) for n in (1, 2)), return_exceptions=True)
    assert all(isinstance(o, OSError) for o in outcomes)


async def test_groups_sharing_a_lane_write_on_one_connection_one_after_the_other() -> None:
    doubling, tripling = Recorder(), Recorder()

    async def triple(conn: Any, request: int) -> int:
        return 3 * await tripling.run_one(conn, request)

    pool = FakePool()
    lane = Lane(pool)  # type: ignore[arg-type]
    doubles = CommitGroup(lane, doubling.run_group, doubling.run_one)
    triples = CommitGroup(lane, tripling.run_group, triple)
    assert await doubles.submit(1) == 2
    assert await triples.submit(1) == 6
    assert await doubles.submit(2) == 4
    assert pool.acquired == 1  # a claim and the success mark after it: one session


async def test_a_lane_writes_each_groups_waiting_writes_as_that_groups_own_statement() -> None:
    doubling, other = Recorder(), Recorder()
    pool = FakePool()
    lane = Lane(pool, writers=1)  # type: ignore[arg-type]
    doubles = CommitGroup(lane, doubling.run_group, doubling.run_one)
    others = CommitGroup(lane, other.run_group, other.run_one)
    doubling.release.clear()
    first = asyncio.create_task(doubles.submit(1))
    await asyncio.sleep(0)  # the lane's only writer is busy
    writes = ((doubles, 2), (others, 3), (doubles, 4))
    waiting = [asyncio.create_task(group.submit(n)) for group, n in writes]
    await asyncio.sleep(0)
    doubling.release.set()
    assert [await first] + [await t for t in waiting] == [2, 4, 6, 8]
    assert doubling.singles == [1] and doubling.groups == [[2, 4]]
    assert other.singles == [3] and other.groups == []


async def test_a_writer_that_fails_fails_the_waiting_writes_of_every_group_of_its_lane() -> None:
    recorder = Recorder()
    lane = Lane(BrokenPool())  # type: ignore[arg-type]
    groups = [CommitGroup(lane, recorder.run_group, recorder.run_one) for _ in range(2)]
    outcomes = await asyncio.gather(*(g.submit(1) for g in groups), return_exceptions=True)
    assert all(isinstance(o, OSError) for o in outcomes)


async def test_a_connection_that_breaks_under_one_group_is_not_used_for_the_next() -> None:
    pool = FakePool()
    breaking, other = Recorder(), Recorder()
    lane = Lane(pool, writers=1)  # type: ignore[arg-type]

    async def break_the_connection(conn: Any, request: int) -> int:
        conn.closed = True
        raise ConnectionError("the connection was lost")

    first = CommitGroup(lane, breaking.run_group, break_the_connection)
    second = CommitGroup(lane, other.run_group, other.run_one)
    outcomes = await asyncio.gather(first.submit(1), second.submit(2), return_exceptions=True)
    assert isinstance(outcomes[0], ConnectionError)
    assert outcomes[1] == 4  # written on a new connection, not failed on the broken one
    assert pool.acquired == 2
