"""rabbitretry: consume RabbitMQ messages without losing any.

The broker carries messages; a Postgres ledger decides what happens to them.
"""

from rabbitretry.callbacks import (
    CallbackKind,
    CallbackReceiver,
    HmacSignature,
    RecordNotFound,
    StateMachine,
)
from rabbitretry.consumer import Consumer, Context
from rabbitretry.delivery.transaction import TransactionRolledBack
from rabbitretry.delivery.worker import Worker
from rabbitretry.errors import (
    ConfigurationError,
    ConnectionLost,
    MissingMessageId,
    Permanent,
    PublishError,
    RabbitRetryError,
    Retry,
    ServiceUnavailable,
    TopologyError,
    UnpublishableError,
    UnroutableError,
)
from rabbitretry.outbox import Outbox, OutboxRelay
from rabbitretry.publisher import Publisher
from rabbitretry.reconciler import Reconciler
from rabbitretry.reconciliation import Expected, Reconciliation
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
    "Exchange",
    "Expected",
    "HmacSignature",
    "MissingMessageId",
    "Outbox",
    "OutboxRelay",
    "Permanent",
    "PublishError",
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
]
__version__ = "0.1.0"
