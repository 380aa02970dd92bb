"""The handler's database transaction, committed together with the ledger's success mark.

``ctx.transaction()`` hands the handler a connection in an open transaction on the ledger's
database. The transaction does not commit when the ``async with`` block ends: it commits after
the handler returns, in the same transaction as the ledger's ``succeeded`` mark. So either both
the effects and the mark are durable, or neither is; and a redelivered copy of a message whose
effects committed finds ``succeeded`` and is dropped. That makes the handler's database effects
happen exactly once.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from rabbitretry.db import Connection, Pool, PooledConnection, Transaction
from rabbitretry.errors import TransactionRolledBack


class AttemptTransaction:
    """At most one transaction per attempt, opened on first use (nested uses are savepoints)."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._conn: PooledConnection | None = None
        self._transaction: Transaction | None = None
        self.rolled_back_by: BaseException | None = None

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
        transaction = self._conn.transaction()
        await transaction.start()
        self._transaction = transaction
        try:
            yield self._conn
        except BaseException as error:
            self.rolled_back_by = error
            await self.close()
            raise

    async def commit_with(self, mark: Callable[[Connection], Awaitable[bool]]) -> bool:
        """Run ``mark`` (the ledger's success mark) in the transaction; commit if it holds.

        ``mark`` returning False means the attempt lost its claim to another one: the effects
        are rolled back so they cannot happen twice.
        """
        assert self._conn is not None and self._transaction is not None
        try:
            if await mark(self._conn):
                await self._transaction.commit()
                self._transaction = None
                return True
            return False
        finally:
            await self.close()

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
                await self._pool.release(conn)
