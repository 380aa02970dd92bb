"""Throughput with several rabbitretry worker processes on one queue and one ledger.

Each process is a real ``Worker`` at concurrency 8 (:mod:`bench.worker_proc`); they share a
prefilled queue and the scratch database, and start together. The rate counts the messages
the ledger marks succeeded from the moment the last process consumes to the end; the commit
rate is PostgreSQL's own count of committed transactions in that database over the same window
(less this module's polling), so the report shows how the rate grows with processes and where
the database stops it.

``python -m bench.processes --cluster`` runs the same on the local three-node cluster
(``make cluster``) with a quorum queue, worker process ``i`` connected to node ``i mod 3``
first (failing over to the others), and prints the table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import asyncpg

from bench.latency import start_worker
from bench.report import processes_table
from bench.services import AMQP_URL, delete_queues, prefill, random_name, scratch_database
from bench.throughput import _bodies, noop_consumer
from rabbitretry import amqp, topology_of
from rabbitretry.topology import declare

CONCURRENCY = 8
POLL = 0.1  # seconds between two looks at the ledger
TIMEOUT = 600.0

SUCCEEDED = "SELECT count(*) FROM rabbitretry.ledger WHERE queue = $1 AND status = 'succeeded'"
COMMITS = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"


async def run_processes(
    database_url: str,
    processes: int,
    messages: int,
    warmup: int,
    node_urls: list[str] | None = None,
) -> dict[str, float]:
    """msgs/s and commits/s of ``processes`` workers; on the nodes of ``node_urls`` (each
    process's own list of URLs, its node first) with a quorum queue, if given."""
    queue = random_name(f"procs{processes}")
    queue_type = "quorum" if node_urls else "classic"
    topology = topology_of([noop_consumer(queue, queue_type=queue_type)])
    total = warmup + messages
    url = node_urls[0] if node_urls else AMQP_URL
    connection = await amqp.connect(url, name="rabbitretry-bench")
    conn = await asyncpg.connect(database_url)
    try:
        await declare(connection, topology)
        await prefill(connection, queue, _bodies(queue, total))
        async with _workers(queue, database_url, processes, node_urls, queue_type):
            started = time.monotonic()
            done_before = await conn.fetchval(SUCCEEDED, queue)
            commits_before = await conn.fetchval(COMMITS)
            if done_before > total - messages // 2:
                raise RuntimeError("the workers took too long to start: measure more messages")
            polls = 0
            deadline = started + TIMEOUT
            while await conn.fetchval(SUCCEEDED, queue) < total:
                polls += 1
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{processes} workers did not finish in {TIMEOUT:.0f} s")
                await asyncio.sleep(POLL)
            elapsed = time.monotonic() - started
            commits = await conn.fetchval(COMMITS) - commits_before - polls - 1
        return {
            "msgs_per_s": (total - done_before) / elapsed,
            "commits_per_s": commits / elapsed,
        }
    finally:
        await conn.close()
        await delete_queues(
            connection, [q.name for q in topology.queue_declarations() if not q.shared]
        )
        await connection.close()


@contextlib.asynccontextmanager
async def _workers(
    queue: str, database_url: str, count: int, node_urls: list[str] | None, queue_type: str
) -> AsyncIterator[None]:
    """``count`` worker processes, started together and all consuming; stopped afterwards."""

    def url_of(index: int) -> str | None:
        return node_urls[index % len(node_urls)] if node_urls else None

    started = await asyncio.gather(
        *(
            start_worker(
                queue,
                database_url,
                CONCURRENCY,
                "latency",
                amqp_url=url_of(i),
                queue_type=queue_type,
            )
            for i in range(count)
        ),
        return_exceptions=True,
    )
    processes = [p for p in started if isinstance(p, asyncio.subprocess.Process)]
    try:
        for outcome in started:
            if isinstance(outcome, BaseException):
                raise outcome
        yield
    finally:
        for process in processes:
            if process.returncode is None:
                process.terminate()
        # communicate, not wait: a worker's closing report fills the pipe, and a pipe nobody
        # reads would keep it (and this wait) from ever finishing.
        await asyncio.gather(*(p.communicate() for p in processes))


async def main(messages: int, cluster: bool) -> None:
    node_urls = None
    if cluster:
        from drills import nodes

        found = nodes.cluster_nodes()
        if nodes.unreachable(found):
            raise SystemExit("the cluster is not up: run `make cluster` first")
        node_urls = [nodes.urls_from(found, i) for i in range(len(found))]
    warmup = max(200, messages // 10)
    async with scratch_database() as database_url:
        found_rates = {
            str(count): await run_processes(database_url, count, messages, warmup, node_urls)
            for count in (1, 2, 4)
        }
    where = "the three-node cluster, a quorum queue" if cluster else "one broker, a classic queue"
    print(f"{messages:,} messages a run on {where}:\n")
    print(processes_table(found_rates))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.processes", description=__doc__)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--cluster", action="store_true", help="on the local three-node cluster")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(main(args.messages, args.cluster))
