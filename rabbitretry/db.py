"""The one module that talks to asyncpg: pools, named queries, and what a database's errors
mean (an outage, a refusal of this row, a lost race)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
from collections.abc import AsyncIterator
from functools import cache
from importlib import resources
from typing import Any

import asyncpg
import asyncpg.pool
import asyncpg.transaction

from rabbitretry import logs, urls
from rabbitretry.errors import ConfigurationError, ServiceUnavailable

__all__ = [
    "Answering",
    "Connection",
    "Executor",
    "Pool",
    "PooledConnection",
    "Record",
    "Transaction",
    "create_pool",
    "held",
    "query",
]

Pool = asyncpg.Pool
PooledConnection = asyncpg.pool.PoolConnectionProxy
Connection = asyncpg.Connection | PooledConnection
Transaction = asyncpg.transaction.Transaction
Record = asyncpg.Record

# What a statement raises against a database whose schema rabbitretry has not migrated.
MISSING_SCHEMA = (
    asyncpg.UndefinedTableError,
    asyncpg.UndefinedColumnError,
    asyncpg.UndefinedFunctionError,
    asyncpg.InvalidSchemaNameError,
)

# Every session of a pool made here: the ledger's statements are written for READ COMMITTED
# (a row another transaction changed is re-read, not a serialization failure), whatever
# the database's default (a server or database set to REPEATABLE READ). Set at connection
# start, so it costs nothing and survives the pool's RESET ALL.
SESSION_SETTINGS = {"default_transaction_isolation": "read committed"}

# What the driver raises for any failed request, or its connection's failure.
FAILED = (asyncpg.PostgresError, asyncpg.InterfaceError)

# A lock not granted within the session's lock_timeout (a migration's patience ran out).
LockNotAvailable = asyncpg.LockNotAvailableError

# What a lost or failing database connection raises.
UNAVAILABLE = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, asyncio.TimeoutError)

# The database refuses this row's data, not the request: a NUL in text, a value out of range,
# an index entry too large. Server-side data exceptions (class 22), integrity violations (23)
# and program limits (54), and what asyncpg refuses to encode before sending.
_CONTENT = (
    asyncpg.DataError,
    asyncpg.IntegrityConstraintViolationError,
    asyncpg.ProgramLimitExceededError,
    asyncpg.exceptions._base.DataError,
    UnicodeError,
    OverflowError,
)
# The database cannot be reached or is going away (an administrator's or a crash's shutdown,
# "cannot connect now" while it starts or recovers, too many connections, a full disk, no
# memory), or the statement lost a race it can win on a second try (deadlock, serialization
# failure): nothing is wrong with the request.
_OUTAGE = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.OperatorInterventionError,
    asyncpg.InsufficientResourcesError,
    asyncpg.TransactionRollbackError,
    asyncpg.InterfaceError,  # "connection is closed", and the like; not its DataError
)
# A lost race: another transaction won; the same request succeeds when it runs again.
_LOST_RACE = (asyncpg.TransactionRollbackError,)
# Where the server refuses a session to a database that does not accept connections (55000,
# a code that elsewhere names a bug in the request); the function's name is never translated.
_NO_CONNECTIONS_FUNCTION = "CheckMyDatabase"


def is_content_error(error: BaseException) -> bool:
    """True when the database refused this row's data (the same request fails every time)."""
    return isinstance(error, _CONTENT)


def is_outage(error: BaseException) -> bool:
    """True when the database is unreachable, refuses service for now, or the statement lost
    a race: the same request may succeed later."""
    if is_content_error(error):
        return False
    return isinstance(error, _OUTAGE) or refuses_service(error)


def refuses_service(error: BaseException) -> bool:
    """True for a refusal that means "not now", not "not this": the database is read-only (a
    hot standby a failover left us on, or ``default_transaction_read_only``), or it does not
    accept connections (``ALLOW_CONNECTIONS false``)."""
    if isinstance(error, asyncpg.ReadOnlySQLTransactionError):
        return True
    return isinstance(error, asyncpg.ObjectNotInPrerequisiteStateError) and (
        getattr(error, "server_source_function", None) == _NO_CONNECTIONS_FUNCTION
        or "accepting connections" in str(error)
    )


def is_lost_race(error: BaseException) -> bool:
    """True for a transaction that lost to another (serialization failure, deadlock)."""
    return isinstance(error, _LOST_RACE)


def is_unavailable(error: BaseException) -> bool:
    """An outage of the database itself, not a race a transaction lost: what a transaction
    that is not the ledger's own (the handler's) must not take for its own failure."""
    return is_outage(error) and not is_lost_race(error)


def fails_the_transaction(error: BaseException) -> bool:
    """True when the server refused a transaction's own work (its data, a constraint checked
    at commit, a lost race, a statement after an error aborted it), not the service: the
    failure of whoever wrote that transaction."""
    return isinstance(error, asyncpg.PostgresError) and not is_unavailable(error)


def is_aborted_transaction(error: BaseException) -> bool:
    """True for "current transaction is aborted": an earlier error in it was caught."""
    return isinstance(error, asyncpg.InFailedSQLTransactionError)


def outage_kind(error: BaseException) -> str:
    """What an outage error says of the database, to follow "the database is" (logs, health
    and pages)."""
    if isinstance(error, asyncpg.ReadOnlySQLTransactionError):
        return "read-only (a hot standby, or default_transaction_read_only is on)"
    if refuses_service(error):
        return "not accepting connections"
    if isinstance(error, asyncpg.CannotConnectNowError):
        return "starting up or recovering"
    if isinstance(error, asyncpg.OperatorInterventionError):
        return "shutting down (or an administrator ended the session)"
    if isinstance(error, asyncpg.TooManyConnectionsError):
        return "out of connections (too many connections for the server, database or role)"
    if isinstance(error, asyncpg.DiskFullError):
        return "out of resources (a full disk)"
    if isinstance(error, asyncpg.OutOfMemoryError):
        return "out of resources (no memory)"
    if isinstance(error, asyncpg.InsufficientResourcesError):
        return "out of resources (too many connections, a full disk or no memory)"
    if is_lost_race(error):
        return "busy (a statement lost a race with another transaction)"
    return "unreachable"


async def write_refusal(executor: Executor) -> str | None:
    """Why the database would refuse a write now (a hot standby, a read-only default); None
    when it would take one. What a probe asks, since ``SELECT 1`` succeeds on both."""
    row = await executor.fetchrow(
        "SELECT pg_is_in_recovery() AS standby,"
        " current_setting('transaction_read_only') = 'on' AS read_only"
    )
    if row is None:
        return None
    if row["standby"]:
        return "the database is read-only: it is a hot standby (in recovery)"
    if row["read_only"]:
        return "the database is read-only: default_transaction_read_only is on"
    return None


_NAME_LINE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@cache
def queries() -> dict[str, str]:
    """The statements of every ``sql/*.sql`` file (one file per concept) by name."""
    found: dict[str, str] = {}
    folder = resources.files("rabbitretry.sql")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        parts = _NAME_LINE.split(entry.read_text())
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in found:
                raise RuntimeError(f"query {name!r} is defined twice (again in {entry.name})")
            found[name] = body.strip()
    return found


def query(name: str) -> str:
    return queries()[name]


async def create_pool(url: str, *, min_size: int = 1, max_size: int = 10) -> Pool:
    """A pool to the ledger database; a clear error when it cannot be reached.

    The URL is checked before anything is tried (:func:`rabbitretry.urls.check_database_url`);
    a refused login, a database that does not exist or a port where nothing listens is a
    :class:`ServiceUnavailable` saying which, with the URL masked.
    """
    endpoint = urls.check_database_url(url)
    try:
        pool = await asyncpg.create_pool(
            url,
            min_size=min_size,
            max_size=max_size,
            command_timeout=60,
            server_settings=SESSION_SETTINGS,
        )
    except ValueError as error:  # a query parameter asyncpg cannot read (sslmode=...)
        raise ConfigurationError(
            f"the database URL {urls.mask_url(url)} is not usable: {urls.scrub(str(error), url)}"
        ) from None
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
        raise ServiceUnavailable(_why_not_connected(error, url, endpoint)) from error
    assert pool is not None
    logs.demote(["asyncpg"], _is_outage_noise)
    return pool


def _is_outage_noise(record: logging.LogRecord) -> bool:
    """The driver's lines about an outage, e.g. a traceback each time the pool fails to
    reconnect: the code that met the outage says it once, in its own words."""
    error = record.exc_info[1] if record.exc_info else None
    return error is not None and is_outage(error)


SILENT_AFTER = 10.0
"""Seconds a worker's ledger statement waits for an answer before the database is taken for
silent (a partition, a hung server): an outage. The ledger's own statements take
milliseconds; the driver's statement timeout (60 s) is for everything else."""


class DatabaseSilent(TimeoutError):
    """The database kept the connection but gave no answer in time: an outage."""


@contextlib.asynccontextmanager
async def answering(pool: Pool, within: float | None = None) -> AsyncIterator[PooledConnection]:
    """A connection of ``pool`` whose work must be answered ``within`` seconds (from the
    acquire on; :data:`SILENT_AFTER` by default): past that, the connection is terminated (see
    :func:`held`) and :class:`DatabaseSilent` raised."""
    within = SILENT_AFTER if within is None else within
    try:
        async with asyncio.timeout(within):
            async with held(pool) as connection:
                yield connection
    except TimeoutError as error:
        raise DatabaseSilent(f"the database gave no answer within {within:g} s") from error


@contextlib.asynccontextmanager
async def answered(connection: Connection, within: float | None = None) -> AsyncIterator[None]:
    """Statements on ``connection`` inside the block must be answered ``within`` seconds
    (:data:`SILENT_AFTER` by default): past that, the connection is terminated (a silent
    database would answer neither the statement nor its cancel) and :class:`DatabaseSilent`
    raised."""
    within = SILENT_AFTER if within is None else within
    try:
        async with asyncio.timeout(within):
            yield
    except TimeoutError as error:
        connection.terminate()
        raise DatabaseSilent(f"the database gave no answer within {within:g} s") from error


class Answering:
    """The statements of ``pool``, each answered within :data:`SILENT_AFTER` or given up as
    :class:`DatabaseSilent` (see :func:`answering`): an executor for background work (the
    reconciler) that must take a silent database for an outage and try again later, rather
    than wait for the driver's statement timeout with a pooled connection tied up."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def fetch(self, sql: str, *args: object) -> list[Record]:
        async with answering(self.pool) as connection:
            return await connection.fetch(sql, *args)

    async def fetchrow(self, sql: str, *args: object) -> Record | None:
        async with answering(self.pool) as connection:
            return await connection.fetchrow(sql, *args)

    async def fetchval(self, sql: str, *args: object) -> Any:
        async with answering(self.pool) as connection:
            return await connection.fetchval(sql, *args)

    async def execute(self, sql: str, *args: object) -> str:
        async with answering(self.pool) as connection:
            return await connection.execute(sql, *args)


Executor = Pool | Connection | Answering  # anything that runs a statement


@contextlib.asynccontextmanager
async def answered_transaction(connection: Connection) -> AsyncIterator[None]:
    """A transaction on ``connection`` whose start, commit and rollback are each answered
    within :data:`SILENT_AFTER` (see :func:`answered`). The statements inside bound
    themselves, so that slow work between them (publishing) is not cut short."""
    transaction = connection.transaction()
    async with answered(connection):
        await transaction.start()
    try:
        yield
    except BaseException:
        if not connection.is_closed():  # terminated by a silent statement: nothing to undo
            with contextlib.suppress(Exception):
                async with answered(connection):
                    await transaction.rollback()
        raise
    async with answered(connection):
        await transaction.commit()


@contextlib.asynccontextmanager
async def held(pool: Pool) -> AsyncIterator[PooledConnection]:
    """A connection of ``pool`` for work bounded from outside (``asyncio.timeout``): when the
    work is cancelled, the connection is terminated, not given back.

    Given back, a connection cancelled mid-statement makes the pool wait for the server to
    confirm the cancel, then reset the session; a silent database (a partition, a hung server)
    answers neither, so the release would wait for the statement timeout, and the pool's
    connections would all end up stuck in it. Terminated, it is replaced by a new one on a
    later request, once the database answers again.
    """
    connection = await pool.acquire()
    try:
        yield connection
    except asyncio.CancelledError:
        connection.terminate()
        raise
    finally:
        await pool.release(connection)


def _why_not_connected(error: Exception, url: str, endpoint: urls.Endpoint) -> str:
    """One sentence for a failed connection: what the server said, in its terms."""
    where = f"cannot connect to PostgreSQL at {urls.mask_url(url)}"
    text = urls.scrub(str(error) or type(error).__name__, url)
    check = "is RABBITRETRY_DATABASE_URL right?"
    if isinstance(error, asyncpg.InvalidPasswordError):
        return (
            f"{where}: the server refused the password of user {endpoint.user!r}: the "
            "password in RABBITRETRY_DATABASE_URL is wrong"
        )
    if isinstance(error, asyncpg.InvalidAuthorizationSpecificationError):
        return (
            f"{where}: the server refused the login ({text}); check the user in "
            "RABBITRETRY_DATABASE_URL and the server's pg_hba.conf"
        )
    if isinstance(error, asyncpg.InvalidCatalogNameError):
        return (
            f"{where}: database {endpoint.path!r} does not exist; create it (createdb "
            f"{endpoint.path}) or fix the database in RABBITRETRY_DATABASE_URL"
        )
    if isinstance(error, ConnectionRefusedError):
        return (
            f"{where}: nothing listens on {endpoint.address} (connection refused); is the "
            f"server running, and {check}"
        )
    if isinstance(error, socket.gaierror):
        return f"{where}: host not found ({text}); is the host in RABBITRETRY_DATABASE_URL right?"
    if isinstance(error, TimeoutError):
        return f"{where}: no answer in time; is the server running, and {check}"
    return f"{where}: {text}. Is the server running, and {check}"
