"""What a drill does, decided up front from one seed: pure data, no I/O.

Every message gets a kind, carried in its body so that the worker needs no shared state:

``ok``         the handler succeeds at once
``transient``  the handler raises ``Retry`` on its first ``fail_times`` attempts, then succeeds
``poison``     the handler raises ``Permanent``: dead at once
``crasher``    the handler kills its own process (``os._exit``) on every attempt: dead once
               the crash-loop guard sees the budget spent
``slow``       on its first attempt the handler sleeps ``sleep`` seconds (1-4 s), then writes its
               effect and succeeds: its claim is in flight, its handler running, when a fault
               strikes (later attempts do not sleep: see :mod:`drills.consumer`); the ``ok``
               messages published just before a database crash are all slow (3-4 s)

Every other kind writes its effect row before it fails, so an effect that survives a failed
attempt shows up as a duplicate.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

Kind = Literal["ok", "transient", "poison", "crasher", "slow"]
Fault = Literal[
    "kill",
    "cut-broker",
    "cut-database",
    "stall-database",
    "stall-broker",
    "restart-broker",
    "crash-database",
    "stop-leader",
]

# The reference drills: three SIGKILLs, one cut of each connection, a database that stops
# answering (connections kept) for longer than the worker waits for an answer, a broker that
# does the same past the heartbeat's verdict, one broker restart, one database crash
# (PostgreSQL stopped in immediate mode, started again 2 s later).
FAULTS: tuple[Fault, ...] = (
    "kill",
    "kill",
    "kill",
    "cut-broker",
    "cut-database",
    "stall-database",
    "stall-broker",
    "restart-broker",
    "crash-database",
)
SLOW_SECONDS = (1.0, 4.0)  # a slow handler's sleep, drawn uniformly
# Before each database crash, the ``ok`` (and ``slow``) messages published in the last
# CRASH_BURST_SECONDS are made slow, with a handler longer than the outage (2 s down, plus the
# stop and the start): their claims are the newest commits when PostgreSQL dies, and their
# handlers finish after it is back. That is the path on which a claim lost with unflushed WAL
# shows up as a lost message.
CRASH_BURST_SECONDS = 0.6
CRASH_BURST_SLEEP = (3.0, 4.0)


@dataclass(frozen=True)
class Message:
    message_id: str
    kind: Kind
    fail_times: int = 0
    sleep: float = 0.0

    def body(self) -> dict[str, object]:
        return {
            "id": self.message_id,
            "kind": self.kind,
            "fail_times": self.fail_times,
            "sleep": self.sleep,
        }

    @property
    def expected_status(self) -> str:
        return "dead" if self.kind in ("poison", "crasher") else "succeeded"


@dataclass(frozen=True)
class ScheduledFault:
    at: float
    """Seconds after publishing starts."""
    fault: Fault


@dataclass(frozen=True)
class Plan:
    seed: int
    messages: list[Message]
    faults: list[ScheduledFault]
    publish_seconds: float

    def of_kind(self, kind: Kind) -> list[Message]:
        return [m for m in self.messages if m.kind == kind]

    def without(self, *faults: Fault) -> Plan:
        """The same plan with these faults left out (the others keep their times)."""
        kept = [f for f in self.faults if f.fault not in faults]
        return Plan(self.seed, self.messages, kept, self.publish_seconds)


def make_plan(
    seed: int,
    count: int,
    *,
    publish_seconds: float,
    transient: float = 0.20,
    poison: float = 0.01,
    crashers: float = 0.005,
    slow: float = 0.05,
    faults: tuple[Fault, ...] = FAULTS,
) -> Plan:
    """Exact shares (rounded) of each kind at seeded positions, faults at seeded times."""
    rng = random.Random(seed)
    ids = [f"m{n:06d}" for n in range(count)]
    shuffled = rng.sample(ids, count)
    n_poison = round(count * poison)
    n_crash = round(count * crashers)
    n_transient = round(count * transient)
    poison_ids = set(shuffled[:n_poison])
    crash_ids = set(shuffled[n_poison : n_poison + n_crash])
    transient_ids = set(shuffled[n_poison + n_crash : n_poison + n_crash + n_transient])
    n_failing = n_poison + n_crash + n_transient
    slow_ids = set(shuffled[n_failing : n_failing + round(count * slow)])

    messages = []
    for message_id in ids:
        if message_id in poison_ids:
            messages.append(Message(message_id, "poison"))
        elif message_id in crash_ids:
            messages.append(Message(message_id, "crasher"))
        elif message_id in transient_ids:
            messages.append(Message(message_id, "transient", fail_times=rng.choice((1, 1, 2))))
        elif message_id in slow_ids:
            messages.append(Message(message_id, "slow", sleep=round(rng.uniform(*SLOW_SECONDS), 1)))
        else:
            messages.append(Message(message_id, "ok"))
    schedule = fault_schedule(rng, faults, publish_seconds)
    interval = publish_seconds / count
    for crash in (f for f in schedule if f.fault == "crash-database"):
        first = max(0, int((crash.at - CRASH_BURST_SECONDS) / interval))
        for index in range(first, min(count, int(crash.at / interval) + 1)):
            if messages[index].kind in ("ok", "slow"):
                sleep = round(rng.uniform(*CRASH_BURST_SLEEP), 1)
                messages[index] = Message(messages[index].message_id, "slow", sleep=sleep)
    return Plan(seed, messages, schedule, publish_seconds)


def fault_schedule(
    rng: random.Random, faults: tuple[Fault, ...], publish_seconds: float
) -> list[ScheduledFault]:
    """The faults in a seeded order at seeded times while messages are still being published.

    Times fall within 10%-85% of the publishing window, so that every fault meets traffic,
    one fault at a random time in each of as many equal slots, so that they do not bunch up.
    """
    order = rng.sample(list(faults), len(faults))
    start, end = 0.10 * publish_seconds, 0.85 * publish_seconds
    slot = (end - start) / max(1, len(order))
    return [
        ScheduledFault(round(start + (i + rng.random()) * slot, 1), fault)
        for i, fault in enumerate(order)
    ]
