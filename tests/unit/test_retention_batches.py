"""The prune's batch loop, against a stand-in for the database: where each batch starts, and a
batch that loses a deadlock to a worker taken again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from rabbitretry.ledger import retention

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Batches:
    """Answers each batch statement with the next row given; records the arguments."""

    def __init__(self, *answers: dict[str, Any] | Exception) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[Any, ...]] = []

    async def fetch(self, _statement: str, *args: Any) -> list[dict[str, Any]]:
        self.calls.append(args)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return [answer]


def paced(pool: Batches) -> Any:
    return retention._Paced(pool, 2, 0.0)  # type: ignore[arg-type]


async def test_each_batch_starts_where_the_last_one_ended() -> None:
    pool = Batches(
        {"taken": 2, "deleted": 2, "last": T0},
        {"taken": 2, "deleted": 1, "last": T0 + timedelta(seconds=1)},
        {"taken": 1, "deleted": 1, "last": T0 + timedelta(seconds=2)},
    )
    assert await paced(pool).oldest_first("compact_succeeded", "q", T0) == 4
    assert [call[-1] for call in pool.calls] == [
        datetime.min.replace(tzinfo=UTC),
        T0,
        T0 + timedelta(seconds=1),
    ]


async def test_a_whole_batch_of_kept_rows_at_one_instant_is_stepped_past() -> None:
    pool = Batches(
        {"taken": 2, "deleted": 0, "last": T0},
        {"taken": 2, "deleted": 0, "last": T0},  # the same instant again: step past it
        {"taken": 0, "deleted": 0, "last": None},
    )
    assert await paced(pool).oldest_first("compact_succeeded", "q", T0) == 0
    assert pool.calls[2][-1] == T0 + timedelta(microseconds=1)


async def test_a_batch_that_loses_a_deadlock_is_taken_again() -> None:
    lost = asyncpg.DeadlockDetectedError("deadlock detected")
    pool = Batches(lost, {"taken": 1, "deleted": 1, "last": T0})
    assert await paced(pool).oldest_first("prune_succeeded_keys", T0) == 1
    assert len(pool.calls) == 2


async def test_a_batch_that_keeps_losing_fails_the_prune() -> None:
    pool = Batches(*[asyncpg.DeadlockDetectedError("deadlock detected")] * retention.RACE_TRIES)
    with pytest.raises(asyncpg.DeadlockDetectedError):
        await paced(pool).oldest_first("prune_succeeded_keys", T0)
