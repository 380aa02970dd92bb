"""The drill's verdict, read from the ledger and the effects table once the work has settled.

Checks, each naming the keys that break it:

* lost: a message sent that has no ledger row, or a row that never reached a terminal state;
* wrong state: a message not in the state its kind calls for (poison and crashers dead,
  everything else succeeded);
* duplicate effects: more than one effect row for a message, or any for a dead one;
* miscounted: ``ledger.attempts`` differs from the number of attempt-log rows;
* open attempts: an attempt-log row of a finished message without an outcome.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import asyncpg

from drills.consumer import EFFECTS_TABLE
from drills.plan import Message

TERMINAL = ("succeeded", "dead", "skipped", "ignored")
SHOWN_KEYS = 20  # keys named per problem; the count is always complete


@dataclass
class Verdict:
    sent: int
    succeeded: int = 0
    dead: int = 0
    lost: list[str] = field(default_factory=list)
    wrong_state: list[str] = field(default_factory=list)
    duplicate_effects: list[str] = field(default_factory=list)
    miscounted: list[str] = field(default_factory=list)
    open_attempts: list[str] = field(default_factory=list)
    attempts: int = 0

    @property
    def problems(self) -> dict[str, list[str]]:
        found = {
            "lost": self.lost,
            "wrong state": self.wrong_state,
            "duplicate effects": self.duplicate_effects,
            "attempts miscounted": self.miscounted,
            "open attempts": self.open_attempts,
        }
        return {name: keys for name, keys in found.items() if keys}

    @property
    def ok(self) -> bool:
        return not self.problems

    def explain(self) -> list[str]:
        lines = []
        for name, keys in self.problems.items():
            shown = ", ".join(keys[:SHOWN_KEYS])
            more = f" (and {len(keys) - SHOWN_KEYS} more)" if len(keys) > SHOWN_KEYS else ""
            lines.append(f"drill: {len(keys)} {name}: {shown}{more}")
        return lines


async def unfinished(conn: asyncpg.Connection, queue: str, message_ids: Sequence[str]) -> int:
    """How many of the messages sent are not yet in a terminal state (or not in the ledger)."""
    finished: int = await conn.fetchval(
        "SELECT count(*) FROM rabbitretry.ledger"
        " WHERE queue = $1 AND message_id = ANY($2::text[]) AND status = ANY($3::text[])",
        queue,
        list(message_ids),
        list(TERMINAL),
    )
    return len(message_ids) - finished


async def verify(conn: asyncpg.Connection, queue: str, messages: Sequence[Message]) -> Verdict:
    rows = {
        row["message_id"]: row
        for row in await conn.fetch(
            "SELECT l.message_id, l.status, l.reason, l.attempts,"
            "       (SELECT count(*) FROM rabbitretry.attempt a"
            "         WHERE a.queue = l.queue AND a.message_id = l.message_id) AS logged,"
            "       (SELECT count(*) FROM rabbitretry.attempt a"
            "         WHERE a.queue = l.queue AND a.message_id = l.message_id"
            "           AND a.outcome IS NULL) AS open"
            " FROM rabbitretry.ledger l WHERE l.queue = $1",
            queue,
        )
    }
    effects = {
        row["message_id"]: row["n"]
        for row in await conn.fetch(
            f"SELECT message_id, count(*) AS n FROM {EFFECTS_TABLE} GROUP BY message_id"
        )
    }
    verdict = Verdict(sent=len(messages))
    for message in messages:
        key = message.message_id
        row = rows.get(key)
        if row is None or row["status"] not in TERMINAL:
            verdict.lost.append(f"{key} ({row['status'] if row else 'no ledger row'})")
            continue
        verdict.attempts += row["attempts"]
        status = row["status"]
        verdict.succeeded += status == "succeeded"
        verdict.dead += status == "dead"
        if status != message.expected_status:
            verdict.wrong_state.append(
                f"{key} ({message.kind}: {status}{', ' + row['reason'] if row['reason'] else ''})"
            )
        wanted_effects = 1 if status == "succeeded" else 0
        if effects.get(key, 0) > wanted_effects:
            verdict.duplicate_effects.append(f"{key} ({effects[key]} effects, {status})")
        if row["attempts"] != row["logged"]:
            verdict.miscounted.append(f"{key} ({row['attempts']} != {row['logged']} logged)")
        if row["open"]:
            verdict.open_attempts.append(key)
    missing_effects = [
        m.message_id
        for m in messages
        if rows.get(m.message_id) is not None
        and rows[m.message_id]["status"] == "succeeded"
        and effects.get(m.message_id, 0) == 0
    ]
    # A success without its effect is as wrong as a lost message: the work did not happen.
    verdict.lost += [f"{key} (succeeded without its effect)" for key in missing_effects]
    return verdict
