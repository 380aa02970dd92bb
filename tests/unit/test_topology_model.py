"""The topology as data: expansion into concrete queues, validation, TOML files, export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from rabbitretry.consumer import Consumer, Context
from rabbitretry.errors import ConfigurationError
from rabbitretry.topology import (
    Binding,
    Exchange,
    Plan,
    Topology,
    WorkQueue,
    export_definitions,
    load_many,
    load_toml,
)
from rabbitretry.topology.apply import PlanEntry
from rabbitretry.topology.model import DEFAULT_DELIVERY_LIMIT, QueueDeclaration

QUORUM = {
    "x-queue-type": "quorum",
    "x-dead-letter-strategy": "at-least-once",
    "x-overflow": "reject-publish",
}

GOOD_TOML = """
[[exchanges]]
name = "orders"
type = "topic"

[[queues]]
name = "points.award"
type = "quorum"
delivery_limit = 1000
bindings = [{ exchange = "orders", routing_key = "order.paid" }]
"""


def orders_topology(queue_type: str = "classic", **queue: object) -> Topology:
    return Topology.model_validate(
        {
            "exchanges": [{"name": "orders"}],
            "queues": [
                {
                    "name": "points.award",
                    "type": queue_type,
                    "bindings": [{"exchange": "orders", "routing_key": "order.paid"}],
                    **queue,
                }
            ],
        }
    )


def by_name(topology: Topology) -> dict[str, QueueDeclaration]:
    return {q.name: q for q in topology.queue_declarations()}


# --- expansion -------------------------------------------------------------------------------


def test_a_work_queue_expands_into_work_and_dead_queues_then_the_shared_chain() -> None:
    declarations = orders_topology().queue_declarations()
    assert [q.name for q in declarations[:2]] == ["points.award", "points.award.dead"]
    assert [q.role for q in declarations[:2]] == ["work", "dead"]
    chain = declarations[2:]
    assert [q.name for q in chain] == [f"rabbitretry.delay.classic.{n:02d}" for n in range(24)]
    assert all(q.role == "delay" and q.shared for q in chain)
    assert not any(q.shared for q in declarations[:2])


def test_the_chain_is_declared_once_for_many_queues_of_a_type() -> None:
    topology = Topology(queues=[WorkQueue(name=f"q{n}") for n in range(5)])
    assert len(topology.queue_declarations()) == 5 * 2 + 24
    assert len(topology.exchange_declarations()) == 1 + 24  # the deliver exchange and levels


def test_a_classic_work_queue_dead_letters_to_its_dead_queue() -> None:
    work = by_name(orders_topology())["points.award"]
    assert work.arguments == {
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "points.award.dead",
    }


def test_a_quorum_topology_uses_quorum_arguments_everywhere() -> None:
    queues = by_name(orders_topology("quorum", delivery_limit=5))
    work = queues["points.award"]
    assert work.arguments == {
        **QUORUM,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "points.award.dead",
        "x-delivery-limit": 5,
    }
    assert queues["points.award.dead"].arguments == {"x-queue-type": "quorum"}
    for name, queue in queues.items():
        if queue.role == "delay":
            assert QUORUM.items() <= queue.arguments.items(), name


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_the_dead_queue_never_expires_or_dead_letters(queue_type: str) -> None:
    dead = by_name(orders_topology(queue_type))["points.award.dead"]
    assert dead.role == "dead"
    assert dead.durable
    for argument in ("x-message-ttl", "x-expires", "x-dead-letter-exchange", "x-max-length"):
        assert argument not in dead.arguments


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_delay_queues_dead_letter_only_into_the_chain(queue_type: str) -> None:
    chain = [q for q in orders_topology(queue_type).queue_declarations() if q.role == "delay"]
    for queue in chain:
        # Never back through "orders", which would also reach every other queue bound there:
        # the chain ends at the deliver exchange, where each work queue has its own key.
        assert queue.arguments["x-dead-letter-exchange"].startswith("rabbitretry.delay.")
        assert "x-expires" not in queue.arguments


def test_a_custom_dead_queue_name_is_used_by_the_work_queue() -> None:
    queues = by_name(orders_topology(dead_queue="graveyard"))
    assert "graveyard" in queues
    assert queues["points.award"].arguments["x-dead-letter-routing-key"] == "graveyard"


def test_bindings_expand_to_the_work_queue() -> None:
    binding, deliver = orders_topology().binding_declarations()[:2]
    assert (deliver.exchange, deliver.queue) == ("rabbitretry.delay.deliver", "points.award")
    assert (binding.exchange, binding.queue, binding.routing_key) == (
        "orders",
        "points.award",
        "order.paid",
    )


# --- validation ------------------------------------------------------------------------------


def test_a_binding_to_an_unknown_exchange_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"'payments'.*not declared"):
        Topology(queues=[WorkQueue(name="q", bindings=[Binding(exchange="payments")])])


def test_a_queue_name_used_twice_is_refused() -> None:
    with pytest.raises(ValidationError, match="used twice: q"):
        Topology(queues=[WorkQueue(name="q"), WorkQueue(name="q", type="quorum")])


def test_a_work_queue_named_like_another_ones_dead_queue_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"used twice: q\.dead"):
        Topology(queues=[WorkQueue(name="q"), WorkQueue(name="q.dead")])


def test_delivery_limit_needs_a_quorum_queue() -> None:
    with pytest.raises(ValidationError, match="delivery_limit needs type = 'quorum'"):
        WorkQueue(name="q", delivery_limit=5)


def test_a_quorum_work_queue_always_declares_an_explicit_delivery_limit() -> None:
    # RabbitMQ 4.x would otherwise apply 20, and count rabbitretry's outage requeues against it.
    work = by_name(orders_topology("quorum"))["points.award"]
    assert work.arguments["x-delivery-limit"] == DEFAULT_DELIVERY_LIMIT >= 20
    assert WorkQueue(name="q", type="quorum").effective_delivery_limit == DEFAULT_DELIVERY_LIMIT
    assert WorkQueue(name="q").effective_delivery_limit is None
    for queue in by_name(orders_topology("quorum")).values():
        if queue.role != "work":
            assert "x-delivery-limit" not in queue.arguments, queue.name


def test_broker_default_declares_a_quorum_queue_without_a_delivery_limit() -> None:
    queues = by_name(orders_topology("quorum", delivery_limit="broker-default"))
    assert "x-delivery-limit" not in queues["points.award"].arguments
    assert queues["points.award"].arguments["x-queue-type"] == "quorum"


@pytest.mark.parametrize("limit", [0, -1, "twenty"])
def test_a_delivery_limit_is_a_positive_number_or_broker_default(limit: object) -> None:
    with pytest.raises(ValidationError, match="delivery_limit"):
        WorkQueue(name="q", type="quorum", delivery_limit=limit)  # type: ignore[arg-type]


def test_a_consumer_declares_its_delivery_limit() -> None:
    class Quorum(Consumer[dict[str, int]]):
        queue = "q"
        queue_type = "quorum"
        delivery_limit = 2

        async def handle(self, msg: dict[str, int], ctx: Context) -> None:
            return None

    work = Quorum.work_queue()
    assert work.delivery_limit == 2
    assert work.declarations()[0].arguments["x-delivery-limit"] == 2


@pytest.mark.parametrize("name", ["", "has space", "x" * 201, "ünïcode"])
def test_bad_queue_names_are_refused(name: str) -> None:
    with pytest.raises(ValidationError):
        WorkQueue(name=name)


def test_amq_exchange_names_are_reserved() -> None:
    with pytest.raises(ValidationError, match="reserved"):
        Exchange(name="amq.mine")


def test_merge_accepts_identical_entries_and_refuses_different_ones() -> None:
    a = orders_topology()
    assert a.merge(a) == a
    with pytest.raises(ValueError, match="defined twice, differently"):
        a.merge(orders_topology("quorum"))


# --- TOML ------------------------------------------------------------------------------------


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_a_toml_file_loads_into_a_topology(tmp_path: Path) -> None:
    topology = load_toml(write(tmp_path, "orders.toml", GOOD_TOML))
    assert topology == Topology(
        exchanges=[Exchange(name="orders", type="topic")],
        queues=[
            WorkQueue(
                name="points.award",
                type="quorum",
                delivery_limit=1000,
                bindings=[Binding(exchange="orders", routing_key="order.paid")],
            )
        ],
    )


def test_a_toml_file_sets_the_delivery_limit(tmp_path: Path) -> None:
    limited = GOOD_TOML.replace("delivery_limit = 1000", "delivery_limit = 50")
    topology = load_toml(write(tmp_path, "limited.toml", limited))
    assert by_name(topology)["points.award"].arguments["x-delivery-limit"] == 50
    unset = GOOD_TOML.replace("delivery_limit = 1000", 'delivery_limit = "broker-default"')
    topology = load_toml(write(tmp_path, "unset.toml", unset))
    assert "x-delivery-limit" not in by_name(topology)["points.award"].arguments


def test_an_invalid_value_names_the_file_the_queue_and_the_field(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.toml", GOOD_TOML.replace('name = "points.award"', "name = 7"))
    with pytest.raises(ConfigurationError) as caught:
        load_toml(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: invalid topology: ")
    assert "queues[0].name: Input should be a valid string (got 7)" in message
    assert "\n" not in message
    assert "errors.pydantic.dev" not in message


def test_every_problem_in_a_file_is_reported(tmp_path: Path) -> None:
    text = GOOD_TOML.replace('"quorum"', '"stream"') + "\n[[queues]]\nname = 'b'\ncolour = 1\n"
    with pytest.raises(ConfigurationError) as caught:
        load_toml(write(tmp_path, "two.toml", text))
    message = str(caught.value)
    assert "queues[0] ('points.award').type: Input should be 'classic' or 'quorum'" in message
    assert "queues[1] ('b').colour: Extra inputs are not permitted" in message


def test_an_unknown_exchange_names_the_file(tmp_path: Path) -> None:
    text = GOOD_TOML.replace('exchange = "orders"', 'exchange = "payments"')
    path = write(tmp_path, "unbound.toml", text)
    with pytest.raises(ConfigurationError, match=r"unbound\.toml: invalid topology: .*'payments'"):
        load_toml(path)


def test_a_syntax_error_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "broken.toml", "[[queues]\nname = 'q'\n")
    with pytest.raises(ConfigurationError, match=r"broken\.toml: not valid TOML: "):
        load_toml(path)


def test_a_missing_file_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"nope\.toml: cannot read topology file"):
        load_toml(tmp_path / "nope.toml")


def test_load_many_lets_a_queue_bind_to_an_exchange_from_another_file(tmp_path: Path) -> None:
    exchanges = write(tmp_path, "exchanges.toml", '[[exchanges]]\nname = "orders"\n')
    queues = write(
        tmp_path,
        "queues.toml",
        '[[queues]]\nname = "points.award"\nbindings = [{ exchange = "orders" }]\n',
    )
    topology = load_many([queues, exchanges])
    assert [e.name for e in topology.exchanges] == ["orders"]
    assert [q.name for q in topology.queues] == ["points.award"]
    assert load_many([tmp_path]) == topology


def test_load_many_accepts_identical_repeats_and_names_a_conflicting_file(tmp_path: Path) -> None:
    first = write(tmp_path, "a.toml", GOOD_TOML)
    same = write(tmp_path, "b.toml", GOOD_TOML)
    assert load_many([first, same]) == load_toml(first)
    other = write(
        tmp_path, "c.toml", GOOD_TOML.replace("delivery_limit = 1000", "delivery_limit = 60")
    )
    with pytest.raises(ConfigurationError, match=r"c\.toml: conflicts .*'points\.award'"):
        load_many([first, other])


def test_load_many_refuses_an_empty_list_or_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="no topology files"):
        load_many([])
    with pytest.raises(ConfigurationError, match=r"no \*\.toml"):
        load_many([tmp_path])


# --- export and plan -------------------------------------------------------------------------


def test_export_writes_rabbitmq_definitions() -> None:
    definitions = export_definitions(orders_topology("quorum"), vhost="shop")
    assert set(definitions) == {"exchanges", "queues", "bindings"}
    assert definitions["exchanges"][:1] == [
        {
            "name": "orders",
            "vhost": "shop",
            "type": "topic",
            "durable": True,
            "auto_delete": False,
            "internal": False,
            "arguments": {},
        }
    ]
    queues = {q["name"]: q for q in definitions["queues"]}
    assert len(queues) == 2 + 24
    assert queues["points.award"]["arguments"]["x-delivery-limit"] == DEFAULT_DELIVERY_LIMIT
    assert queues["rabbitretry.delay.quorum.02"] == {
        "name": "rabbitretry.delay.quorum.02",
        "vhost": "shop",
        "durable": True,
        "auto_delete": False,
        "arguments": {
            **QUORUM,
            "x-message-ttl": 40,
            "x-dead-letter-exchange": "rabbitretry.delay.quorum.01",
        },
    }
    onward = [b for b in definitions["bindings"] if b["destination_type"] == "exchange"]
    assert len(onward) == 24
    assert definitions["bindings"][:1] == [
        {
            "source": "orders",
            "vhost": "shop",
            "destination": "points.award",
            "destination_type": "queue",
            "routing_key": "order.paid",
            "arguments": {},
        }
    ]
    json.dumps(definitions)  # plain JSON all the way down


def test_export_defaults_to_the_root_vhost() -> None:
    definitions = export_definitions(orders_topology())
    entries = [e for kind in definitions.values() for e in kind]
    assert {e["vhost"] for e in entries} == {"/"}


def test_a_plan_knows_its_mismatches() -> None:
    clean = Plan([PlanEntry("queue", "q", "ok"), PlanEntry("binding", "x -> q", "ensure")])
    assert not clean.has_mismatch
    assert clean.missing == []
    dirty = Plan([*clean.entries, PlanEntry("queue", "q.dead", "mismatch", "inequivalent arg")])
    assert dirty.has_mismatch
    assert [e.name for e in dirty.mismatches] == ["q.dead"]
    assert dirty.lines()[-1] == "mismatch queue    q.dead: inequivalent arg"
