"""Start marks, written in the very step of the event loop that starts their handler.

An attempt counts from its start mark on: a worker that dies after the mark has spent an
attempt, one that dies before it has not (the claim is given back). So nothing may run between
the mark leaving the worker and its handler's first line. A mark sent by another task (a
commit group's writer) is not enough: its caller would resume on a later turn of the loop,
after whatever was already queued, and a neighbour that ends the process meanwhile (a handler
calling ``os._exit``, a native crash) would leave an attempt charged whose handler never ran.

So each mark is written by the delivery's own task, over a connection of its own (a *line*)
on which the mark statement is prepared: executing a prepared statement writes it to the
socket before it first waits, and :func:`first_step_now` runs that write before returning.
The caller then starts its handler without yielding. The mark's commit is not waited for
(the handler's run overlaps it; the attempt's final write sees its outcome).

A line is kept while marks keep coming and handed back to the pool ``LINGER`` seconds after
its last one, so a steady stream pays for neither the pool's reset query nor a new prepare.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rabbitretry import db
from rabbitretry.db import Pool, PooledConnection, PreparedStatement, query
from rabbitretry.ledger.statements import Key

T = TypeVar("T")

LINGER = 0.05  # seconds an idle line is kept for the next mark


@dataclass(eq=False)
class _Line:
    connection: PooledConnection
    statement: PreparedStatement
    retire: asyncio.TimerHandle | None = field(default=None)


class StartMarks:
    """The start marks of one pool's attempts, each on a line of its own."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._idle: list[_Line] = []
        self._releases: set[asyncio.Task[None]] = set()

    async def line(self) -> _Line:
        """A line ready for a mark: an idle one, else a new connection with the mark
        prepared (that round trip happens here, before anything is written)."""
        while self._idle:
            line = self._idle.pop()
            if line.retire is not None:
                line.retire.cancel()
            if not line.connection.is_closed():
                return line
            self._release(line)
        connection = await self._pool.acquire(timeout=db.SILENT_AFTER)
        try:
            async with db.answered(connection):
                statement = await connection.prepare(query("mark_started"))
        except BaseException:
            await self._pool.release(connection)
            raise
        return _Line(connection, statement)

    def write(self, line: _Line, key: Key, attempt: int) -> asyncio.Future[bool]:
        """Write the mark of ``attempt`` on ``line`` before returning; the future of its
        result (False: the attempt was no longer ours), already failed if it could not be
        written. Cancelling the future does not cancel the mark."""
        return first_step_now(self._mark(line, key, attempt))

    async def _mark(self, line: _Line, key: Key, attempt: int) -> bool:
        # A silent database may never answer: past SILENT_AFTER the line is terminated, which
        # fails the mark; the attempt's final write meets the same outage.
        watch = asyncio.get_running_loop().call_later(db.SILENT_AFTER, line.connection.terminate)
        try:
            row = await line.statement.fetchval(key.queue, key.message_id, attempt)
        except BaseException:
            self._release(line)  # in an unknown state: the pool resets or replaces it
            raise
        finally:
            watch.cancel()
        self._idle.append(line)
        line.retire = asyncio.get_running_loop().call_later(LINGER, self._retire, line)
        return row is not None

    def _retire(self, line: _Line) -> None:
        if line in self._idle:
            self._idle.remove(line)
            self._release(line)

    def _release(self, line: _Line) -> None:
        release = asyncio.ensure_future(self._pool.release(line.connection))
        self._releases.add(release)
        release.add_done_callback(self._releases.discard)


def first_step_now(coroutine: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
    """Run ``coroutine`` up to its first wait now, in the caller's step; a task runs the rest
    once what it waits for is done. The future of its result, already failed if the first
    step raised. (A task, even a new one, would start it on a later turn of the loop.)"""
    loop = asyncio.get_running_loop()
    result: asyncio.Future[T] = loop.create_future()
    try:
        waited = coroutine.send(None)
    except StopIteration as finished:
        result.set_result(finished.value)
        return result
    except Exception as error:
        result.set_exception(error)
        return result

    def rest(_: object = None) -> None:
        # Resumed by a task, the coroutine finds what it waited for done and goes on.
        task = loop.create_task(coroutine)
        task.add_done_callback(lambda done: _copy_outcome(done, result))

    if asyncio.isfuture(waited):
        waited._asyncio_future_blocking = False  # taken up here, as a task would
        waited.add_done_callback(rest)
    else:  # a bare yield (asyncio.sleep(0)): go on at the next turn
        loop.call_soon(rest)
    return result


def _copy_outcome(done: asyncio.Future[T], into: asyncio.Future[T]) -> None:
    if into.done():
        return
    if done.cancelled():
        into.cancel()
    elif (error := done.exception()) is not None:
        into.set_exception(error)
    else:
        into.set_result(done.result())
