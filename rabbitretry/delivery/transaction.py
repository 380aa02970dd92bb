"""The handler's database transaction, committed together with the ledger's success mark.

``ctx.transaction()`` hands the handler a connection in an open transaction on the ledger's
database. The transaction does not commit when the ``async with`` block ends: it commits after
the handler returns, in the same transaction as the ledger's ``succeeded`` mark. So either both
the effects and the mark are durable, or neither is; and a redelivered copy of a message whose
effects committed finds ``succeeded`` and is dropped. That makes the handler's database effects
happen exactly once.

The transaction runs at READ COMMITTED, whatever the database's default: the success mark
updates the ledger row that the lease renewals update meanwhile, which a REPEATABLE READ or
SERIALIZABLE snapshot taken before a renewal could never do. (A handler that needs a stricter
level for its own statements can still ``SET TRANSACTION ISOLATION LEVEL`` first thing.)

A transaction that cannot commit (an error caught inside the block, which aborts it; a
deferred constraint; a serialization failure) is the attempt's failure, raised as
:class:`CommitFailed` with the database's own error, never taken for an outage of the ledger.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

from rabbitretry import db
from rabbitretry.db import Connection, Pool, PooledConnection, Transaction
from rabbitretry.errors import TransactionRolledBack

ISOLATION: Final = "read_committed"


class CommitFailed(Exception):
    """The handler's transaction could not commit: ``error`` is the database's own reason."""

    def __init__(self, error: BaseException, *, swallowed: bool) -> None:
        super().__init__(str(error))
        self.error = error
        self.swallowed = swallowed
        """True when ``error`` was raised inside the block and caught there, which aborted
        the transaction; the commit then only said "current transaction is aborted"."""


class AttemptTransaction:
    """At most one transaction per attempt, opened on first use (nested uses are savepoints)."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._conn: PooledConnection | None = None
        self._transaction: Transaction | None = None
        self.rolled_back_by: BaseException | None = None
        # The last error a statement of this transaction met, even one the handler caught:
        # after it, PostgreSQL answers only "current transaction is aborted".
        self._last_error: BaseException | None = None

    @property
    def open(self) -> bool:
        return self._transaction is not None

    @contextlib.asynccontextmanager
    async def scope(self) -> AsyncIterator[Connection]:
        if self.rolled_back_by is not None:
            raise TransactionRolledBack(
                f"this attempt's transaction already rolled back ({self.rolled_back_by!r})"
            )
        if self._conn is not None:
            async with self._conn.transaction():  # a savepoint inside the attempt's transaction
                yield self._conn
            return
        self._conn = await self._pool.acquire()
        self._conn.add_query_logger(self._note)
        transaction = self._conn.transaction(isolation=ISOLATION)
        await transaction.start()
        self._transaction = transaction
        try:
            yield self._conn
        except BaseException as error:
            self.rolled_back_by = error
            await self.close()
            raise

    def _note(self, record: Any) -> None:
        """asyncpg's query logger: keep the last error that a statement met (not the echoes
        of an aborted transaction)."""
        error = record.exception
        if (
            error is not None
            and db.fails_the_transaction(error)
            and not db.is_aborted_transaction(error)
        ):
            self._last_error = error

    async def commit_with(self, mark: Callable[[Connection], Awaitable[bool]]) -> bool:
        """Run ``mark`` (the ledger's success mark) in the transaction; commit if it holds.

        ``mark`` returning False means the attempt lost its claim to another one: the effects
        are rolled back so they cannot happen twice. A transaction the database refuses to
        commit raises :class:`CommitFailed`; an outage of the database raises as it came.
        """
        assert self._conn is not None and self._transaction is not None
        try:
            if await mark(self._conn):
                await self._transaction.commit()
                self._transaction = None
                return True
            return False
        except Exception as error:
            if not db.fails_the_transaction(error):
                raise
            raise await self._failed_commit(error) from error
        finally:
            await self.close()

    async def _failed_commit(self, error: BaseException) -> CommitFailed:
        if db.is_aborted_transaction(error):
            await asyncio.sleep(0)  # the query logger is called soon after, not at once
            cause = self._last_error
            if cause is not None:
                cause.add_note(
                    "caught inside ctx.transaction() and the block went on: the transaction "
                    "was aborted, nothing of it committed"
                )
                return CommitFailed(cause, swallowed=True)
        return CommitFailed(error, swallowed=False)

    async def close(self) -> None:
        """Roll back whatever is still open and give the connection back."""
        try:
            if self._transaction is not None:
                transaction, self._transaction = self._transaction, None
                with contextlib.suppress(Exception):
                    await transaction.rollback()
        finally:
            if self._conn is not None:
                conn, self._conn = self._conn, None
                conn.remove_query_logger(self._note)
                await self._pool.release(conn)
