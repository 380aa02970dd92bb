"""Fixtures shared by every tier.

Integration tests reach RabbitMQ and PostgreSQL through ``RABBITRETRY_AMQP_URL`` and
``RABBITRETRY_DATABASE_URL`` (defaulting to the local services). When neither variable is set
and a service does not answer, testcontainers starts one if Docker is available. A service that
still cannot be reached skips the test locally and fails it under ``CI=true``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import socket
from collections.abc import AsyncIterator, Iterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from drills import nodes
from drills.nodes import Node
from rabbitretry import db
from rabbitretry.ledger import migrations
from rabbitretry.settings import DEFAULT_AMQP_URL, DEFAULT_DATABASE_URL

# One template per test session, so that sessions running side by side (or on different
# migrations) never drop or copy each other's template.
TEMPLATE_DB = f"rabbitretry_test_template_{os.getpid()}"


def _reachable(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 0), 2):
            return True
    except OSError:
        return False


def _unavailable(what: str, url: str) -> None:
    message = f"{what} is not reachable at {url}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message} (CI=true: a missing service fails the run)", pytrace=False)
    pytest.skip(message)


def _from_docker(kind: str) -> str | None:
    """A throwaway service from testcontainers, for machines with Docker and no URL set."""
    try:
        import docker  # type: ignore[import-not-found]

        docker.from_env().ping()
        if kind == "postgres":
            from testcontainers.postgres import PostgresContainer  # type: ignore[import-not-found]

            pg = PostgresContainer("postgres:16-alpine", driver=None).start()
            return str(pg.get_connection_url())
        from testcontainers.rabbitmq import RabbitMqContainer  # type: ignore[import-not-found]

        mq = RabbitMqContainer("rabbitmq:3.13-alpine").start()
        return f"amqp://guest:guest@{mq.get_container_host_ip()}:{mq.get_exposed_port(5672)}/"
    except Exception:
        return None


def _service_url(env: str, default: str, kind: str) -> str:
    url = os.environ.get(env)
    if url:
        return url
    if _reachable(default):
        return default
    return _from_docker(kind) or default


@pytest.fixture(scope="session")
def amqp_url() -> str:
    url = _service_url("RABBITRETRY_AMQP_URL", DEFAULT_AMQP_URL, "rabbitmq")
    if not _reachable(url):
        _unavailable("RabbitMQ", url)
    return url


@pytest.fixture(scope="session")
def cluster() -> list[Node]:
    """The three nodes of the local cluster (``make cluster``); the cluster tier and the
    cluster drill skip without it, and fail under ``CI=true`` (CI starts it)."""
    found = nodes.cluster_nodes()
    down = nodes.unreachable(found)
    if down or shutil.which("rabbitmqctl") is None:
        why = (
            f"{', '.join(n.name for n in down)} not reachable"
            if down
            else "rabbitmqctl, which stops and starts its nodes, is not installed"
        )
        message = f"the local cluster is not up ({why}): make cluster"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (CI=true: the cluster tier must run)", pytrace=False)
        pytest.skip(message)
    return found


@pytest.fixture(scope="session")
def server_database_url() -> str:
    url = _service_url("RABBITRETRY_DATABASE_URL", DEFAULT_DATABASE_URL, "postgres")
    if not _reachable(url):
        _unavailable("PostgreSQL", url)
    return url


def with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


@pytest.fixture(scope="session")
def template_database(server_database_url: str) -> Iterator[str]:
    """A migrated database that every test's fresh database is copied from."""

    async def build() -> None:
        conn = await asyncpg.connect(server_database_url)
        try:
            await conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE_DB} WITH (FORCE)")
            await conn.execute(f"CREATE DATABASE {TEMPLATE_DB}")
        finally:
            await conn.close()
        tmpl = await asyncpg.connect(with_database(server_database_url, TEMPLATE_DB))
        try:
            await migrations.migrate(tmpl)
        finally:
            await tmpl.close()

    async def drop() -> None:
        conn = await asyncpg.connect(server_database_url)
        try:
            await conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE_DB} WITH (FORCE)")
        finally:
            await conn.close()

    asyncio.run(build())
    yield TEMPLATE_DB
    asyncio.run(drop())


@contextlib.asynccontextmanager
async def fresh_database(server_url: str, template: str | None) -> AsyncIterator[str]:
    """A new database (a copy of ``template``, or empty), dropped on the way out."""
    name = f"rabbitretry_test_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(server_url)
    try:
        await admin.execute(
            f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else "")
        )
    finally:
        await admin.close()
    yield with_database(server_url, name)
    admin = await asyncpg.connect(server_url)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await admin.close()


@pytest.fixture
async def database_url(server_database_url: str, template_database: str) -> AsyncIterator[str]:
    """A fresh, migrated database for this test alone, dropped afterwards."""
    async with fresh_database(server_database_url, template_database) as url:
        yield url


@pytest.fixture
async def second_database_url(
    server_database_url: str, template_database: str
) -> AsyncIterator[str]:
    """Another fresh, migrated database: a second ledger (queue groups on two primaries)."""
    async with fresh_database(server_database_url, template_database) as url:
        yield url


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await db.create_pool(database_url, min_size=1, max_size=4)
    yield pool
    await pool.close()


@pytest.fixture
def queue_name() -> str:
    """A work queue name no other test uses."""
    return f"rr-test-{secrets.token_hex(5)}"
