"""rabbitretry: consume RabbitMQ messages without losing any.

The broker carries messages; a Postgres ledger decides what happens to them.
"""

import importlib.metadata

from rabbitretry.callbacks import (
    CallbackKind,
    CallbackReceiver,
    HmacSignature,
    RecordNotFound,
    StateMachine,
)
from rabbitretry.consumer import Consumer, Context, Death, topology_of
from rabbitretry.delivery.worker import Worker
from rabbitretry.downstream import Downstream
from rabbitretry.errors import (
    ConfigurationError,
    ConnectionLost,
    DownstreamUnavailable,
    MissingMessageId,
    Permanent,
    PublishError,
    PublishRefused,
    RabbitRetryError,
    Retry,
    ServiceUnavailable,
    TopologyError,
    TransactionRolledBack,
    UnpublishableError,
    UnroutableError,
)
from rabbitretry.outbox import Outbox, OutboxRelay
from rabbitretry.publisher import Publisher
from rabbitretry.reconcile.expected import Expected, Reconciliation
from rabbitretry.reconcile.reconciler import Reconciler
from rabbitretry.retry import RetryPolicy
from rabbitretry.topology.model import Binding, Exchange, Topology, WorkQueue

__all__ = [
    "Binding",
    "CallbackKind",
    "CallbackReceiver",
    "ConfigurationError",
    "ConnectionLost",
    "Consumer",
    "Context",
    "Death",
    "Downstream",
    "DownstreamUnavailable",
    "Exchange",
    "Expected",
    "HmacSignature",
    "MissingMessageId",
    "Outbox",
    "OutboxRelay",
    "Permanent",
    "PublishError",
    "PublishRefused",
    "Publisher",
    "RabbitRetryError",
    "Reconciler",
    "Reconciliation",
    "RecordNotFound",
    "Retry",
    "RetryPolicy",
    "ServiceUnavailable",
    "StateMachine",
    "Topology",
    "TopologyError",
    "TransactionRolledBack",
    "UnpublishableError",
    "UnroutableError",
    "WorkQueue",
    "Worker",
    "topology_of",
]
__version__ = importlib.metadata.version("rabbitretry")
