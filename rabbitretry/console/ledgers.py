"""The ledger databases a console shows: one, or several (``console --database`` repeated).

Each database has a short label (:func:`rabbitretry.urls.database_labels`: its name, never its
password) that every row and panel from it carries, and that every link and form from it
sends back, so that an action goes to the database its row came from. A database that cannot
be reached is left out of a page, which says so, and the console answers for the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from rabbitretry import db, urls
from rabbitretry.console.replay_jobs import Jobs
from rabbitretry.errors import ServiceUnavailable
from rabbitretry.operations import OperationError

T = TypeVar("T")


@dataclass(frozen=True)
class Ledger:
    label: str
    url: str
    pool: db.Pool
    jobs: Jobs
    """Replays of this database's messages, kept in this database."""


@dataclass(frozen=True)
class Down:
    """A database a page could not read, and why, in one line."""

    label: str
    message: str


class Ledgers:
    """The console's databases, the first one first (the default, where a login's revocation
    is looked up first)."""

    def __init__(self, ledgers: list[Ledger]) -> None:
        self._ledgers = ledgers
        self._by_label = {ledger.label: ledger for ledger in ledgers}

    def __iter__(self) -> Iterator[Ledger]:
        return iter(self._ledgers)

    def __len__(self) -> int:
        return len(self._ledgers)

    @property
    def first(self) -> Ledger:
        return self._ledgers[0]

    @property
    def several(self) -> bool:
        return len(self._ledgers) > 1

    def get(self, label: str | None) -> Ledger:
        """The database a link or a form names (none: the first, as with one database)."""
        if not label:
            return self._ledgers[0]
        found = self._by_label.get(label)
        if found is None:
            raise OperationError(
                f"this console shows no database {label[:64]!r}: "
                f"it shows {', '.join(self._by_label)}"
            )
        return found

    def only(self, label: str) -> Ledgers:
        """The one database ``label`` names, as a set of one."""
        return Ledgers([self.get(label)])

    async def each(
        self, read: Callable[[Ledger], Awaitable[T]]
    ) -> tuple[list[tuple[Ledger, T]], list[Down]]:
        """``read`` of every database at once: what each answered, in the databases' order,
        and the databases that could not be read (an outage, not a bug: a bug raises)."""
        answers = await asyncio.gather(
            *(read(ledger) for ledger in self._ledgers), return_exceptions=True
        )
        read_ok: list[tuple[Ledger, T]] = []
        down: list[Down] = []
        for ledger, answer in zip(self._ledgers, answers, strict=True):
            if isinstance(answer, BaseException):
                if not self.several or not unreachable(answer):
                    raise answer  # one database: its outage is the page's (a 503)
                down.append(Down(ledger.label, outage_message(ledger.url, answer)))
            else:
                read_ok.append((ledger, answer))
        return read_ok, down

    async def close(self) -> None:
        for ledger in self._ledgers:
            await ledger.jobs.close()
            await ledger.pool.close()


def unreachable(error: BaseException) -> bool:
    """An error that says the database cannot be used now (not a mistake in the request)."""
    if isinstance(error, ServiceUnavailable):
        return True
    return isinstance(error, db.UNAVAILABLE) and db.is_outage(error)


def outage_message(url: str, error: BaseException) -> str:
    """One line: which ledger cannot be reached or refuses service now, and why, URL masked."""
    what = urls.scrub(str(error) or type(error).__name__, url).splitlines()[0]
    kind = db.outage_kind(error) if isinstance(error, db.UNAVAILABLE) else "unreachable"
    if kind == "unreachable":
        return f"cannot reach the ledger at {urls.mask_url(url)} ({what}); try again in a moment"
    return f"the ledger at {urls.mask_url(url)} is {kind}: {what}; try again in a moment"


async def open_ledgers(database_urls: tuple[str, ...]) -> Ledgers:
    """A pool (and the replay jobs) per database; each label from the URLs."""
    labels = urls.database_labels(database_urls)
    opened: list[Ledger] = []
    try:
        for url in labels:
            pool = await db.create_pool(url, min_size=1, max_size=4)
            opened.append(Ledger(labels[url], url, pool, Jobs(pool)))
    except BaseException:
        await Ledgers(opened).close()
        raise
    return Ledgers(opened)
