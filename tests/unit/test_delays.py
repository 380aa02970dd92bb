"""The delay chain: ticks, routing keys, and a copy's walk through the chain's bindings."""

from __future__ import annotations

import math
import random

import pytest

from rabbitretry.ledger import retention
from rabbitretry.topology import delays
from rabbitretry.topology.model import (
    BindingDeclaration,
    Topology,
    WorkQueue,
    delay_chain,
    delay_chain_bindings,
)
from rabbitretry.topology.names import dead_queue


def test_dead_queue_name() -> None:
    assert dead_queue("points.award") == "points.award.dead"


@pytest.mark.parametrize(
    ("seconds", "ticks"),
    [
        (0, 0),
        (-1, 0),
        (math.nan, 0),
        (0.0001, 1),
        (0.01, 1),
        (0.0101, 2),
        (1.3, 130),  # not 131: 1.3 * 1000 is 1300.0000000000002 in floating point
        (0.29, 29),
        (300, 30_000),
        (math.inf, delays.MAX_TICKS),
        (10**9, delays.MAX_TICKS),
    ],
)
def test_ticks_round_up_within_the_chain(seconds: float, ticks: int) -> None:
    assert delays.ticks(seconds) == ticks


def test_ticks_are_never_short_and_at_most_one_tick_long() -> None:
    rng = random.Random(7)
    for _ in range(20_000):
        seconds = 10 ** rng.uniform(-3, math.log10(delays.MAX_DELAY_SECONDS))
        waited = delays.ticks(seconds) * delays.TICK_MS / 1000
        assert seconds - 1e-9 <= waited < seconds + delays.TICK_MS / 1000, seconds


def test_the_chain_covers_about_46_hours() -> None:
    assert 46 * 3600 < delays.MAX_DELAY_SECONDS < 47 * 3600


def test_a_route_enters_at_its_highest_set_bit() -> None:
    route = delays.route("points.award", "quorum", 0.05)  # 5 ticks: 0b101
    assert route.exchange == "rabbitretry.delay.quorum.02"
    assert route.routing_key == "0." * 21 + "1.0.1.points.award"


def test_no_wait_goes_straight_to_the_deliver_exchange() -> None:
    route = delays.route("q", "classic", 0)
    assert route == delays.Route(delays.DELIVER_EXCHANGE, "0." * 24 + "q")


def test_keys_fit_the_amqp_limit_for_the_longest_queue_name() -> None:
    name = "q" * 200  # the longest name a topology accepts
    assert len(delays.route(name, "quorum", 1).routing_key.encode()) <= 255
    assert len(delays.deliver_key(name).encode()) <= 255


# --- a copy's walk through the chain, with the broker's topic matching --------------------------


def topic_matches(pattern: str, key: str) -> bool:
    """AMQP topic matching: ``*`` is one word, ``#`` zero or more."""

    def match(p: list[str], k: list[str]) -> bool:
        if not p:
            return not k
        if p[0] == "#":
            return any(match(p[1:], k[i:]) for i in range(len(k) + 1))
        return bool(k) and p[0] in ("*", k[0]) and match(p[1:], k[1:])

    return match(pattern.split("."), key.split("."))


def walk(topology: Topology, exchange: str, key: str) -> tuple[list[str], int]:
    """Where a copy published to ``exchange`` with ``key`` ends: (queues it reaches, ms waited).

    Follows every binding that matches, as the broker does, and each delay queue's
    dead-lettering on expiry.
    """
    bindings = topology.binding_declarations()
    queues = {q.name: q for q in topology.queue_declarations()}
    reached: list[str] = []
    waited = 0
    pending = [exchange]
    while pending:
        source = pending.pop()
        routes: list[BindingDeclaration] = [
            b for b in bindings if b.exchange == source and topic_matches(b.routing_key, key)
        ]
        for binding in routes:
            if binding.destination_type == "exchange":
                pending.append(binding.queue)
                continue
            queue = queues[binding.queue]
            if queue.role != "delay":
                reached.append(queue.name)
                continue
            waited += queue.arguments["x-message-ttl"]
            pending.append(queue.arguments["x-dead-letter-exchange"])
    return reached, waited


TOPOLOGY = Topology(
    queues=[
        WorkQueue(name="a.b"),
        WorkQueue(name="x.a.b"),  # ends with the other's name: the binding must not confuse them
        WorkQueue(name="b", type="quorum"),
        WorkQueue(name="1.0.b", type="quorum"),  # looks like bits
    ]
)


@pytest.mark.parametrize("queue", ["a.b", "x.a.b", "b", "1.0.b"])
def test_every_copy_reaches_its_own_queue_alone_after_exactly_its_ticks(queue: str) -> None:
    queue_type = TOPOLOGY.work_queue(queue).type
    rng = random.Random(queue)
    samples = [0, 0.001, 0.01, 1.3, delays.MAX_DELAY_SECONDS, 10**7]
    samples += [10 ** rng.uniform(-2, 5) for _ in range(200)]
    for seconds in samples:
        route = delays.route(queue, queue_type, seconds)
        reached, waited = walk(TOPOLOGY, route.exchange, route.routing_key)
        assert reached == [queue], seconds
        assert waited == delays.ticks(seconds) * delays.TICK_MS, seconds


def test_a_queue_types_chain_has_a_level_per_bit_doubling_its_ttl() -> None:
    exchanges, queues = delay_chain("quorum")
    assert [e.name for e in exchanges] == [q.name for q in queues]
    assert [q.arguments["x-message-ttl"] for q in queues] == [10 * 2**n for n in range(24)]
    assert {q.arguments["x-queue-type"] for q in queues} == {"quorum"}
    assert {q.arguments["x-dead-letter-strategy"] for q in queues} == {"at-least-once"}
    assert all("x-dead-letter-routing-key" not in q.arguments for q in queues)
    assert all(q.shared for q in queues)


def test_each_level_passes_a_zero_bit_on_to_the_next_exchange() -> None:
    bindings = delay_chain_bindings("classic")
    onward = [b for b in bindings if b.destination_type == "exchange"]
    assert len(onward) == delays.LEVELS
    assert onward[0].exchange == "rabbitretry.delay.classic.00"
    assert onward[0].queue == delays.DELIVER_EXCHANGE


def test_only_the_queue_types_in_use_get_a_chain() -> None:
    classic = Topology(queues=[WorkQueue(name="q")])
    names = {q.name for q in classic.queue_declarations()}
    assert "rabbitretry.delay.classic.00" in names
    assert not any(name.startswith("rabbitretry.delay.quorum") for name in names)
    assert Topology().exchange_declarations() == []


def test_the_chain_prefix_is_reserved() -> None:
    with pytest.raises(ValueError, match="delay chain"):
        Topology(queues=[WorkQueue(name="rabbitretry.delay.mine")])


def test_retention_outlasts_the_longest_park_in_the_delay_chain() -> None:
    """A copy parked for the chain's longest delay must still find its row when it comes back,
    or the ledger would take it for a new message and run it again."""
    assert retention.MIN_WINDOW.total_seconds() > delays.MAX_DELAY_SECONDS + 86_400
