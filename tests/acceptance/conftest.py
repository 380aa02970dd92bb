"""The acceptance tier runs the CLI in subprocesses; it shares the integration fixtures."""

from tests.integration.conftest import amqp_connection, broker_cleanup, cleanup  # noqa: F401
