"""The verdict of the WMS outage drill (:mod:`drills.downstream`), from the ledger, the effects
table, the alerts, the breaker's row and the stub WMS's record of requests.

Every row of the issue's table is measured and, in breaker mode, held to its goal:

* lost and duplicate effects (0, 0): an order without its success and its one effect row (and
  not dead), or with a second effect row (or one for a dead order);
* dead letters after the outage (0);
* requests to the WMS during the outage: in all, the peak in one second, and after the first
  5 s (at most 2 in any second);
* recovery, from the WMS answering again to the last effect (at most 30 s);
* attempts charged (``attempts - attempts_forgiven``) per order that met the outage (at most 1):
  an order published before the WMS came back and not shipped before it went down;
* alerts: one "down" and one "recovered" (``kind = 'downstream'``), none about dead letters.

With several workers, also: the breaker opened once, and never two probes in flight at once.
When the WMS never comes back within the run: nothing dead, the attempts after the first 5 s
bounded by the probes, the breaker still open, and every unfinished order waiting on the queue.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import asyncpg

from drills.consumer import EFFECTS_TABLE
from drills.downstream_stub import Request

SETTLING = 5.0  # seconds of the outage before the breaker has had its chance to open
MAX_RATE_AFTER = 2  # requests to the WMS in any one second of the outage after SETTLING
MAX_RECOVERY = 30.0  # seconds from the WMS answering again to the last effect
MAX_CHARGED = 1  # attempts charged per order that met the outage
PROBES_FROM = 1.0  # seconds after the trip from which a request to the WMS is a probe


@dataclass(frozen=True)
class Timeline:
    """Wall-clock times (``time.time()``) of the drill's outage."""

    down_at: float
    up_at: float | None
    """None: the WMS never came back within the run."""
    ended_at: float
    """When the drill stopped looking (after the WMS came back, once every order finished)."""

    @property
    def never_back(self) -> bool:
        return self.up_at is None

    @property
    def outage_end(self) -> float:
        return self.ended_at if self.up_at is None else self.up_at


@dataclass(frozen=True)
class Row:
    measure: str
    shown: str
    goal: str
    ok: bool | None
    """None: not held to a goal (plain mode, or a figure only)."""


@dataclass
class DownstreamVerdict:
    mode: str
    orders: int
    succeeded: int = 0
    dead: int = 0
    lost: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    requests_during: int = 0
    peak_per_second: int = 0
    requests_after: int = 0
    seconds_after: float = 0.0
    peak_after: int = 0
    probes: int = 0
    """Requests to the WMS while down, from ``PROBES_FROM`` after the breaker opened."""
    most_in_flight_probes: int = 0
    probers: int = 0
    probe_times: list[float] = field(default_factory=list)
    """Seconds after the outage began of each probe (a request while down)."""
    first_after_up: float | None = None
    """Seconds from the WMS answering again to the first request it got (the closing probe)."""
    """The workers whose attempts ran from ``PROBES_FROM`` after the trip to the outage's end."""
    recovery: float | None = None
    last_effect_after_up: float | None = None
    met: int = 0
    charged_mean: float = 0.0
    charged_max: int = 0
    downstream_alerts: list[str] = field(default_factory=list)
    dead_alerts: int = 0
    breaker_state: str = "none"
    opened: int = 0
    failed_probes: int = 0
    tripped_after: float | None = None
    attempts_after: int = 0
    waiting: int | None = None
    """Messages on the work queue once the workers stopped (the never-recovers run)."""
    never_recovers: bool = False
    workers: int = 1

    @property
    def judged(self) -> bool:
        return self.mode == "breaker"

    def rows(self) -> list[Row]:
        judge = self.judged
        rate = self.requests_after / self.seconds_after if self.seconds_after > 0 else 0.0
        rows = [
            Row(
                "lost, duplicate effects",
                f"{len(self.lost)}, {len(self.duplicates)}",
                "0, 0",
                not self.lost and not self.duplicates,
            ),
            Row(
                "dead letters",
                f"{self.dead} of {self.orders}",
                "0",
                self.dead == 0 if judge else None,
            ),
            Row(
                "requests to the WMS during the outage",
                f"{self.requests_during} (peak {self.peak_per_second}/s); after the first "
                f"{SETTLING:g} s: {self.requests_after} in {self.seconds_after:.0f} s "
                f"({rate:.2f}/s, at most {self.peak_after} in one second)",
                f"<= {MAX_RATE_AFTER}/s after the first {SETTLING:g} s",
                self.peak_after <= MAX_RATE_AFTER if judge else None,
            ),
            Row(
                "recovery until every order has its effect",
                self._recovery_shown(),
                f"<= {MAX_RECOVERY:g} s",
                None
                if self.never_recovers or not judge
                else self.recovery is not None and self.recovery <= MAX_RECOVERY,
            ),
            Row(
                "attempts charged per order that met the outage",
                f"{self.charged_mean:.2f} mean, {self.charged_max} max ({self.met} orders)",
                f"<= {MAX_CHARGED}",
                self.charged_max <= MAX_CHARGED if judge else None,
            ),
            Row(
                "alerts",
                f"downstream: {', '.join(self.downstream_alerts) or 'none'}; "
                f"dead letters: {self.dead_alerts}",
                "one down (open)" + ("" if self.never_recovers else ", one recovered (closed)"),
                self._alerts_ok() if judge else None,
            ),
        ]
        if judge:
            rows.append(self._breaker_row())
        return rows

    def _recovery_shown(self) -> str:
        if self.never_recovers:
            return "the WMS did not come back within the run"
        if self.recovery is not None:
            return f"{self.recovery:.1f} s"
        last = (
            f" (the last effect {self.last_effect_after_up:.1f} s after it came back)"
            if self.last_effect_after_up is not None
            else ""
        )
        unfinished = self.orders - self.succeeded - self.dead
        return f"never: {self.dead} dead, {unfinished} unfinished, their effects never happen{last}"

    def _alerts_ok(self) -> bool:
        wanted = ["open"] if self.never_recovers else ["open", "closed"]
        return self.downstream_alerts == wanted and self.dead_alerts == 0

    def _breaker_row(self) -> Row:
        tripped = "" if self.tripped_after is None else f", {self.tripped_after:.1f} s in"
        shown = (
            f"{self.breaker_state}; opened {self.opened} time(s){tripped}; {self.failed_probes} "
            f"failed probe(s) counted; {self.probes} request(s) to the WMS from {PROBES_FROM:g} s "
            f"after it opened, at most {self.most_in_flight_probes} in flight at once"
            + (f", taken by {self.probers} of {self.workers} workers" if self.workers > 1 else "")
        )
        ok = self.opened == 1 and self.most_in_flight_probes <= 1
        goal = "opened once, one probe at a time"
        if self.never_recovers:
            waiting = "?" if self.waiting is None else str(self.waiting)
            unfinished = self.orders - self.succeeded - self.dead
            shown += (
                f"; {self.attempts_after} attempt(s) after the first {SETTLING:g} s; "
                f"{waiting} message(s) waiting on the queue for {unfinished} unfinished order(s)"
            )
            goal += ", still open, attempts <= probes + 1, the unfinished waiting"
            ok = (
                ok
                and self.breaker_state != "closed"
                and self.attempts_after <= self.failed_probes + 1
                and self.waiting is not None
                and self.waiting >= unfinished
            )
        return Row("breaker", shown, goal, ok)

    @property
    def missed(self) -> list[Row]:
        return [row for row in self.rows() if row.ok is False]

    @property
    def ok(self) -> bool:
        return not self.missed

    def lines(self) -> list[str]:
        width = max(len(row.measure) for row in self.rows())
        lines = []
        for row in self.rows():
            mark = {True: "ok", False: "MISSED", None: "-"}[row.ok]
            lines.append(f"  {row.measure:<{width}}  {row.shown}  [goal {row.goal}: {mark}]")
        if self.judged and self.probe_times:
            times = ", ".join(f"{t:.1f}" for t in self.probe_times)
            back = (
                f"; the first request after the WMS came back: {self.first_after_up:.1f} s later"
                if self.first_after_up is not None
                else ""
            )
            lines.append(f"  probes, in seconds after the outage began: {times}{back}")
        for name, keys in (("lost", self.lost), ("duplicate effects", self.duplicates)):
            if keys:
                lines.append(f"  {name}: {', '.join(keys[:20])}{' ...' if len(keys) > 20 else ''}")
        return lines


async def measure(
    conn: asyncpg.Connection,
    verdict: DownstreamVerdict,
    queue: str,
    published: dict[str, float],
    requests: list[Request],
    timeline: Timeline,
    waiting: int | None = None,
) -> DownstreamVerdict:
    """Fill ``verdict`` from the database and the stub's record (and, when the WMS never came
    back, the count of messages ``waiting`` on the work queue once the workers stopped)."""
    await _breaker(conn, verdict, queue, timeline)
    _requests(verdict, requests, timeline)
    ledger = {
        r["message_id"]: r
        for r in await conn.fetch(
            "SELECT message_id, status, attempts, attempts_forgiven FROM rabbitretry.ledger"
            " WHERE queue = $1",
            queue,
        )
    }
    effects = {
        r["message_id"]: (r["n"], r["at"])
        for r in await conn.fetch(
            f"SELECT message_id, count(*) AS n, max(extract(epoch FROM written_at))::float8 AS at"
            f" FROM {EFFECTS_TABLE} GROUP BY message_id"
        )
    }
    charged: list[int] = []
    last_effect = -math.inf
    for key, sent_at in published.items():
        row = ledger.get(key)
        count, effect_at = effects.get(key, (0, None))
        status = row["status"] if row is not None else None
        if status == "succeeded":
            verdict.succeeded += 1
        elif status == "dead":
            verdict.dead += 1
        if count > 1 or (count and status != "succeeded"):
            verdict.duplicates.append(f"{key} ({status or 'no ledger row'}, {count} effects)")
        if status == "succeeded" and not count:
            verdict.lost.append(f"{key} (succeeded without its effect)")
        elif status not in ("succeeded", "dead") and not timeline.never_back:
            verdict.lost.append(f"{key} ({status or 'no ledger row'})")
        if effect_at is not None:
            last_effect = max(last_effect, effect_at)
        shipped_before = effect_at is not None and effect_at < timeline.down_at
        if sent_at < timeline.outage_end and not shipped_before:
            charged.append(0 if row is None else row["attempts"] - row["attempts_forgiven"])
    verdict.met = len(charged)
    verdict.charged_mean = sum(charged) / len(charged) if charged else 0.0
    verdict.charged_max = max(charged, default=0)
    unfinished = verdict.orders - verdict.succeeded - verdict.dead
    verdict.waiting = waiting
    if timeline.never_back and (waiting is None or waiting < unfinished):
        missing = unfinished - (waiting or 0)
        verdict.lost.append(f"{missing} unfinished order(s) not waiting on the queue")
    if timeline.up_at is not None and last_effect > -math.inf:
        verdict.last_effect_after_up = last_effect - timeline.up_at
        if unfinished == 0 and verdict.dead == 0 and not verdict.lost:
            verdict.recovery = max(0.0, verdict.last_effect_after_up)
    return verdict


def _requests(verdict: DownstreamVerdict, requests: list[Request], timeline: Timeline) -> None:
    during = [r for r in requests if r.down]
    if timeline.up_at is not None:
        back = [r.at for r in requests if r.at >= timeline.up_at]
        verdict.first_after_up = min(back) - timeline.up_at if back else None
    per_second = Counter(int(r.at - timeline.down_at) for r in during)
    after = [r for r in during if r.at >= timeline.down_at + SETTLING]
    verdict.requests_during = len(during)
    verdict.peak_per_second = max(per_second.values(), default=0)
    verdict.requests_after = len(after)
    verdict.seconds_after = max(0.0, timeline.outage_end - timeline.down_at - SETTLING)
    verdict.peak_after = max(
        (n for second, n in per_second.items() if second >= SETTLING), default=0
    )
    if verdict.tripped_after is not None:
        probes_from = timeline.down_at + verdict.tripped_after + PROBES_FROM
        probes = [r for r in during if r.at >= probes_from]
        verdict.probes = len(probes)
        verdict.probe_times = [r.at - timeline.down_at for r in probes]
        verdict.most_in_flight_probes = max((r.in_flight for r in probes), default=0)


async def _breaker(
    conn: asyncpg.Connection, verdict: DownstreamVerdict, queue: str, timeline: Timeline
) -> None:
    alerts = await conn.fetch(
        "SELECT kind, detail->>'state' AS state, (detail->>'since')::timestamptz AS since"
        " FROM rabbitretry.alert ORDER BY id"
    )
    verdict.downstream_alerts = [a["state"] for a in alerts if a["kind"] == "downstream"]
    verdict.dead_alerts = sum(1 for a in alerts if a["kind"] == "dead")
    opens = [a["since"] for a in alerts if a["kind"] == "downstream" and a["state"] == "open"]
    if opens:
        verdict.tripped_after = opens[0].timestamp() - timeline.down_at
    row = await conn.fetchrow(
        "SELECT state, opened, probes FROM rabbitretry.downstream WHERE name = 'wms'"
    )
    if row is not None:
        verdict.breaker_state, verdict.opened, verdict.failed_probes = (
            row["state"],
            row["opened"],
            row["probes"],
        )
    if verdict.tripped_after is not None:
        verdict.probers = await conn.fetchval(
            "SELECT count(DISTINCT regexp_replace(worker, ':[0-9]+$', ''))"  # host:pid:slot
            " FROM rabbitretry.attempt_history WHERE queue = $1"
            " AND started_at >= to_timestamp($2) AND started_at < to_timestamp($3)",
            queue,
            timeline.down_at + verdict.tripped_after + PROBES_FROM,
            timeline.outage_end,
        )
    verdict.attempts_after = await conn.fetchval(
        "SELECT count(*) FROM rabbitretry.attempt_history WHERE queue = $1"
        " AND started_at >= to_timestamp($2) AND started_at < to_timestamp($3)",
        queue,
        timeline.down_at + SETTLING,
        timeline.outage_end,
    )
