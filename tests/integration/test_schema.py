"""The SQL the code runs matches the schema the migrations build."""

from __future__ import annotations

import asyncpg
import pytest

from rabbitretry import db


@pytest.mark.parametrize("name", sorted(db.queries()))
async def test_every_named_statement_prepares_against_the_migrated_schema(
    pool: asyncpg.Pool, name: str
) -> None:
    # Preparing plans the statement without running it: a missing table, column or function,
    # or a parameter of the wrong type, fails here rather than on a worker's hot path.
    async with pool.acquire() as conn:
        await conn.prepare(db.query(name))


async def test_migrating_again_applies_nothing(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        assert await db.pending_migrations(conn) == []
        assert await db.migrate(conn) == []
        versions = [
            r["version"]
            for r in await conn.fetch(
                "SELECT version FROM rabbitretry.schema_migration ORDER BY version"
            )
        ]
    assert versions == [version for version, _, _ in db.migrations()]
