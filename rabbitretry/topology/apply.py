"""A topology against a live broker: plan, declare, verify; and as definitions JSON.

RabbitMQ without the management plugin cannot list what it holds, so :func:`plan` asks about
each entity in turn on a throwaway channel:

* a passive declare tells whether it exists (a 404 closes the channel: ``create``);
* re-declaring an existing one with the wanted arguments is a no-op when they are identical
  (``ok``) and a 406 PRECONDITION_FAILED when they are not (``mismatch``), whose reply text
  names the first argument that differs.

A quorum work queue declared before rabbitretry set ``x-delivery-limit`` is such a mismatch; its
entry says how to keep it as it is (``delivery_limit = "broker-default"``) or replace it.

Nothing is created while planning: only entities that already exist are re-declared. (A queue
deleted by someone else between the two steps would be re-created; no AMQP call avoids that.)
Bindings cannot be inspected over AMQP at all (no method reads one, and a probe publish would
land in the work queue), so they are always ``ensure``: binding is idempotent, and
:func:`declare` binds every one. :func:`verify` (``rabbitretry run`` without ``--declare``)
binds each work queue to the delay chain's deliver exchange too: without that binding every
retry of the queue is dropped at the end of the chain, and binding it again changes nothing
when it is there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from rabbitretry import amqp
from rabbitretry.errors import TopologyError
from rabbitretry.topology.model import BindingDeclaration, Exchange, QueueDeclaration, Topology

Kind = Literal["exchange", "queue", "binding"]
Action = Literal["create", "ok", "mismatch", "ensure"]
Declaration = Callable[[amqp.Channel], Awaitable[object]]

DECLARE_HINT = (
    "Run `rabbitretry topology declare` with the same topology files or consumer, "
    "or pass `--declare` to `rabbitretry run`."
)
MISMATCH_HINT = (
    "A queue's or exchange's arguments cannot change in place. For each one either change the "
    "topology to match what the broker has, or delete it (`rabbitmqctl delete_queue NAME`; "
    "its messages go with it, so move them first if they matter) and declare again. "
    "The broker names only the first argument that differs."
)
DELIVER_BINDING_DETAIL = (
    "carries the queue's retries out of the delay chain; not readable over AMQP, so "
    "`topology declare` and `rabbitretry run` bind it every time"
)
DELIVER_BINDING_REFUSED = (
    "RabbitMQ refused to bind work queue {queue!r} to the delay chain's deliver exchange "
    "({binding}): {reason}. Without that binding every retry of {queue!r} is lost at the end "
    "of the delay chain, so a worker does not start. Run `rabbitretry topology declare` "
    "as a user allowed to bind (write on the queue, read on the exchange), or grant this "
    "user those permissions."
)
DELIVERY_LIMIT_HINT = (
    "this quorum queue has no (or another) x-delivery-limit: set delivery_limit in the "
    'topology to the queue\'s value, or to "broker-default" to declare it without one '
    "(RabbitMQ 4.x then dead-letters after 20 deliveries), or move its messages and "
    "declare it again"
)


@dataclass(frozen=True)
class PlanEntry:
    kind: Kind
    name: str
    action: Action
    detail: str = ""

    def describe(self) -> str:
        text = f"{self.action:<8} {self.kind:<8} {self.name}"
        return f"{text}: {self.detail}" if self.detail else text


@dataclass(frozen=True)
class Plan:
    """What declaring a topology would do to the broker, entity by entity."""

    entries: list[PlanEntry] = field(default_factory=list)

    @property
    def mismatches(self) -> list[PlanEntry]:
        return [e for e in self.entries if e.action == "mismatch"]

    @property
    def missing(self) -> list[PlanEntry]:
        return [e for e in self.entries if e.action == "create"]

    @property
    def has_mismatch(self) -> bool:
        return bool(self.mismatches)

    def lines(self) -> list[str]:
        return [entry.describe() for entry in self.entries]


async def plan(connection: amqp.Connection, topology: Topology) -> Plan:
    """Compare ``topology`` with the broker, creating nothing."""
    entries: list[PlanEntry] = []
    async with amqp.Prober(connection) as prober:
        for exchange in topology.exchange_declarations():
            summary = _summary({"type": exchange.type, **exchange.arguments})
            entry = await _probe(prober, "exchange", exchange.name, _exchange(exchange), summary)
            entries.append(entry)
        for queue in topology.queue_declarations():
            entry = await _probe(
                prober, "queue", queue.name, _queue(queue), _summary(queue.arguments)
            )
            entries.append(entry)
    deliver = [queue.deliver_binding() for queue in topology.queues]
    entries += [
        PlanEntry(
            "binding", _binding_name(b), "ensure", DELIVER_BINDING_DETAIL if b in deliver else ""
        )
        for b in topology.binding_declarations()
    ]
    return Plan(entries)


async def declare(connection: amqp.Connection, topology: Topology) -> Plan:
    """Declare every exchange, queue and binding; refuse before touching anything on a mismatch.

    Idempotent: declaring an unchanged topology again changes nothing. Returns the plan that was
    applied (its ``create`` entries are the entities this call created).
    """
    current = await plan(connection, topology)
    if current.has_mismatch:
        raise TopologyError(_mismatch_message(current.mismatches, "nothing was declared"))
    async with amqp.Prober(connection) as prober:
        for exchange in topology.exchange_declarations():
            await _apply(prober, "exchange", exchange.name, _exchange(exchange))
        for queue in topology.queue_declarations():
            await _apply(prober, "queue", queue.name, _queue(queue))
        deliver = [queue.deliver_binding() for queue in topology.queues]
        for binding in topology.binding_declarations():
            if binding not in deliver:
                await _apply(prober, "binding", _binding_name(binding), _bind(binding))
        await _bind_deliver(prober, topology)
    return current


async def verify(connection: amqp.Connection, topology: Topology) -> None:
    """Raise :class:`TopologyError` unless every exchange and queue exists as declared; then
    bind each work queue to the delay chain's deliver exchange.

    Bindings cannot be read over AMQP. The deliver binding is the one a worker cannot do
    without (its retries would vanish at the end of the chain) and the one nobody else needs
    to remove, so it is bound again here, which changes nothing when it exists; a refusal to
    bind is a :class:`TopologyError` that names it. Other bindings are left as they are.
    """
    current = await plan(connection, topology)
    problems = [e for e in current.entries if e.action in ("create", "mismatch")]
    if not problems:
        async with amqp.Prober(connection) as prober:
            await _bind_deliver(prober, topology)
        return
    listed = "\n".join(
        f"  - {e.kind} {e.name!r}: " + ("missing" if e.action == "create" else e.detail)
        for e in problems
    )
    hints = f"{MISMATCH_HINT}\n{DECLARE_HINT}" if current.has_mismatch else DECLARE_HINT
    raise TopologyError(f"RabbitMQ does not hold the topology as declared:\n{listed}\n{hints}")


def export_definitions(topology: Topology, vhost: str = "/") -> dict[str, list[dict[str, Any]]]:
    """The topology as RabbitMQ definitions (``rabbitmqctl import_definitions``, management API)."""
    return {
        "exchanges": [_exchange_definition(e, vhost) for e in topology.exchange_declarations()],
        "queues": [_queue_definition(q, vhost) for q in topology.queue_declarations()],
        "bindings": [_binding_definition(b, vhost) for b in topology.binding_declarations()],
    }


async def _probe(
    prober: amqp.Prober, kind: Kind, name: str, redeclare: Declaration, summary: str
) -> PlanEntry:
    outcome, text = await prober.attempt(_passive(kind, name))
    if outcome == "not-found":
        return PlanEntry(kind, name, "create", summary)
    if outcome == "ok":
        outcome, text = await prober.attempt(redeclare)
    if outcome == "ok":
        return PlanEntry(kind, name, "ok", text)
    if "'x-delivery-limit'" in text:
        text = f"{text} ({DELIVERY_LIMIT_HINT})"
    return PlanEntry(kind, name, "mismatch", text)


async def _bind_deliver(prober: amqp.Prober, topology: Topology) -> None:
    """Bind each work queue to the deliver exchange; a refusal names the binding and why it
    matters (:data:`DELIVER_BINDING_REFUSED`), from :func:`declare` and :func:`verify` alike."""
    for queue in topology.queues:
        binding = queue.deliver_binding()
        refusal = await _refusal(prober, _bind(binding))
        if refusal is not None:
            raise TopologyError(
                DELIVER_BINDING_REFUSED.format(
                    queue=queue.name, binding=_binding_name(binding), reason=refusal
                )
            )


async def _refusal(prober: amqp.Prober, action: Declaration) -> str | None:
    """Why the broker refused ``action`` (a 404, an access refusal, a locked queue), or None."""
    try:
        outcome, text = await prober.attempt(action)
    except TopologyError as error:
        return str(error).removeprefix("RabbitMQ refused: ")
    return None if outcome == "ok" else text


async def _apply(prober: amqp.Prober, kind: Kind, name: str, declaration: Declaration) -> None:
    refusal = await _refusal(prober, declaration)
    if refusal is not None:
        raise TopologyError(f"RabbitMQ refused to declare {kind} {name!r}: {refusal}")


def _passive(kind: Kind, name: str) -> Declaration:
    if kind == "exchange":
        return lambda channel: channel.declare_exchange(name, passive=True)
    return lambda channel: channel.declare_queue(name, passive=True)


def _exchange(exchange: Exchange) -> Declaration:
    return lambda channel: channel.declare_exchange(
        exchange.name,
        type=exchange.type,
        durable=exchange.durable,
        auto_delete=False,
        internal=False,
        arguments=dict(exchange.arguments),
    )


def _queue(queue: QueueDeclaration) -> Declaration:
    return lambda channel: channel.declare_queue(
        queue.name,
        durable=True,
        exclusive=False,
        auto_delete=False,
        arguments=dict(queue.arguments),
    )


def _bind(binding: BindingDeclaration) -> Declaration:
    async def bind(channel: amqp.Channel) -> None:
        destination = (
            await channel.get_queue(binding.queue, ensure=False)
            if binding.destination_type == "queue"
            else await channel.get_exchange(binding.queue, ensure=False)
        )
        await destination.bind(
            binding.exchange, routing_key=binding.routing_key, arguments=dict(binding.arguments)
        )

    return bind


def _summary(arguments: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in arguments.items())


def _binding_name(binding: BindingDeclaration) -> str:
    return f"{binding.exchange} -> {binding.queue} (routing key {binding.routing_key!r})"


def _mismatch_message(mismatches: list[PlanEntry], consequence: str) -> str:
    listed = "\n".join(f"  - {e.kind} {e.name!r}: {e.detail}" for e in mismatches)
    return (
        f"RabbitMQ already has {len(mismatches)} entit{'y' if len(mismatches) == 1 else 'ies'} "
        f"declared with other arguments than the topology wants; {consequence}:\n"
        f"{listed}\n{MISMATCH_HINT}"
    )


def _exchange_definition(exchange: Exchange, vhost: str) -> dict[str, Any]:
    return {
        "name": exchange.name,
        "vhost": vhost,
        "type": exchange.type,
        "durable": exchange.durable,
        "auto_delete": False,
        "internal": False,
        "arguments": dict(exchange.arguments),
    }


def _queue_definition(queue: QueueDeclaration, vhost: str) -> dict[str, Any]:
    return {
        "name": queue.name,
        "vhost": vhost,
        "durable": True,
        "auto_delete": False,
        "arguments": dict(queue.arguments),
    }


def _binding_definition(binding: BindingDeclaration, vhost: str) -> dict[str, Any]:
    return {
        "source": binding.exchange,
        "vhost": vhost,
        "destination": binding.queue,
        "destination_type": binding.destination_type,
        "routing_key": binding.routing_key,
        "arguments": dict(binding.arguments),
    }
