"""The downstream breakers' rows (``rabbitretry.downstream``): typed calls over
``sql/downstreams.sql``.

A breaker's transitions are single statements (functions that lock the breaker's row), so
workers racing on one breaker see one order of events: one failure trips it, one worker holds
its probe, one success closes it. The trip forgives, in the same transaction, the attempts
that the failures which tripped it charged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rabbitretry.db import Executor, Record, query
from rabbitretry.downstream import Downstream
from rabbitretry.ledger.statements import Key

State = Literal["closed", "open", "half-open"]


@dataclass(frozen=True)
class Failed:
    """A breaker after a failure was counted."""

    state: State
    failures: int
    opened: bool
    """This failure opened it."""
    forgiven: int
    """Attempts forgiven by the trip (charged by the failures that tripped it)."""


@dataclass(frozen=True)
class View:
    """A breaker as one worker sees it."""

    state: State
    failures: int
    probe_worker: str | None
    probe_due: bool


async def failed(
    executor: Executor, downstream: Downstream, worker: str, error: str, key: Key, attempt: int
) -> Failed:
    """Count a failure of ``downstream`` met by ``attempt`` of ``key`` (whose verdict, when it
    was charged, is already written: the trip forgives it with the others)."""
    row = await executor.fetchrow(
        query("downstream_failed"),
        downstream.name,
        worker,
        downstream.failure_threshold,
        downstream.failure_window,
        downstream.first_pause,
        downstream.max_pause,
        error,
        key.queue,
        key.message_id,
        attempt,
    )
    assert row is not None
    return Failed(row["state"], row["failures"], row["opened"], row["forgiven"])


async def succeeded(executor: Executor, name: str, worker: str) -> State:
    state: State = await executor.fetchval(query("downstream_succeeded"), name, worker)
    return state


async def declare(executor: Executor, names: Sequence[str], queue: str) -> None:
    """Record that the handlers of ``queue`` call the downstreams ``names``."""
    await executor.execute(query("downstream_declare"), list(names), queue)


async def members(
    executor: Executor, names: Sequence[str], worker: str, within: float
) -> dict[str, tuple[int, int]]:
    """Note ``worker`` as a caller of ``names``; for each, (workers seen within ``within``
    seconds, this worker's rank among them)."""
    rows = await executor.fetch(query("downstream_members"), list(names), worker, within)
    return {row["name"]: (row["members"], row["rank"]) for row in rows}


async def views(executor: Executor, names: Sequence[str]) -> dict[str, View]:
    """The breakers of ``names`` that have a row (a downstream without one is closed)."""
    rows = await executor.fetch(query("downstream_states"), list(names))
    return {
        row["name"]: View(row["state"], row["failures"], row["probe_worker"], row["probe_due"])
        for row in rows
    }


async def take_probe(executor: Executor, name: str, worker: str, hold_seconds: float) -> bool:
    """Whether ``worker`` now holds the probe of ``name`` (for ``hold_seconds`` at most)."""
    return bool(await executor.fetchval(query("downstream_take_probe"), name, worker, hold_seconds))


async def return_probe(executor: Executor, name: str, worker: str, after: float) -> bool:
    """Give back a probe that tried nothing: the next one is due in ``after`` seconds."""
    return bool(await executor.fetchval(query("downstream_return_probe"), name, worker, after))


async def listing(executor: Executor) -> list[Record]:
    return list(await executor.fetch(query("downstream_list")))


async def force_open(executor: Executor, name: str, actor: str) -> None:
    await executor.fetchval(query("downstream_force_open"), name, actor)


async def force_close(executor: Executor, name: str, actor: str) -> bool:
    """Close ``name`` now; False if no breaker of that name has ever been recorded."""
    return bool(await executor.fetchval(query("downstream_force_close"), name, actor))


async def breakers(executor: Executor) -> list[Record]:
    """Every breaker with the work queues whose handlers call it (the operator's listing)."""
    return list(await executor.fetch(query("downstream_breakers")))


async def lock(executor: Executor, name: str) -> Record | None:
    """Breaker ``name``, locked until the caller's transaction ends (an operator's open or
    close, with its audit row); None if no breaker of that name has been recorded."""
    return await executor.fetchrow(query("downstream_lock"), name)


async def names(executor: Executor) -> list[str]:
    """The names of the breakers recorded so far."""
    return [row["name"] for row in await executor.fetch(query("downstream_names"))]
