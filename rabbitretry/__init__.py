"""rabbitretry: consume RabbitMQ messages without losing any.

The broker carries messages; a Postgres ledger decides what happens to them.
"""

from rabbitretry.consumer import Consumer, Context
from rabbitretry.errors import (
    ConfigurationError,
    Permanent,
    PublishError,
    RabbitRetryError,
    Retry,
    ServiceUnavailable,
    TopologyError,
    UnroutableError,
)
from rabbitretry.retry import RetryPolicy
from rabbitretry.topology.model import Binding, Exchange, Topology, WorkQueue
from rabbitretry.worker import Worker

__all__ = [
    "Binding",
    "ConfigurationError",
    "Consumer",
    "Context",
    "Exchange",
    "Permanent",
    "PublishError",
    "RabbitRetryError",
    "Retry",
    "RetryPolicy",
    "ServiceUnavailable",
    "Topology",
    "TopologyError",
    "UnroutableError",
    "WorkQueue",
    "Worker",
]
__version__ = "0.1.0"
