"""The ledger's schema: the migrations shipped in ``sql/migrations/`` and applying them.

Each migration runs in its own transaction, under an advisory lock so that two migrators
(two deploy steps at once) never apply one twice.
"""

from __future__ import annotations

import re
from importlib import resources

from rabbitretry.db import Connection

__all__ = ["applied_migrations", "migrate", "pending_migrations", "shipped"]

_MIGRATION_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")
_MIGRATION_LOCK = 0x7261_6262  # advisory lock key: one migrator at a time


def shipped() -> list[tuple[int, str, str]]:
    """(version, name, sql) of every migration shipped, in order."""
    folder = resources.files("rabbitretry.sql").joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = _MIGRATION_FILE.match(entry.name)
        if match:
            found.append((int(match[1]), match[2], entry.read_text()))
    return sorted(found)


async def applied_migrations(conn: Connection) -> set[int]:
    exists = await conn.fetchval("SELECT to_regclass('rabbitretry.schema_migration') IS NOT NULL")
    if not exists:
        return set()
    return {
        row["version"]
        for row in await conn.fetch("SELECT version FROM rabbitretry.schema_migration")
    }


async def migrate(conn: Connection) -> list[str]:
    """Apply the migrations not yet applied, each in its own transaction; their names."""
    done: list[str] = []
    await conn.execute("SELECT pg_advisory_lock($1)", _MIGRATION_LOCK)
    try:
        applied = await applied_migrations(conn)
        for version, name, sql in shipped():
            if version in applied:
                continue
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute(
                    "CREATE TABLE IF NOT EXISTS rabbitretry.schema_migration ("
                    " version integer PRIMARY KEY, name text NOT NULL,"
                    " applied_at timestamptz NOT NULL DEFAULT now())"
                )
                await conn.execute(
                    "INSERT INTO rabbitretry.schema_migration (version, name) VALUES ($1, $2)",
                    version,
                    name,
                )
            done.append(f"{version:04d}_{name}")
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _MIGRATION_LOCK)
    return done


async def pending_migrations(conn: Connection) -> list[str]:
    applied = await applied_migrations(conn)
    return [f"{v:04d}_{n}" for v, n, _ in shipped() if v not in applied]
