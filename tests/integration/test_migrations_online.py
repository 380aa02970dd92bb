"""Migrations on a live ledger: a lock held by another transaction is waited for briefly (so
that the workers' writes never queue behind a migration for long) and the command says what
to do; a migration marked to run outside a transaction runs statement by statement, as
``CREATE INDEX CONCURRENTLY`` needs, and every shipped one of those, cut short after any of
its statements (a deploy killed, a lost connection), ends as if it had run whole once
``rabbitretry db migrate`` runs again."""

from __future__ import annotations

import asyncpg
import pytest

from rabbitretry.ledger import migrations
from tests.conftest import fresh_database
from tests.integration.test_schema import describe

ADD_COLUMN = (9001, "probe_column", "ALTER TABLE rabbitretry.ledger ADD COLUMN probe integer;\n")
ONLINE_INDEX = (
    9002,
    "probe_index",
    "-- migration: outside a transaction\n"
    "--\n"
    "-- a comment between statements; ignored\n"
    "DROP INDEX CONCURRENTLY IF EXISTS rabbitretry.probe_idx;\n"
    "CREATE INDEX CONCURRENTLY probe_idx ON rabbitretry.ledger (updated_at)\n"
    "    WHERE status = 'dead';\n",
)


@pytest.fixture
def extra_migrations(monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = migrations.shipped()
    monkeypatch.setattr(migrations, "shipped", lambda: [*shipped, ADD_COLUMN, ONLINE_INDEX])
    monkeypatch.setattr(migrations, "LOCK_WAIT", "200ms")
    monkeypatch.setattr(migrations, "LOCK_TRIES", 2)


@pytest.mark.usefixtures("extra_migrations")
async def test_a_lock_held_elsewhere_is_waited_for_briefly_then_named(
    pool: asyncpg.Pool, database_url: str
) -> None:
    holder = await asyncpg.connect(database_url)
    try:
        lock = holder.transaction()
        await lock.start()
        await holder.execute("LOCK TABLE rabbitretry.ledger IN ACCESS SHARE MODE")
        async with pool.acquire() as conn:
            with pytest.raises(migrations.MigrationLocked) as refused:
                await migrations.migrate(conn)
            assert str(refused.value) == (
                "migration 9001_probe_column could not take its locks (2 tries of 200ms): a long "
                "transaction holds the ledger's tables (see pg_stat_activity); run `rabbitretry "
                "db migrate` again once it has ended"
            )
            assert await migrations.pending_migrations(conn) == [
                "9001_probe_column",
                "9002_probe_index",
            ]
            # The holder was never blocked, and the migrator's lock wait is back to none.
            assert await holder.fetchval("SELECT count(*) FROM rabbitretry.ledger") == 0
            assert await conn.fetchval("SHOW lock_timeout") == "0"
        await lock.commit()

        async with pool.acquire() as conn:
            assert await migrations.migrate(conn) == ["9001_probe_column", "9002_probe_index"]
    finally:
        await holder.close()
    valid = await pool.fetchval(
        "SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = 'rabbitretry.probe_idx'::regclass"
    )
    assert valid is True
    assert await pool.fetchval("SELECT count(probe) FROM rabbitretry.ledger") == 0


@pytest.mark.usefixtures("extra_migrations")
async def test_an_online_migration_cut_short_runs_again_from_the_start(
    pool: asyncpg.Pool,
) -> None:
    # An earlier run built the index and died before it was recorded (or left it invalid).
    await pool.execute(
        "CREATE INDEX probe_idx ON rabbitretry.ledger (updated_at) WHERE status = 'dead'"
    )
    async with pool.acquire() as conn:
        assert await migrations.migrate(conn) == ["9001_probe_column", "9002_probe_index"]
        assert await migrations.migrate(conn) == []
    assert await pool.fetchval("SELECT to_regclass('rabbitretry.probe_idx') IS NOT NULL")


# Every point at which a shipped online migration can be cut short: after each statement but
# the last (a statement cut in its middle fails as a whole, or leaves an invalid index that
# the statement before it drops).
CUTS = [
    pytest.param(version, cut, id=f"{version:04d}_{name}-after-{cut}")
    for version, name, sql in migrations.shipped()
    for cut in range(1, len(migrations.online_statements(sql) or [None]))
]


@pytest.mark.parametrize(("version", "cut"), CUTS)
async def test_a_shipped_online_migration_cut_short_anywhere_ends_as_a_whole_one_does(
    server_database_url: str,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    version: int,
    cut: int,
) -> None:
    shipped = migrations.shipped()
    online = migrations.online_statements(next(sql for v, _, sql in shipped if v == version))
    assert online is not None
    async with fresh_database(server_database_url, None) as url:
        conn = await asyncpg.connect(url)
        try:
            monkeypatch.setattr(
                migrations, "shipped", lambda: [m for m in shipped if m[0] < version]
            )
            await migrations.migrate(conn)
            for statement in online[:cut]:
                await conn.execute(statement)
            monkeypatch.setattr(migrations, "shipped", lambda: shipped)
            assert (await migrations.migrate(conn))[0].startswith(f"{version:04d}_")
        finally:
            await conn.close()
        # database_url was migrated in one go.
        assert await describe(url) == await describe(database_url)
