"""A claim's lease counts from the moment it is granted.

The claim statement waits for the ledger row's lock when another transaction holds it (another
attempt's final write, a batch of claims). Its lease used to count from the start of the
statement (``now()``): a claim that waited longer than its lease committed with a lease that
had already run out, so another worker could take the message while this one ran it.
"""

from __future__ import annotations

import asyncio

import asyncpg

from rabbitretry import ledger
from rabbitretry.ledger.failures import describe
from tests.integration.harness import lock_waited_by, wait_for

LEASE = 1.0
LOCK_HELD = 2.5  # longer than the lease


async def claim(pool: asyncpg.Pool, key: ledger.Key, lease: float) -> ledger.Claim:
    snapshot = ledger.Snapshot(b'{"n": 1}', {}, {}, "", key.queue)
    return await ledger.claim(
        pool,
        key,
        max_attempts=3,
        lease_seconds=lease,
        worker="test",
        copy_attempts=0,
        snapshot=snapshot,
    )


async def test_a_claim_that_waited_for_the_rows_lock_gets_its_whole_lease(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    key = ledger.Key(queue_name, "m")
    assert (await claim(pool, key, 30.0)).verdict == "claimed"
    failure = describe(queue_name, ConnectionError("downstream down"))
    assert await ledger.schedule_retry(pool, key, 1, 0.0, failure) is not None  # due at once

    async with pool.acquire() as holder, holder.transaction():
        await holder.execute(
            "SELECT 1 FROM rabbitretry.ledger WHERE queue = $1 AND message_id = $2 FOR UPDATE",
            key.queue,
            key.message_id,
        )
        claiming = asyncio.create_task(claim(pool, key, LEASE))

        await wait_for(lock_waited_by(pool, "rabbitretry.claim("), timeout=10)
        await asyncio.sleep(LOCK_HELD)  # the fault: the lock is held past the claim's lease
    granted = await claiming
    assert (granted.verdict, granted.attempt) == ("claimed", 2)
    left = await pool.fetchval(
        "SELECT extract(epoch FROM lease_until - clock_timestamp())::float8"
        " FROM rabbitretry.ledger WHERE queue = $1 AND message_id = $2",
        key.queue,
        key.message_id,
    )
    assert 0 < left <= LEASE
