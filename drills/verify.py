"""The drill's verdict, read from the ledger and the effects table once the work has settled.

Checks, each naming the keys that break it:

* lost: a message sent that has no ledger row, or a row that never reached a terminal state;
* wrong state: a message not in the state its kind calls for (poison and crashers dead,
  everything else succeeded);
* duplicate effects: more than one effect row for a message, or any for a dead one;
* miscounted: ``ledger.attempts`` differs from the number of attempt-log rows;
* open attempts: an attempt-log row of a finished message without an outcome.

And two figures, reported but not (yet) rules, from the handler starts the drill consumer
records outside the database (see :mod:`drills.consumer`), compared with the attempt log:

* attempts charged without a handler run: a counted attempt-log row whose handler never
  started. The worker marks an attempt started only once its handler has run a while, so this
  is 0 unless a message died before its mark five times or more (from the fifth such death on
  each counts); claims given back as ``NotStarted`` are not counted, so they are not charged;
* handler runs not charged: a handler start with no attempt-log row for it (a claim the ledger
  forgot, e.g. an unflushed commit lost in a database crash, its attempt number then given
  again). Every such run is an attempt the crash-loop guard never counted. A ``NotStarted``
  row accounts for a run too: its worker may have died in the handler's first moment, before
  the start mark (forgiven, and bounded by the ledger).

A handler sees its attempt's number within the current budget (``ctx.attempt``): attempts
interrupted by a shutdown are forgiven, so the attempt log's numbers are mapped to budget
numbers before the two are compared (replays, which also forgive, do not happen in a drill).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

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
    handler_runs: int | None = None
    """Handler starts recorded (None: no record was kept, the two figures below are unknown)."""
    charged_without_run: list[str] = field(default_factory=list)
    uncharged_runs: list[str] = field(default_factory=list)

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

    def figures(self) -> list[str]:
        """The handler-run figures, one line each, with their keys (not rules yet; goal: 0)."""
        if self.handler_runs is None:
            return ["drill: handler starts were not recorded"]
        lines = []
        for name, keys in (
            ("attempts charged without a handler run", self.charged_without_run),
            ("handler runs not charged", self.uncharged_runs),
        ):
            shown = ": " + ", ".join(keys[:SHOWN_KEYS]) if keys else ""
            more = f" (and {len(keys) - SHOWN_KEYS} more)" if len(keys) > SHOWN_KEYS else ""
            lines.append(f"drill: {len(keys)} {name}{shown}{more}")
        return lines


HandlerStarts = Counter[tuple[str, int]]


def read_handler_starts(path: Path) -> HandlerStarts:
    """``(message_id, attempt)`` -> how many handler runs started, from the consumer's file."""
    starts: HandlerStarts = Counter()
    if not path.exists():
        return starts
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:  # a line cut short (the writer killed mid-write) is not a start
            starts[(parts[0], int(parts[1]))] += 1
    return starts


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


async def verify(
    conn: asyncpg.Connection,
    queue: str,
    messages: Sequence[Message],
    handler_starts: HandlerStarts | None = None,
) -> Verdict:
    rows = {
        row["message_id"]: row
        for row in await conn.fetch(
            "SELECT l.message_id, l.status, l.reason, l.attempts,"
            "       (SELECT count(*) FROM rabbitretry.attempt_history a"
            "         WHERE a.queue = l.queue AND a.message_id = l.message_id) AS logged,"
            "       (SELECT count(*) FROM rabbitretry.attempt_history a"
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
    if handler_starts is not None:
        await _compare_handler_runs(conn, queue, messages, handler_starts, verdict)
    return verdict


async def _compare_handler_runs(
    conn: asyncpg.Connection,
    queue: str,
    messages: Sequence[Message],
    starts: HandlerStarts,
    verdict: Verdict,
) -> None:
    """Attempt-log rows against handler starts, per key and budget attempt number."""
    sent = {m.message_id for m in messages}
    charged: Counter[tuple[str, int]] = Counter()
    forgiven: Counter[tuple[str, int]] = Counter()
    outcomes: dict[tuple[str, int], str] = {}
    for row in await conn.fetch(
        "SELECT message_id, attempt, outcome, error_type,"
        "       attempt - count(*) FILTER (WHERE outcome = 'interrupted') OVER ("
        "           PARTITION BY message_id ORDER BY attempt"
        "           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS budget_attempt"
        " FROM rabbitretry.attempt_history WHERE queue = $1 ORDER BY message_id, attempt",
        queue,
    ):
        pair = (row["message_id"], row["budget_attempt"])
        if row["error_type"] == "NotStarted":
            # Not counted: a claim given back, or a death before the start mark, which may
            # have come in the handler's first moment (a run with this row, not a lost one).
            forgiven[pair] += 1
            continue
        charged[pair] += 1
        how = row["outcome"] or "open"
        if row["error_type"] and row["outcome"] != "succeeded":
            how += f" {row['error_type']}"
        outcomes[pair] = f"attempt {row['attempt']}: {how}"
    relevant = {pair: n for pair, n in starts.items() if pair[0] in sent}
    verdict.handler_runs = sum(relevant.values())
    for pair in sorted(charged.keys() | relevant.keys()):
        key, attempt = pair
        runs = relevant.get(pair, 0)
        missing_runs = charged[pair] - runs
        if missing_runs > 0:
            verdict.charged_without_run += [f"{key} ({outcomes[pair]})"] * missing_runs
        rows = charged[pair] + forgiven[pair]
        if runs > rows:
            verdict.uncharged_runs += [
                f"{key} (attempt {attempt}: {runs} run(s), {rows} attempt row(s))"
            ] * (runs - rows)
