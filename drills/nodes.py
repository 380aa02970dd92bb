"""The local cluster of ``make cluster`` (scripts/cluster.sh): its nodes, their URLs, which one
leads a queue, and stopping and starting a node's application.

``RABBITRETRY_CLUSTER_URLS`` (comma-separated) names the nodes' AMQP URLs when they are not
the defaults; node names follow ports (5701 is ``rr1@localhost``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from rabbitretry import urls

URLS_ENV = "RABBITRETRY_CLUSTER_URLS"
DEFAULT_URLS = ",".join(f"amqp://guest:guest@127.0.0.1:{5700 + n}/" for n in (1, 2, 3))
START_TIMEOUT = 120.0


@dataclass(frozen=True)
class Node:
    name: str
    url: str

    @property
    def port(self) -> int:
        return urlsplit(self.url).port or 5672


def cluster_nodes() -> list[Node]:
    """The three nodes, in order."""
    found = urls.split_urls(os.environ.get(URLS_ENV) or DEFAULT_URLS)
    return [Node(f"rr{(urlsplit(url).port or 5672) - 5700}@localhost", url) for url in found]


def urls_from(nodes: list[Node], first: int) -> str:
    """Every node's URL, comma-separated, starting with ``nodes[first]``: a process given this
    connects to that node and fails over to the others in turn."""
    order = nodes[first:] + nodes[:first]
    return ",".join(node.url for node in order)


def unreachable(nodes: list[Node]) -> list[Node]:
    """The nodes whose AMQP port does not answer."""
    return [node for node in nodes if not port_open(node.port)]


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), 1):
            return True
    except OSError:
        return False


def rabbitmqctl(node: str, *args: str, timeout: float = START_TIMEOUT) -> str:
    done = subprocess.run(
        ["rabbitmqctl", "-q", "-n", node, *args],
        check=True,
        timeout=timeout,
        capture_output=True,
        text=True,
    )
    return done.stdout


def quorum_queues(nodes: list[Node]) -> dict[str, dict[str, object]]:
    """Every queue's ``name``, ``type``, ``leader``, ``members`` and ``online``, by name, asked
    of the first node whose application answers."""
    for node in nodes:
        if not port_open(node.port):
            continue
        columns = ("name", "type", "leader", "members", "online")
        listed = rabbitmqctl(node.name, "list_queues", *columns, "--formatter", "json", timeout=30)
        return {row["name"]: dict(row) for row in json.loads(listed)}
    raise LookupError("no node of the cluster answers")


def quorum_queue(nodes: list[Node], queue: str) -> dict[str, object]:
    """One queue's entry of :func:`quorum_queues`."""
    found = quorum_queues(nodes)
    if queue not in found:
        raise LookupError(f"queue {queue!r} not found on the cluster")
    return found[queue]


def leader_of(nodes: list[Node], queue: str) -> Node:
    """The node among ``nodes`` that leads ``queue``; LookupError if none of them does."""
    leader = quorum_queue(nodes, queue)["leader"]
    for node in nodes:
        if node.name == leader:
            return node
    raise LookupError(f"{queue!r} is led by {leader}, none of the nodes asked")


def stop_app(node: Node) -> None:
    rabbitmqctl(node.name, "stop_app")


def start_app(node: Node) -> None:
    """Start the node's application and wait until it serves AMQP again; idempotent."""
    rabbitmqctl(node.name, "start_app")
    rabbitmqctl(node.name, "await_startup")
    deadline = time.monotonic() + START_TIMEOUT
    while not port_open(node.port):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{node.name} did not come back after start_app")
        time.sleep(0.2)
