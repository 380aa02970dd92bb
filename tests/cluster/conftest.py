"""The cluster tier: tests against the three local nodes of ``make cluster``.

Skipped when the cluster is not up, except under ``CI=true`` (CI starts it): then a node that
does not answer fails the run. Tests here stop and start nodes' applications; each restores
what it stopped.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Iterator

import pytest

from drills import nodes
from drills.nodes import Node
from rabbitretry import amqp


@pytest.fixture
def closed_port() -> int:
    """A local port where nothing listens (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def cluster_url(cluster: list[Node]) -> str:
    """Every node's URL, comma-separated, the first node first."""
    return nodes.urls_from(cluster, 0)


@contextlib.contextmanager
def node_stopped(node: Node) -> Iterator[None]:
    """The node's application stopped inside the block, started again (and answering) after."""
    nodes.stop_app(node)
    try:
        yield
    finally:
        nodes.start_app(node)


@pytest.fixture
async def cluster_connection(cluster_url: str) -> AsyncIterator[amqp.Connection]:
    connection = await amqp.connect(cluster_url, name="rabbitretry-cluster-tests")
    yield connection
    await connection.close()
