"""rabbitretry.testing with a real connection inside the test's own rolled-back transaction."""

from __future__ import annotations

import asyncpg
import pytest
from pydantic import BaseModel

from rabbitretry import Consumer, Context, testing

pytestmark = pytest.mark.asyncio


class Award(BaseModel):
    user_id: int
    points: int


class AwardPoints(Consumer[Award]):
    queue = "testing.points"

    async def handle(self, msg: Award, ctx: Context) -> None:
        async with ctx.transaction() as conn:
            await conn.execute(
                "INSERT INTO points_flow VALUES ($1, $2, $3)",
                ctx.idempotency_key,
                msg.user_id,
                msg.points,
            )
        if msg.points < 0:
            raise ValueError("negative points")  # after the write: the write must not stay


async def test_a_real_connection_sees_effects_that_the_tests_rollback_removes(
    pool: asyncpg.Pool,
) -> None:
    await pool.execute("CREATE TABLE points_flow (key text, user_id int, points int)")
    async with pool.acquire() as conn:
        transaction = conn.transaction()
        await transaction.start()
        try:
            ok = await testing.handle(
                AwardPoints, {"user_id": 1, "points": 10}, message_id="m-1", connection=conn
            )
            failed = await testing.handle(
                AwardPoints, {"user_id": 1, "points": -5}, message_id="m-2", connection=conn
            )
            # Inside the test's transaction: the success's row, not the failed attempt's.
            rows = await conn.fetch("SELECT key, points FROM points_flow")
            assert [tuple(row) for row in rows] == [("testing.points:m-1", 10)]
        finally:
            await transaction.rollback()
    assert (ok.outcome, failed.outcome) == ("succeeded", "retrying")
    assert isinstance(failed.error, ValueError)
    assert await pool.fetchval("SELECT count(*) FROM points_flow") == 0
