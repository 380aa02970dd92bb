"""Fixtures of the generated-input tier: a rig on this test's broker and fresh database."""

from __future__ import annotations

from collections.abc import Callable

import asyncpg
import pytest

from tests.generated.rig import ConsumerFactory, Rig
from tests.integration.conftest import BrokerCleanup, broker_cleanup

__all__ = ["broker_cleanup"]  # the integration tier's fixture, used here too


@pytest.fixture
def rig_services(
    amqp_url: str,
    database_url: str,
    pool: asyncpg.Pool,
    broker_cleanup: BrokerCleanup,
) -> Callable[[ConsumerFactory, bytes], Rig]:
    """Makes a (not yet started) rig on this test's broker, fresh database and cleanup."""

    def make(factory: ConsumerFactory, sentinel_body: bytes) -> Rig:
        return Rig(factory, amqp_url, database_url, pool, broker_cleanup, sentinel_body)

    return make
