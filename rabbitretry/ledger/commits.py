"""Commit groups: the ledger writes of concurrent attempts, committed together.

Every commit that must be durable waits for PostgreSQL to flush its WAL to disk. With one
statement and one commit per claim and per success mark, a worker at concurrency N pays
for 2N commits at a time, and on a small machine the database spends its time committing.
A :class:`CommitGroup` collects the writes that arrive while the previous group is being
written and sends them as one statement over arrays, in one transaction: one round trip and
one flush for many messages.

Nothing is acked earlier than before: each caller still waits for *its* write to commit
(its future resolves only after the group's commit returns), so the ledger is durable before
the broker hears anything. A lone write goes out at once (no timer, no added latency at low
load); writes queue only while ``WRITERS`` groups are already on their way (two, so that
one group's flush overlaps the next one's statement). The writer keeps its pooled
connection while writes keep coming (and ``LINGER`` seconds more), so a steady stream of
writes does not pay for the pool's reset query each time. The claims, start marks and
success marks of one pool share their writers (a :class:`Lane`), so that a claim and the
success mark after it go over one connection.

If a group fails as a whole (a deadlock between groups of two workers, one row breaking a
constraint, a lost connection), each of its writes is retried on its own, so one bad write
never fails the others and the error each caller sees is its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from rabbitretry import db
from rabbitretry.db import Connection, DatabaseSilent, Pool, query
from rabbitretry.ledger import statements
from rabbitretry.ledger.statements import Claim, Key, Snapshot
from rabbitretry.message.storable import encode_table

Request = TypeVar("Request")
Result = TypeVar("Result")

MAX_GROUP = 256  # writes in one statement: bounds its size and the time its locks are held
LINGER = 0.05  # seconds a writer keeps its connection, waiting for the next write
WRITERS = 2  # groups in flight at once: one flushes while the next one runs


class Lane:
    """The writers of one pool's commit groups: up to ``writers`` at once, each on one
    connection, writing every group's waiting writes in turn.

    Sharing the writers keeps a claim and the success mark after it on one connection, and
    so on one database session: at low concurrency each write wakes a session that sleeps,
    and waking the same one costs less than waking one per kind of write.
    """

    def __init__(self, pool: Pool, writers: int = WRITERS) -> None:
        self._pool = pool
        self._groups: list[CommitGroup[Any, Any]] = []
        self._max_writers = writers
        self._writers: set[asyncio.Task[None]] = set()
        self._idle = 0  # writers waiting for work on their connection
        self._sleepers: list[asyncio.Future[None]] = []  # what wakes the idle writers

    def add(self, group: CommitGroup[Any, Any]) -> None:
        self._groups.append(group)

    def wake(self) -> None:
        """A write is waiting: an idle writer takes it, or a new writer if there is room."""
        for sleeper in self._sleepers:
            _wake(sleeper)
        self._sleepers.clear()
        if self._idle == 0 and len(self._writers) < self._max_writers:
            writer = asyncio.create_task(self._write_all())
            self._writers.add(writer)
            writer.add_done_callback(self._writers.discard)

    def _waiting(self) -> bool:
        return any(group.waiting for group in self._groups)

    async def _write_all(self) -> None:
        try:
            # Writes that arrive while the connection is being handed back find this task
            # still running, so it looks again before it ends.
            while self._waiting():
                # One connection while writes keep coming: a pool hands each connection
                # back with a reset query, a round trip per write otherwise.
                async with self._pool.acquire(timeout=db.SILENT_AFTER) as conn:
                    while await self._more_soon() and not conn.is_closed():
                        for group in self._groups:
                            if conn.is_closed():
                                break  # the writes still waiting go on a new connection
                            await group.write_waiting(conn)
        except BaseException as error:
            # No connection (the database is away), or cancelled with the event loop: every
            # waiting caller gets the error rather than waiting forever.
            for group in self._groups:
                group.fail_waiting(error)
            if not isinstance(error, Exception):
                raise

    async def _more_soon(self) -> bool:
        """True once a write is waiting; False after ``LINGER`` seconds without one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LINGER
        while not self._waiting():  # another idle writer may take what woke this one
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            # A bare future and a timer: the cheapest wait there is (an Event with wait_for
            # costs a task per wait, and there is a wait per write at low concurrency).
            sleeper: asyncio.Future[None] = loop.create_future()
            self._sleepers.append(sleeper)
            timer = loop.call_later(remaining, _wake, sleeper)
            self._idle += 1
            try:
                await sleeper
            finally:
                self._idle -= 1
                timer.cancel()
                if sleeper in self._sleepers:
                    self._sleepers.remove(sleeper)
        return True


class CommitGroup(Generic[Request, Result]):
    """Runs submitted writes in groups, written by the writers of its :class:`Lane`."""

    def __init__(
        self,
        lane: Lane,
        run_group: Callable[[Connection, Sequence[Request]], Awaitable[list[Result]]],
        run_one: Callable[[Connection, Request], Awaitable[Result]],
        max_group: int = MAX_GROUP,
        *,
        outlive_callers: bool = False,
    ) -> None:
        self._lane = lane
        self._run_group = run_group
        self._run_one = run_one
        self._max_group = max_group
        self._waiting: list[tuple[Request, asyncio.Future[Result]]] = []
        self._future = _Kept if outlive_callers else asyncio.Future
        lane.add(self)

    async def submit(self, request: Request) -> Result:
        """Write ``request`` with the next group; returns once that group has committed."""
        return await self.enqueue(request)

    def enqueue(self, request: Request) -> asyncio.Future[Result]:
        """Queue ``request`` for the next group: the future of its result, set on commit
        (with ``outlive_callers``, a caller's cancellation reaches it only once it is set)."""
        future: asyncio.Future[Result] = self._future(loop=asyncio.get_running_loop())
        self._waiting.append((request, future))
        self._lane.wake()
        return future

    @property
    def waiting(self) -> bool:
        return bool(self._waiting)

    async def write_waiting(self, conn: Connection) -> None:
        """Write the writes waiting now (up to ``max_group``) as one group on ``conn``."""
        if not self._waiting:
            return
        group = self._waiting[: self._max_group]
        del self._waiting[: self._max_group]
        try:
            await self._write(conn, group)
        except BaseException as error:
            _fail(group, error)
            raise

    def fail_waiting(self, error: BaseException) -> None:
        """Fail the writes still waiting with ``error`` (a cancellation cancels them)."""
        _fail(self._waiting, error)
        self._waiting.clear()

    async def _write(
        self, conn: Connection, group: list[tuple[Request, asyncio.Future[Result]]]
    ) -> None:
        requests = [request for request, _ in group]
        outcomes: list[Result | BaseException] = []
        # A silent database may never answer: past SILENT_AFTER the connection is terminated,
        # which fails the statement, and the writes of the group are an outage for their
        # callers. (A bare timer: this runs for every write, and asyncio.timeout costs more.)
        silenced: list[bool] = []
        watch = asyncio.get_running_loop().call_later(db.SILENT_AFTER, _silence, conn, silenced)
        try:
            outcomes = list(await self._statement(conn, requests))
        except Exception as error:
            if silenced:
                silent = DatabaseSilent(f"the database gave no answer within {db.SILENT_AFTER:g} s")
                outcomes = [silent] * len(requests)
            elif len(requests) == 1:
                outcomes = [error]
            else:
                # Each write on its own: the error a caller sees is its own, if any.
                outcomes = [await _outcome(self._run_one(conn, r)) for r in requests]
        finally:
            watch.cancel()
        for (_, future), outcome in zip(group, outcomes, strict=True):
            if future.done():  # its caller was cancelled (a shutdown)
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    async def _statement(self, conn: Connection, requests: list[Request]) -> list[Result]:
        if len(requests) == 1:
            return [await self._run_one(conn, requests[0])]
        return list(await self._run_group(conn, requests))


class _Kept(asyncio.Future[Result]):
    """A write's future that its caller's cancellation does not cancel: the write may still
    commit. The caller's task is cancelled once the future is set, and can then read what
    the write did (cheaper than ``asyncio.shield``, which costs a turn of the event loop)."""

    def cancel(self, msg: Any = None) -> bool:
        return False


def _fail(writes: Sequence[tuple[Any, asyncio.Future[Any]]], error: BaseException) -> None:
    for _, future in writes:
        if future.done():
            continue
        if isinstance(error, Exception):
            future.set_exception(error)
        else:
            asyncio.Future.cancel(future)  # a future that outlives its caller too


def _silence(conn: Connection, silenced: list[bool]) -> None:
    silenced.append(True)
    conn.terminate()


def _wake(sleeper: asyncio.Future[None]) -> None:
    if not sleeper.done():
        sleeper.set_result(None)


async def _outcome(write: Awaitable[Result]) -> Result | BaseException:
    try:
        return await write
    except Exception as error:
        return error


@dataclass(frozen=True)
class ClaimRequest:
    key: Key
    max_attempts: int
    lease_seconds: float
    worker: str
    copy_attempts: int
    snapshot: Snapshot


@dataclass(frozen=True)
class AttemptRef:
    """One attempt of a key: what a success mark or a start mark names."""

    key: Key
    attempt: int


@dataclass(frozen=True)
class Success:
    """A success mark: the attempt, and whether its message keeps its snapshot."""

    key: Key
    attempt: int
    keep_snapshot: bool = False


class LedgerCommits:
    """The commit groups of one ledger pool (claims, start marks, and success marks without
    effects), sharing one lane of writers."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        lane = Lane(pool)
        self.claims: CommitGroup[ClaimRequest, Claim] = CommitGroup(
            lane, _claim_group, _claim_one, outlive_callers=True
        )
        self.starts: CommitGroup[AttemptRef, bool] = CommitGroup(
            lane, _marks_group("batching_started_many"), _start_one
        )
        self.successes: CommitGroup[Success, bool] = CommitGroup(
            lane, _successes_group, _success_one
        )


async def _claim_one(conn: Connection, r: ClaimRequest) -> Claim:
    return await statements.claim(
        conn,
        r.key,
        max_attempts=r.max_attempts,
        lease_seconds=r.lease_seconds,
        worker=r.worker,
        copy_attempts=r.copy_attempts,
        snapshot=r.snapshot,
        statement="batching_claim",
    )


async def _claim_group(conn: Connection, requests: Sequence[ClaimRequest]) -> list[Claim]:
    # Sorted by key, so that two groups lock the same rows in the same order. The keys new to
    # the ledger are inserted without ON CONFLICT (migration 0022): one that another
    # transaction inserted meanwhile fails the group, whose claims are then made one by one.
    order = sorted(range(len(requests)), key=lambda i: _key_order(requests[i].key))
    rs = [requests[i] for i in order]
    rows = await conn.fetch(
        query("batching_claim_many"),
        [r.key.queue for r in rs],
        [r.key.message_id for r in rs],
        [r.max_attempts for r in rs],
        [r.lease_seconds for r in rs],
        [r.worker for r in rs],
        [r.copy_attempts for r in rs],
        [r.snapshot.body for r in rs],
        [encode_table(r.snapshot.headers) for r in rs],
        [encode_table(r.snapshot.properties) for r in rs],
        [r.snapshot.exchange for r in rs],
        [r.snapshot.routing_key for r in rs],
    )
    claims: list[Claim | None] = [None] * len(requests)
    for row in rows:
        claims[order[row["ord"] - 1]] = statements.claim_of(row)
    if any(c is None for c in claims):
        raise RuntimeError("a grouped claim returned fewer rows than it was given")
    return [c for c in claims if c is not None]


async def _start_one(conn: Connection, r: AttemptRef) -> bool:
    return await statements.mark_started(conn, r.key, r.attempt)


async def _success_one(conn: Connection, r: Success) -> bool:
    return await statements.finish(
        conn, r.key, r.attempt, "succeeded", keep_snapshot=r.keep_snapshot
    )


async def _successes_group(conn: Connection, requests: Sequence[Success]) -> list[bool]:
    rs = sorted(requests, key=lambda r: _key_order(r.key))
    rows = await conn.fetch(
        query("batching_succeeded_many"),
        [r.key.queue for r in rs],
        [r.key.message_id for r in rs],
        [r.attempt for r in rs],
        [r.keep_snapshot for r in rs],
    )
    return _marked(rows, requests)


def _marks_group(
    statement: str,
) -> Callable[[Connection, Sequence[AttemptRef]], Awaitable[list[bool]]]:
    """A group of marks of attempts by ``statement``, which returns the attempts it marked
    (one missing was no longer current)."""

    async def run(conn: Connection, requests: Sequence[AttemptRef]) -> list[bool]:
        rs = sorted(requests, key=lambda r: _key_order(r.key))
        rows = await conn.fetch(
            query(statement),
            [r.key.queue for r in rs],
            [r.key.message_id for r in rs],
            [r.attempt for r in rs],
        )
        return _marked(rows, requests)

    return run


def _marked(rows: Sequence[Any], requests: Sequence[AttemptRef | Success]) -> list[bool]:
    """Whether each request's attempt is among the ``rows`` a group statement marked."""
    marked = {(row["queue"], row["message_id"], row["attempt"]) for row in rows}
    return [(r.key.queue, r.key.message_id, r.attempt) in marked for r in requests]


def _key_order(key: Key) -> tuple[str, str]:
    return (key.queue, key.message_id)


_by_pool: dict[int, LedgerCommits] = {}


def commits_for(pool: Pool) -> LedgerCommits:
    """The commit groups shared by every consumer of ``pool`` (one worker's ledger pool)."""
    for pool_id, known in list(_by_pool.items()):
        if known.pool.is_closing():
            del _by_pool[pool_id]
    commits = _by_pool.get(id(pool))
    if commits is None or commits.pool is not pool:
        commits = _by_pool[id(pool)] = LedgerCommits(pool)
    return commits
