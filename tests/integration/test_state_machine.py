"""The guarded state machine against the real database: outcomes, history and races."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from rabbitretry import Permanent, Retry
from rabbitretry.callbacks import Change, RecordNotFound, StateMachine
from rabbitretry.errors import ConfigurationError
from tests.integration.harness import wait_for

pytestmark = pytest.mark.asyncio

TRANSITIONS = {
    "pending": {"paid", "closed"},
    "paid": {"refunding", "refunded"},
    "refunding": {"refunded"},
}
ORDER = StateMachine(name="order", table="shop.Orders", transitions=TRANSITIONS)


@pytest.fixture
async def orders(pool: asyncpg.Pool) -> asyncpg.Pool:
    # A schema-qualified, mixed-case table: the machine quotes what it is given.
    await pool.execute(
        'CREATE SCHEMA shop; CREATE TABLE shop."Orders" (id int PRIMARY KEY, state text)'
    )
    await pool.execute(
        """INSERT INTO shop."Orders" VALUES (1, 'pending'), (2, 'paid'), (3, 'refunding')"""
    )
    return pool


async def state_of(pool: asyncpg.Pool, order: int) -> str:
    state: str = await pool.fetchval('SELECT state FROM shop."Orders" WHERE id = $1', order)
    return state


async def history(pool: asyncpg.Pool, order: int) -> list[tuple[str, str, str, str]]:
    async with pool.acquire() as conn:
        rows = await ORDER.history(conn, order)
    return [(r["from_state"], r["to_state"], r["outcome"], r["message_id"]) for r in rows]


async def move(pool: asyncpg.Pool, order: int, target: str, message_id: str = "m") -> Change:
    async with pool.acquire() as conn, conn.transaction():
        return await ORDER.move(conn, order, target, message_id=message_id)


async def test_a_declared_transition_moves_and_is_recorded(orders: asyncpg.Pool) -> None:
    change = await move(orders, 1, "paid", "pay-1")
    assert (change.kind, change.from_state, change.to_state) == ("moved", "pending", "paid")
    change.settle()  # success: nothing raised
    assert await state_of(orders, 1) == "paid"
    assert await history(orders, 1) == [("pending", "paid", "moved", "pay-1")]


async def test_a_duplicate_is_already_there_and_changes_nothing(orders: asyncpg.Pool) -> None:
    change = await move(orders, 2, "paid", "pay-2-again")
    assert change.kind == "already-there"
    change.settle()
    assert await state_of(orders, 2) == "paid"
    assert await history(orders, 2) == []


async def test_a_late_paid_cannot_move_a_refunding_order_back(orders: asyncpg.Pool) -> None:
    change = await move(orders, 3, "paid", "pay-3-late")
    assert (change.kind, change.from_state) == ("not-allowed", "refunding")
    change.settle()  # the machine lets a refusal succeed by default
    assert await state_of(orders, 3) == "refunding"
    assert await history(orders, 3) == [("refunding", "paid", "not-allowed", "pay-3-late")]
    strict = StateMachine(
        name="order", table="shop.Orders", transitions=TRANSITIONS, not_allowed="dead"
    )
    async with orders.acquire() as conn:
        refused = await strict.move(conn, 3, "paid", message_id="pay-3-late")
    with pytest.raises(Permanent, match="refunding → paid is not allowed"):
        refused.settle()


async def test_an_event_ahead_of_its_predecessor_is_not_yet_possible(
    orders: asyncpg.Pool,
) -> None:
    change = await move(orders, 1, "refunded", "refund-1")
    assert (change.kind, change.from_state) == ("not-yet-possible", "pending")
    with pytest.raises(Retry, match="not possible yet"):
        change.settle()
    assert await state_of(orders, 1) == "pending"
    assert await history(orders, 1) == []  # nothing happened; the retry will record it


async def test_a_missing_record_and_an_undeclared_state_raise(orders: asyncpg.Pool) -> None:
    with pytest.raises(RecordNotFound, match="order 99"):
        await move(orders, 99, "paid")
    with pytest.raises(ConfigurationError, match="no state 'shipped'"):
        await move(orders, 1, "shipped")


async def test_concurrent_duplicates_make_one_transition(orders: asyncpg.Pool) -> None:
    changes = await asyncio.gather(*(move(orders, 1, "paid", f"copy-{n}") for n in range(4)))
    assert sorted(c.kind for c in changes) == ["already-there"] * 3 + ["moved"]
    assert [h[:3] for h in await history(orders, 1)] == [("pending", "paid", "moved")]


async def test_a_racing_duplicate_waits_for_the_first_and_then_changes_nothing(
    orders: asyncpg.Pool,
) -> None:
    first = await orders.acquire()
    second = await orders.acquire()
    try:
        first_transaction, second_transaction = first.transaction(), second.transaction()
        await first_transaction.start()
        assert (await ORDER.move(first, 1, "paid", message_id="a")).kind == "moved"
        await second_transaction.start()
        racing = asyncio.create_task(ORDER.move(second, 1, "paid", message_id="b"))
        pid = second.get_server_pid()

        async def blocked_on_the_row_lock() -> bool:
            wait = await orders.fetchval(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", pid
            )
            return bool(wait == "Lock")

        await wait_for(blocked_on_the_row_lock, timeout=10)
        await first_transaction.commit()
        change = await asyncio.wait_for(racing, 10)
        await second_transaction.commit()
    finally:
        await orders.release(first)
        await orders.release(second)
    assert (change.kind, change.from_state) == ("already-there", "paid")
    assert [h[3] for h in await history(orders, 1)] == ["a"]
