"""What a drill does, decided up front from one seed: pure data, no I/O.

Every message gets a kind, carried in its body so that the worker needs no shared state:

``ok``         the handler succeeds at once
``transient``  the handler raises ``Retry`` on its first ``fail_times`` attempts, then succeeds
``poison``     the handler raises ``Permanent``: dead at once
``crasher``    the handler kills its own process (``os._exit``) on every attempt: dead once
               the crash-loop guard sees the budget spent

Every kind writes its effect row before it fails, so an effect that survives a failed attempt
shows up as a duplicate.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

Kind = Literal["ok", "transient", "poison", "crasher"]
Fault = Literal["kill", "cut-broker", "cut-database", "restart-broker"]

# The reference drills: three SIGKILLs, one cut of each connection, one broker restart.
FAULTS: tuple[Fault, ...] = (
    "kill",
    "kill",
    "kill",
    "cut-broker",
    "cut-database",
    "restart-broker",
)


@dataclass(frozen=True)
class Message:
    message_id: str
    kind: Kind
    fail_times: int = 0

    def body(self) -> dict[str, object]:
        return {"id": self.message_id, "kind": self.kind, "fail_times": self.fail_times}

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


def make_plan(
    seed: int,
    count: int,
    *,
    publish_seconds: float,
    transient: float = 0.20,
    poison: float = 0.01,
    crashers: float = 0.005,
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

    messages = []
    for message_id in ids:
        if message_id in poison_ids:
            messages.append(Message(message_id, "poison"))
        elif message_id in crash_ids:
            messages.append(Message(message_id, "crasher"))
        elif message_id in transient_ids:
            messages.append(Message(message_id, "transient", fail_times=rng.choice((1, 1, 2))))
        else:
            messages.append(Message(message_id, "ok"))
    return Plan(seed, messages, fault_schedule(rng, faults, publish_seconds), publish_seconds)


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
