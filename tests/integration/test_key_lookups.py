"""A statement that names one message and its state finds its row through the primary key,
whatever the partial indexes of that state hold.

``ledger_lease_idx`` gains an entry with every claim, and a success leaves it dead until a
vacuum; on a big ledger that comes after millions of changes. A success mark planned as a
scan of that index (its predicate matched the statement's ``status = 'processing'``) read
all of it, thousands of pages, instead of one key. Migration 0020 made both indexes of rows
in flight unusable for such statements. A replay's lookup of a dead letter was planned as a
scan of ``ledger_dead_idx`` over its whole queue whenever the statistics counted few dead
letters; those statements now test the state in a form no partial index predicate matches.
These tests keep it so for every statement that names a key, in the plan a prepared
statement gets first (custom) and later (generic), and for the commit groups' statements,
whose keyed statements run inside functions (migration 0021), in the plans those functions
run.
"""

from __future__ import annotations

import re

import asyncpg
import pytest

from rabbitretry import db

# Statements naming one ledger row (or one per element of an array of keys) and its state.
BY_KEY = re.compile(r"queue = \$1 AND (?:l\.)?message_id = \$2|l\.message_id = [ik]\.message_id")
STATED = re.compile(r"(?:AND|WHERE) (?:l\.)?status (?:= '\w+'|IN \(|IS NOT DISTINCT FROM)")

# A literal for each parameter type those statements take (a new type fails loudly here).
VALUES = {
    "text": "'q'",
    "int4": "1",
    "float8": "1.0",
    "bool": "false",
    "jsonb": "'{}'",
    "bytea": "''",
}


def argument(type_name: str) -> str:
    """A literal of the parameter's type (an array of one for ``text[]`` and the like)."""
    if type_name.endswith("[]"):
        return f"ARRAY[{VALUES[type_name[:-2]]}]::{type_name}"
    return f"{VALUES[type_name]}::{type_name}"


KEYED = sorted(
    name
    for name, text in db.queries().items()
    if BY_KEY.search(text) and STATED.search(text) and "rabbitretry.ledger" in text
)


def test_the_statements_naming_a_key_are_found() -> None:
    # The pattern finds the hot path's statements: a change of their text must not let them
    # slip out of the test below.
    hot = {"finish_attempt", "mark_started", "renew_lease", "schedule_retry"}
    replay = {
        "lock_dead",
        "mark_replayed",
        "operations_set_payload",
        "operations_ignore",
        "operations_ignore_many",
    }
    assert hot | replay <= set(KEYED)


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
@pytest.mark.parametrize("name", KEYED)
async def test_a_statement_naming_a_key_looks_it_up_by_key(
    pool: asyncpg.Pool, name: str, mode: str
) -> None:
    async with pool.acquire() as conn:
        await live_ledger(conn)
        parameters = (await conn.prepare(db.query(name))).get_parameters()
        arguments = ", ".join(argument(p.name) for p in parameters)
        async with conn.transaction():
            await conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
            # Gone with the connection: each test has a database and a pool of its own.
            await conn.execute(f"PREPARE keyed AS {db.query(name)}")
            rows = await conn.fetch(f"EXPLAIN EXECUTE keyed({arguments})")
    assert_by_key("\n".join(row[0] for row in rows))


# The commit groups' statements whose keyed statement runs in a function (migration 0021).
GROUPED = ["batching_succeeded_many", "batching_started_many"]


@pytest.mark.parametrize("name", GROUPED)
async def test_a_group_statement_looks_its_keys_up_by_key(pool: asyncpg.Pool, name: str) -> None:
    async with pool.acquire() as conn:
        await live_ledger(conn)
    plans = await nested_plans(pool, name)
    updates = [plan for plan in plans if "Update on ledger" in plan]
    assert len(updates) == 1, plans
    assert_by_key(updates[0])


async def test_a_group_of_claims_looks_each_new_key_up_by_key(pool: asyncpg.Pool) -> None:
    # claim_many's insert of new keys checks each key's row and compacted hash (migration
    # 0022). Its plan is kept for the session, and a session that starts on an empty ledger
    # planned NOT EXISTS as a join with a scan of every row, kept as the ledger grew.
    plans = await nested_plans(pool, "batching_claim_many")
    inserts = [plan for plan in plans if "Insert on ledger" in plan]
    assert len(inserts) == 1, plans
    assert "Seq Scan" not in inserts[0], inserts[0]
    used = set(re.findall(r"(?:using|Bitmap Index Scan on) (\w+)", inserts[0]))
    assert used == {"ledger_pkey", "succeeded_key_pkey"}, inserts[0]


async def nested_plans(pool: asyncpg.Pool, name: str) -> list[str]:
    """The plans of the statements the functions that statement ``name`` calls run: PostgreSQL's
    auto_explain reports each, as a log message that the session is sent."""
    plans: list[str] = []
    async with pool.acquire() as conn:
        parameters = (await conn.prepare(db.query(name))).get_parameters()
        arguments = ", ".join(argument(p.name) for p in parameters)

        def listener(_: object, message: asyncpg.PostgresLogMessage) -> None:
            plans.append(message.message)

        conn.add_log_listener(listener)
        try:
            async with conn.transaction():
                await conn.execute(
                    "LOAD 'auto_explain'; SET LOCAL auto_explain.log_min_duration = 0;"
                    " SET LOCAL auto_explain.log_nested_statements = on;"
                    " SET LOCAL client_min_messages = log"
                )
                await conn.execute(f"PREPARE grouped AS {db.query(name)}")
                await conn.execute(f"EXECUTE grouped({arguments})")
        finally:
            # The pool warns of a listener left on a connection it takes back.
            conn.remove_log_listener(listener)
    return plans


async def live_ledger(conn: asyncpg.Connection) -> None:
    """Rows in flight, and the dead index entries their successes leave, as on a live ledger."""
    await conn.execute(
        """
        INSERT INTO rabbitretry.ledger (queue, message_id, status, max_attempts,
                                        lease_until, payload, headers, properties)
        SELECT 'q', 'm-' || i, 'processing', 3, now(), '', '{}', '{}'
        FROM generate_series(1, 2000) AS i
        """
    )
    await conn.execute(
        "UPDATE rabbitretry.ledger SET status = 'succeeded', lease_until = NULL,"
        " finished_at = now() WHERE message_id <> 'm-1'"
    )
    # Dead letters and retries replayed or retried to success: each left its entries in the
    # partial indexes of its former state.
    for prefix, status in (("d-", "dead"), ("r-", "retrying")):
        await conn.execute(
            f"""
            INSERT INTO rabbitretry.ledger (queue, message_id, status, max_attempts, finished_at,
                                            next_retry_at, error_fingerprint, payload, headers,
                                            properties)
            SELECT 'q', '{prefix}' || i, '{status}', 3, now(), now(), 'f', '', '{{}}', '{{}}'
            FROM generate_series(1, 2000) AS i
            """
        )
        await conn.execute(
            "UPDATE rabbitretry.ledger SET status = 'succeeded', next_retry_at = NULL,"
            f" finished_at = now() WHERE message_id LIKE '{prefix}%' AND message_id <> '{prefix}1'"
        )
    await conn.execute("ANALYZE rabbitretry.ledger")


def assert_by_key(plan: str) -> None:
    used = re.findall(r"(?:using|Bitmap Index Scan on) (ledger_\w+)", plan)
    assert set(used) == {"ledger_pkey"}, plan
