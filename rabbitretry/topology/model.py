"""The topology as data: what exchanges and queues a set of work queues needs.

A :class:`Topology` lists work queues at the level a person thinks about them (name, queue
type, bindings); its ``*_declarations`` methods expand them into the concrete exchanges, queues
and bindings the broker must hold: each work queue, its dead-letter queue, its binding on the
delay chain's deliver exchange, and the delay chain of each queue type in use (shared by all
work queues of that type, see :mod:`rabbitretry.topology.delays`).

A quorum work queue is always declared with an explicit ``x-delivery-limit``
(:data:`DEFAULT_DELIVERY_LIMIT` unless the queue says otherwise). RabbitMQ 4.0 and later apply
a limit of 20 to a quorum queue that names none, and up to 4.2 every nack with requeue counts
against it. rabbitretry requeues, uncharged, each delivery it cannot settle while the database
or the broker is unreachable, about once a second per consumer, so a limit of 20 would
dead-letter the messages in hand after some twenty seconds of outage. The ledger's
``max_attempts`` is the real retry budget; the broker's limit is only a backstop for loops that
never reach the ledger. Whatever it dead-letters anyway is recorded by the reconciler
(:mod:`rabbitretry.reconcile.dead_queue`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rabbitretry.topology import delays, names

QueueType = Literal["classic", "quorum"]
ExchangeType = Literal["direct", "topic", "fanout", "headers"]
Arguments = dict[str, Any]

_NAME_PATTERN = r"^[A-Za-z0-9_.:\-]{1,200}$"

DEFAULT_DELIVERY_LIMIT = 1000
"""Deliveries of one message a quorum work queue allows before the broker dead-letters it.

High on purpose: about a quarter of an hour of uncharged outage requeues (see above)."""
BROKER_DEFAULT = "broker-default"
"""``delivery_limit`` value for a quorum queue declared without ``x-delivery-limit`` before
rabbitretry set one: declare it as it is (RabbitMQ 4.x then applies its own limit of 20)."""

DeliveryLimit = int | Literal["broker-default"] | None


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Exchange(_Model):
    """An exchange that publishers send to and work queues are bound to."""

    name: str = Field(pattern=_NAME_PATTERN)
    type: ExchangeType = "topic"
    durable: bool = True
    arguments: Arguments = {}

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if name.startswith("amq."):
            raise ValueError("names starting with 'amq.' are reserved by RabbitMQ")
        return name


class Binding(_Model):
    """Route messages published to ``exchange`` with ``routing_key`` into the work queue."""

    exchange: str = Field(pattern=_NAME_PATTERN)
    routing_key: str = ""
    arguments: Arguments = {}


class QueueDeclaration(_Model):
    """One concrete queue as the broker sees it."""

    name: str
    arguments: Arguments = {}
    durable: bool = True
    role: Literal["work", "dead", "delay"] = "work"

    @property
    def shared(self) -> bool:
        """A delay-chain queue: other work queues of its type use it too; never delete it
        along with one work queue."""
        return self.role == "delay"


class BindingDeclaration(_Model):
    """``exchange`` routes ``routing_key`` to ``queue`` (or to the exchange of that name)."""

    exchange: str
    queue: str
    routing_key: str
    arguments: Arguments = {}
    destination_type: Literal["queue", "exchange"] = "queue"


class WorkQueue(_Model):
    """A queue that a consumer reads, with its dead letters; its retries wait in the delay
    chain of its queue type."""

    name: str = Field(pattern=_NAME_PATTERN)
    type: QueueType = "classic"
    dead_queue: str | None = Field(default=None, pattern=_NAME_PATTERN)
    delivery_limit: DeliveryLimit = Field(
        default=None,
        description="quorum queues only: deliveries of a message before the broker "
        f"dead-letters it (None: {DEFAULT_DELIVERY_LIMIT}; 'broker-default': no x-delivery-limit)",
    )
    bindings: list[Binding] = []

    @field_validator("delivery_limit")
    @classmethod
    def _positive_limit(cls, limit: DeliveryLimit) -> DeliveryLimit:
        if isinstance(limit, int) and limit < 1:
            raise ValueError(f"delivery_limit must be at least 1 (or {BROKER_DEFAULT!r})")
        return limit

    @model_validator(mode="after")
    def _limit_needs_quorum(self) -> WorkQueue:
        if self.delivery_limit is not None and self.type != "quorum":
            raise ValueError(f"queue {self.name!r}: delivery_limit needs type = 'quorum'")
        return self

    @property
    def effective_delivery_limit(self) -> int | None:
        """The ``x-delivery-limit`` the work queue is declared with (None: no such argument)."""
        if self.type != "quorum" or self.delivery_limit == BROKER_DEFAULT:
            return None
        if self.delivery_limit is None:
            return DEFAULT_DELIVERY_LIMIT
        return int(self.delivery_limit)

    @property
    def dead_queue_name(self) -> str:
        return self.dead_queue or names.dead_queue(self.name)

    def declarations(self) -> list[QueueDeclaration]:
        work_args: Arguments = {
            **_type_arguments(self.type),
            # A broker-side safety net: anything the broker itself rejects lands with the
            # dead letters instead of vanishing.
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": self.dead_queue_name,
        }
        if self.effective_delivery_limit is not None:
            work_args["x-delivery-limit"] = self.effective_delivery_limit
        dead_args = {"x-queue-type": "quorum"} if self.type == "quorum" else {}
        return [
            QueueDeclaration(name=self.name, arguments=work_args, role="work"),
            QueueDeclaration(name=self.dead_queue_name, arguments=dead_args, role="dead"),
        ]

    def deliver_binding(self) -> BindingDeclaration:
        """The work queue's binding on the delay chain's deliver exchange."""
        return BindingDeclaration(
            exchange=delays.DELIVER_EXCHANGE,
            queue=self.name,
            routing_key=delays.deliver_key(self.name),
        )


def _type_arguments(queue_type: QueueType) -> Arguments:
    if queue_type == "classic":
        return {}
    # Quorum queues can dead-letter at-least-once, which needs reject-publish overflow.
    return {
        "x-queue-type": "quorum",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }


def delay_chain(queue_type: QueueType) -> tuple[list[Exchange], list[QueueDeclaration]]:
    """The exchanges and queues of one queue type's delay chain (:mod:`.delays`)."""
    exchanges, queues = [], []
    for level in range(delays.LEVELS):
        name = delays.level_name(queue_type, level)
        exchanges.append(Exchange(name=name, type="topic"))
        arguments = {
            **_type_arguments(queue_type),
            "x-message-ttl": delays.level_ttl_ms(level),
            # No x-dead-letter-routing-key: the copy keeps the key that says where it goes.
            "x-dead-letter-exchange": delays.next_hop(queue_type, level),
        }
        queues.append(QueueDeclaration(name=name, arguments=arguments, role="delay"))
    return exchanges, queues


def delay_chain_bindings(queue_type: QueueType) -> list[BindingDeclaration]:
    bindings = []
    for level in range(delays.LEVELS):
        name = delays.level_name(queue_type, level)
        into_queue, onwards = delays.level_keys(level)
        bindings += [
            BindingDeclaration(exchange=name, queue=name, routing_key=into_queue),
            BindingDeclaration(
                exchange=name,
                queue=delays.next_hop(queue_type, level),
                routing_key=onwards,
                destination_type="exchange",
            ),
        ]
    return bindings


DELIVER = Exchange(name=delays.DELIVER_EXCHANGE, type="topic")


class Topology(_Model):
    """Exchanges and work queues: what ``topology declare`` creates and ``run`` checks."""

    exchanges: list[Exchange] = []
    queues: list[WorkQueue] = []

    @model_validator(mode="after")
    def _consistent(self) -> Topology:
        names = [q.name for q in self.queue_declarations()]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"queue names used twice: {', '.join(duplicates)}")
        reserved = [
            name
            for name in [e.name for e in self.exchanges] + [q.name for q in self.queues]
            if name.startswith(f"{delays.PREFIX}.")
        ]
        if reserved:
            raise ValueError(
                f"names starting with {delays.PREFIX + '.'!r} are the delay chain's: "
                f"{', '.join(reserved)}"
            )
        known = {e.name for e in self.exchanges}
        for queue in self.queues:
            for binding in queue.bindings:
                if binding.exchange not in known:
                    raise ValueError(
                        f"queue {queue.name!r} is bound to exchange {binding.exchange!r}, "
                        "which is not declared under [[exchanges]]"
                    )
        return self

    @property
    def queue_types(self) -> list[QueueType]:
        """The queue types in use, each with a delay chain of its own."""
        return sorted({queue.type for queue in self.queues})

    def exchange_declarations(self) -> list[Exchange]:
        """The exchanges of the topology, then those of the delay chains it needs."""
        chains = [e for queue_type in self.queue_types for e in delay_chain(queue_type)[0]]
        return [*self.exchanges, *([DELIVER] if self.queues else []), *chains]

    def queue_declarations(self) -> list[QueueDeclaration]:
        own = [declaration for queue in self.queues for declaration in queue.declarations()]
        return own + [q for queue_type in self.queue_types for q in delay_chain(queue_type)[1]]

    def binding_declarations(self) -> list[BindingDeclaration]:
        bindings = [
            BindingDeclaration(
                exchange=b.exchange, queue=q.name, routing_key=b.routing_key, arguments=b.arguments
            )
            for q in self.queues
            for b in q.bindings
        ]
        bindings += [queue.deliver_binding() for queue in self.queues]
        return bindings + [b for t in self.queue_types for b in delay_chain_bindings(t)]

    def work_queue(self, name: str) -> WorkQueue:
        for queue in self.queues:
            if queue.name == name:
                return queue
        raise KeyError(name)

    def merge(self, other: Topology) -> Topology:
        """Both topologies in one; an entry present in both must be identical."""
        exchanges = {e.name: e for e in self.exchanges}
        queues = {q.name: q for q in self.queues}
        for exchange in other.exchanges:
            if exchanges.setdefault(exchange.name, exchange) != exchange:
                raise ValueError(f"exchange {exchange.name!r} is defined twice, differently")
        for queue in other.queues:
            if queues.setdefault(queue.name, queue) != queue:
                raise ValueError(f"queue {queue.name!r} is defined twice, differently")
        return Topology(exchanges=list(exchanges.values()), queues=list(queues.values()))
