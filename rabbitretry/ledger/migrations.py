"""The ledger's schema: the migrations shipped in ``sql/migrations/`` and applying them.

Each migration runs in its own transaction, under an advisory lock so that two migrators
(two deploy steps at once) never apply one twice. A migration whose first line is
``-- migration: outside a transaction`` runs statement by statement instead, each committing
on its own: what ``CREATE INDEX CONCURRENTLY`` needs (its statements must each be safe to run
again, and end a line with their ``;``).

A migration may scan a big ledger for minutes: no client timeout cuts it short. It waits at
most ``LOCK_WAIT`` for a lock, so that it never parks the workers' writes behind it while a
long transaction holds the table; it then tries again, ``LOCK_TRIES`` times in all.
"""

from __future__ import annotations

import asyncio
import logging
import re
from importlib import resources

from rabbitretry.db import Connection, LockNotAvailable
from rabbitretry.errors import ConfigurationError, ServiceUnavailable

__all__ = [
    "applied_migrations",
    "migrate",
    "online_statements",
    "pending_migrations",
    "shipped",
]

_MIGRATION_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")
_MIGRATION_LOCK = 0x7261_6262  # advisory lock key: one migrator at a time
_OUTSIDE_TRANSACTION = "-- migration: outside a transaction"
_STATEMENT_END = re.compile(r";[ \t]*$", re.MULTILINE)

LOCK_WAIT = "5s"  # lock_timeout of a migration's statements
LOCK_TRIES = 12
NO_TIMEOUT = 7 * 24 * 3600.0  # seconds: a scan of a big ledger is not a failure

log = logging.getLogger("rabbitretry.migrations")


class MigrationLocked(ServiceUnavailable):
    """A migration found its tables locked by other transactions, ``LOCK_TRIES`` times."""


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
            await _apply_patiently(conn, version, name, sql)
            done.append(f"{version:04d}_{name}")
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _MIGRATION_LOCK)
    return done


async def _apply_patiently(conn: Connection, version: int, name: str, sql: str) -> None:
    label = f"{version:04d}_{name}"
    await conn.execute(f"SET lock_timeout = '{LOCK_WAIT}'")
    try:
        for tried in range(1, LOCK_TRIES + 1):
            try:
                await _apply(conn, version, name, sql)
                return
            except LockNotAvailable:
                if tried == LOCK_TRIES:
                    break
                log.warning(
                    "migration %s waited %s for a lock that another transaction holds; "
                    "trying again (%d of %d)",
                    label,
                    LOCK_WAIT,
                    tried + 1,
                    LOCK_TRIES,
                )
                await asyncio.sleep(1)
    finally:
        await conn.execute("RESET lock_timeout")
    raise MigrationLocked(
        f"migration {label} could not take its locks ({LOCK_TRIES} tries of {LOCK_WAIT}): "
        "a long transaction holds the ledger's tables (see pg_stat_activity); run "
        "`rabbitretry db migrate` again once it has ended"
    )


def online_statements(sql: str) -> list[str] | None:
    """The statements of a migration that runs outside a transaction, one by one, in order;
    None for one that runs in a transaction."""
    if not sql.startswith(_OUTSIDE_TRANSACTION):
        return None
    return [
        statement
        for statement in _STATEMENT_END.split(sql)
        if any(
            line.strip() and not line.lstrip().startswith("--") for line in statement.splitlines()
        )
    ]


async def _apply(conn: Connection, version: int, name: str, sql: str) -> None:
    online = online_statements(sql)
    if online is not None:
        for statement in online:
            await conn.execute(statement, timeout=NO_TIMEOUT)
        async with conn.transaction():
            await _record(conn, version, name)
        return
    async with conn.transaction():
        await conn.execute(sql, timeout=NO_TIMEOUT)
        await _record(conn, version, name)


async def _record(conn: Connection, version: int, name: str) -> None:
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


async def pending_migrations(conn: Connection) -> list[str]:
    applied = await applied_migrations(conn)
    return [f"{v:04d}_{n}" for v, n, _ in shipped() if v not in applied]


async def require_current(conn: Connection, where: str = "") -> None:
    """Refuse a ledger schema with pending migrations (``where``: which database, for the
    message), in one line that says what to run."""
    pending = await pending_migrations(conn)
    if pending:
        raise ConfigurationError(
            f"the ledger schema{where} is not up to date ({', '.join(pending)} pending): "
            "run `rabbitretry db migrate`"
        )
