"""The SQL the code runs matches the schema the migrations build, and so does ``schema.sql``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

import asyncpg
import pytest

from rabbitretry import db
from rabbitretry.ledger import migrations
from tests.conftest import fresh_database


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
        assert await migrations.pending_migrations(conn) == []
        assert await migrations.migrate(conn) == []
        versions = [
            r["version"]
            for r in await conn.fetch(
                "SELECT version FROM rabbitretry.schema_migration ORDER BY version"
            )
        ]
    assert versions == [version for version, _, _ in migrations.shipped()]


# The whole schema `rabbitretry` as the catalogs describe it, one query per kind of object,
# each ordered so that two descriptions compare as lists. Column order counts (SELECT * and
# COPY see it); attribute numbers do not (a dropped column leaves a gap). Read from pg_catalog
# rather than diffing pg_dump's output: no pg_dump binary to match the server's version, and a
# difference names the object. Procrastinate checks its schema.sql against its migrations the
# same way: build one database from each and compare what the catalogs say.
CATALOG: dict[str, str] = {
    "relations": """
        SELECT c.relname, c.relkind, c.relpersistence, c.reloptions,
               obj_description(c.oid, 'pg_class')
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'rabbitretry'
        ORDER BY c.relname""",
    "columns": """
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated, co.collname,
               col_description(c.oid, a.attnum)
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 0
        WHERE n.nspname = 'rabbitretry' AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
          AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY c.relname, a.attnum""",
    "constraints": """
        SELECT c.conrelid::regclass::text, c.conname, c.contype, pg_get_constraintdef(c.oid),
               c.condeferrable, c.condeferred
        FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
        WHERE n.nspname = 'rabbitretry'
        ORDER BY 1, 2""",
    "indexes": """
        SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid)
        FROM pg_index i
        JOIN pg_class c ON c.oid = i.indexrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'rabbitretry'
        ORDER BY 1""",
    "sequences": """
        SELECT s.seqrelid::regclass::text, format_type(s.seqtypid, NULL), s.seqstart,
               s.seqincrement, s.seqmax, s.seqmin, s.seqcache, s.seqcycle,
               (SELECT d.refobjid::regclass::text || '.' || a.attname
                FROM pg_depend d
                JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                WHERE d.classid = 'pg_class'::regclass AND d.objid = s.seqrelid
                  AND d.deptype IN ('a', 'i'))
        FROM pg_sequence s
        JOIN pg_class c ON c.oid = s.seqrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'rabbitretry'
        ORDER BY 1""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid),
               obj_description(p.oid, 'pg_proc')
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'rabbitretry'
        ORDER BY 1, 2""",
    "triggers": """
        SELECT t.tgrelid::regclass::text, t.tgname, pg_get_triggerdef(t.oid), t.tgenabled
        FROM pg_trigger t
        JOIN pg_class c ON c.oid = t.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'rabbitretry' AND NOT t.tgisinternal
        ORDER BY 1, 2""",
    "schema_migration": "SELECT version, name FROM rabbitretry.schema_migration ORDER BY version",
}


async def describe(url: str) -> dict[str, list[tuple[Any, ...]]]:
    conn = await asyncpg.connect(url)
    try:
        return {
            kind: [tuple(row) for row in await conn.fetch(sql)] for kind, sql in CATALOG.items()
        }
    finally:
        await conn.close()


def schema_sql() -> str:
    return resources.files("rabbitretry.sql").joinpath("schema.sql").read_text()


@pytest.fixture
async def migrated_url(server_database_url: str) -> AsyncIterator[str]:
    """A new database built by the migrations, one after the other."""
    async with fresh_database(server_database_url, None) as url:
        conn = await asyncpg.connect(url)
        try:
            await migrations.migrate(conn)
        finally:
            await conn.close()
        yield url


@pytest.fixture
async def from_schema_url(server_database_url: str) -> AsyncIterator[str]:
    """A new database built by executing schema.sql, in one transaction."""
    async with fresh_database(server_database_url, None) as url:
        conn = await asyncpg.connect(url)
        try:
            async with conn.transaction():
                await conn.execute(schema_sql())
        finally:
            await conn.close()
        yield url


async def test_schema_sql_builds_the_database_the_migrations_build(
    migrated_url: str, from_schema_url: str
) -> None:
    migrated = await describe(migrated_url)
    assert all(migrated.values()), "every kind of object is there to compare"
    from_schema = await describe(from_schema_url)
    for kind in CATALOG:
        assert from_schema[kind] == migrated[kind], f"schema.sql and the migrations differ: {kind}"


async def test_migrate_applies_nothing_to_a_database_built_from_schema_sql(
    from_schema_url: str,
) -> None:
    conn = await asyncpg.connect(from_schema_url)
    try:
        assert await migrations.pending_migrations(conn) == []
        assert await migrations.migrate(conn) == []
    finally:
        await conn.close()


def test_schema_sql_holds_no_named_statement() -> None:
    # Every .sql file beside it is read by db.queries(); schema.sql must add nothing to them.
    assert not any(line.startswith("-- name:") for line in schema_sql().splitlines())
    assert "claim" in db.queries()
