"""A guarded state machine for the business record a callback changes.

::

    ORDER = StateMachine(
        name="order",
        table="orders",
        transitions={
            "pending": {"paid", "closed"},
            "paid": {"refunding", "refunded"},
            "refunding": {"refunded"},
        },
    )

    async def handle(self, msg: GatewayEvent, ctx: Context) -> None:
        async with ctx.transaction() as conn:
            change = await ORDER.move(conn, msg.order_id, "paid", message_id=ctx.message_id)
        change.settle()  # not yet possible: Retry; not allowed: as the machine declares

A move is one compare-and-set (``UPDATE … WHERE key = $1 AND state = ANY(allowed_from)``), so
two copies of one callback racing each other move the record once: the second waits for the
first's row lock, finds the record already in the target state, and changes nothing. When the
row did not move, its current state says why, by the declared transitions alone:

- already there: a duplicate; success, nothing done;
- not yet possible: the target is reachable from the current state, only not in one step
  (``refunded`` while ``pending``: the ``paid`` callback is late) — retry later;
- not allowed: the target is not reachable from here (a late ``paid`` while ``refunding``) —
  recorded in the history, nothing changed.

Moves and refusals are written to ``rabbitretry.state_transition`` in the caller's transaction,
with the message id that caused them; they commit or roll back with the record's change.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from typing import Any, Literal

from rabbitretry.db import Connection, query
from rabbitretry.errors import ConfigurationError, Permanent, RabbitRetryError, Retry

ChangeKind = Literal["moved", "already-there", "not-allowed", "not-yet-possible"]


class RecordNotFound(RabbitRetryError, LookupError):
    """A state machine was asked to move a record that is not in its table."""


@dataclass(frozen=True)
class Change:
    """What :meth:`StateMachine.move` did: ``kind`` (moved, already-there, not-allowed,
    not-yet-possible), from which state (the record's state before the call) to which."""

    kind: ChangeKind
    record_key: str
    from_state: str
    to_state: str
    not_allowed: Literal["succeed", "dead"] = "succeed"
    retry_delay: float | None = None

    def settle(self) -> None:
        """Raise what the message's outcome should be: ``Retry`` when the move is not yet
        possible, ``Permanent`` when it is not allowed and the machine says ``dead``;
        return for a move, a duplicate, or a refusal the machine lets succeed."""
        what = f"{self.record_key}: {self.from_state} → {self.to_state}"
        if self.kind == "not-yet-possible":
            raise Retry(
                f"{what} is not possible yet (a callback out of order)", delay=self.retry_delay
            )
        if self.kind == "not-allowed" and self.not_allowed == "dead":
            raise Permanent(f"{what} is not allowed")


def decide(transitions: Mapping[str, Set[str]], current: str, target: str) -> ChangeKind:
    """Why a record in ``current`` cannot simply move to ``target`` (or that it may)."""
    if current == target:
        return "already-there"
    if target in transitions.get(current, ()):
        return "moved"
    if target in reachable(transitions, current):
        return "not-yet-possible"
    return "not-allowed"


def reachable(transitions: Mapping[str, Set[str]], start: str) -> set[str]:
    """The states that some sequence of declared transitions leads to from ``start``."""
    seen: set[str] = set()
    frontier = [start]
    while frontier:
        for following in transitions.get(frontier.pop(), ()):
            if following not in seen:
                seen.add(following)
                frontier.append(following)
    return seen


def quote_identifier(name: str, *, max_parts: int = 2) -> str:
    """``schema.table`` (or a ``column``: ``max_parts=1``) as a quoted SQL identifier."""
    parts = name.split(".")
    if not all(parts) or len(parts) > max_parts:
        raise ConfigurationError(f"{name!r} is not a table or column name")
    return ".".join('"' + part.replace('"', '""') + '"' for part in parts)


@dataclass(frozen=True)
class StateMachine:
    """The states of one kind of record and the transitions allowed between them.

    ``table`` holds the records, ``key_column`` identifies one, ``state_column`` holds its
    state as text. ``not_allowed`` says what :meth:`Change.settle` does with a refused
    transition: ``"succeed"`` (recorded, the message succeeds; the default) or ``"dead"``
    (a dead letter for a person). ``retry_delay``: seconds before a move that is not yet
    possible is tried again (None: the consumer's retry policy decides).
    """

    name: str
    table: str
    transitions: Mapping[str, Set[str]]
    key_column: str = "id"
    state_column: str = "state"
    not_allowed: Literal["succeed", "dead"] = "succeed"
    retry_delay: float | None = None
    states: frozenset[str] = field(init=False)
    _move_sql: str = field(init=False, repr=False)
    _read_sql: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.transitions:
            raise ConfigurationError(f"state machine {self.name!r} declares no transitions")
        frozen = {state: frozenset(targets) for state, targets in self.transitions.items()}
        object.__setattr__(self, "transitions", frozen)
        states = frozenset(frozen) | frozenset().union(*frozen.values())
        object.__setattr__(self, "states", states)
        table = quote_identifier(self.table)
        key = quote_identifier(self.key_column, max_parts=1)
        state = quote_identifier(self.state_column, max_parts=1)
        # The row lock of FOR UPDATE makes a racing second move wait, then re-check the
        # state against the committed first move: only one of them can match.
        object.__setattr__(
            self,
            "_move_sql",
            f"WITH previous AS (SELECT {key} AS k, {state} AS s FROM {table}"
            f" WHERE {key} = $1 AND {state} = ANY($2::text[]) FOR UPDATE)"
            f" UPDATE {table} SET {state} = $3 FROM previous"
            f" WHERE {table}.{key} = previous.k RETURNING previous.s",
        )
        object.__setattr__(self, "_read_sql", f"SELECT {state} FROM {table} WHERE {key} = $1")

    def allowed_from(self, target: str) -> list[str]:
        """The states with a declared transition to ``target``."""
        return sorted(state for state, targets in self.transitions.items() if target in targets)

    async def move(
        self, conn: Connection, record_key: Any, target: str, *, message_id: str
    ) -> Change:
        """Move the record to ``target`` if a declared transition allows it; what happened.

        Call it inside ``ctx.transaction()``: the change and its history row commit with the
        message's success mark. Raises :class:`RecordNotFound` when there is no such record.
        """
        if target not in self.states:
            raise ConfigurationError(f"state machine {self.name!r} has no state {target!r}")
        previous = await conn.fetchval(
            self._move_sql, record_key, self.allowed_from(target), target
        )
        if previous is not None:
            return await self._record(conn, "moved", record_key, previous, target, message_id)
        current = await conn.fetchval(self._read_sql, record_key)
        if current is None:
            raise RecordNotFound(f"{self.name} {record_key!r} is not in {self.table}")
        kind = decide(self.transitions, current, target)
        if kind == "moved":  # the row changed between the two statements; the caller retries
            kind = "not-yet-possible"
        if kind == "not-allowed":
            return await self._record(conn, kind, record_key, current, target, message_id)
        return self._change(kind, record_key, current, target)

    async def history(self, conn: Connection, record_key: Any) -> list[dict[str, Any]]:
        """The record's moves and refusals, oldest first."""
        rows = await conn.fetch(query("state_transition_history"), self.name, str(record_key))
        return [dict(row) for row in rows]

    async def _record(
        self,
        conn: Connection,
        kind: ChangeKind,
        record_key: Any,
        from_state: str,
        target: str,
        message_id: str,
    ) -> Change:
        await conn.execute(
            query("state_transition_record"),
            self.name,
            str(record_key),
            from_state,
            target,
            kind,
            message_id,
        )
        return self._change(kind, record_key, from_state, target)

    def _change(self, kind: ChangeKind, record_key: Any, from_state: str, target: str) -> Change:
        return Change(
            kind=kind,
            record_key=str(record_key),
            from_state=from_state,
            to_state=target,
            not_allowed=self.not_allowed,
            retry_delay=self.retry_delay,
        )
