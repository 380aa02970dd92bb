"""Several AMQP URLs on a real three-node cluster: the worker, the publisher, the outbox relay
and the reconciler fail over to another node when theirs stops; the quorum queues are
replicated on every node and dead-letter at least once while a node is down."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import aio_pika
import asyncpg
import pytest
from pydantic import BaseModel

from drills import nodes
from drills.nodes import Node
from rabbitretry import Consumer, Context, Retry, RetryPolicy, amqp, topology_of
from rabbitretry.errors import ConnectionLost
from rabbitretry.outbox import Outbox, OutboxRelay
from rabbitretry.publisher import Publisher
from rabbitretry.reconcile.reconciler import Reconciler
from rabbitretry.topology import declare
from rabbitretry.urls import mask_url
from tests.cluster.conftest import node_stopped
from tests.integration.harness import queue_depth, running_worker, wait_for

pytestmark = pytest.mark.asyncio


class Item(BaseModel):
    n: int


def quorum_consumer(queue: str) -> type[Consumer[Item]]:
    """Every third message fails once (a retry through the delay path), the rest succeed."""

    class Counted(Consumer[Item]):
        queue_type = "quorum"
        retry = RetryPolicy(max_attempts=5, initial_delay=0.5, max_delay=1.0, jitter=0.0)
        lease = 2.0

        async def handle(self, msg: Item, ctx: Context) -> None:
            if msg.n % 3 == 0 and ctx.attempt == 1:
                raise Retry("fails once")

    Counted.queue = queue
    return Counted


@pytest.fixture
async def on_cluster(
    cluster_connection: amqp.Connection, queue_name: str
) -> AsyncIterator[type[Consumer[Item]]]:
    """A quorum consumer whose queues are declared on the cluster and deleted afterwards."""
    consumer = quorum_consumer(queue_name)
    topology = topology_of([consumer])
    await declare(cluster_connection, topology)
    yield consumer
    async with amqp.Prober(cluster_connection) as prober:
        for queue in topology.queue_declarations():
            if not queue.shared:  # the delay chain serves every quorum queue on the cluster
                await prober.attempt(lambda channel, name=queue.name: channel.queue_delete(name))


async def finished(pool: asyncpg.Pool, queue: str, count: int) -> bool:
    done = await pool.fetchval(
        "SELECT count(*) FROM rabbitretry.ledger WHERE queue = $1 AND status = 'succeeded'", queue
    )
    return bool(done == count)


async def assert_each_once(pool: asyncpg.Pool, queue: str, count: int) -> None:
    """Every message succeeded, attempts equal to attempt-log rows, retried ones twice."""
    rows = await pool.fetch(
        """SELECT l.message_id, l.attempts, count(a.*) AS logged
           FROM rabbitretry.ledger l
           LEFT JOIN rabbitretry.attempt_history a USING (queue, message_id)
           WHERE l.queue = $1 GROUP BY l.message_id, l.attempts""",
        queue,
    )
    assert len(rows) == count
    assert [r["message_id"] for r in rows if r["attempts"] != r["logged"]] == []
    retried = {r["message_id"] for r in rows if r["attempts"] > 1}
    assert {f"m{n}" for n in range(count) if n % 3 == 0} <= retried


async def publish_range(publisher: Publisher, queue: str, numbers: range) -> int:
    """Publish each message, again (same message_id) after a ConnectionLost, as a caller
    should; how many publishes were lost that way."""
    lost = 0
    for n in numbers:
        while True:
            try:
                await publisher.publish("", Item(n=n), routing_key=queue, message_id=f"m{n}")
                break
            except ConnectionLost:
                lost += 1
                assert lost < 10, "the publisher did not fail over"
                await asyncio.sleep(0.5)
    return lost


def node_of(connection: amqp.Connection, cluster: list[Node]) -> Node:
    return next(node for node in cluster if node.port == connection.url.port)


async def test_the_first_node_that_answers_is_used(
    cluster: list[Node], cluster_url: str, closed_port: int
) -> None:
    connection = await amqp.connect(
        f"amqp://guest:guest@127.0.0.1:{closed_port}/,{cluster_url}", name="rabbitretry-tests"
    )
    try:
        assert node_of(connection, cluster) == cluster[0]
    finally:
        await connection.close()


async def test_quorum_queues_are_replicated_on_every_node(
    cluster: list[Node], on_cluster: type[Consumer[Item]]
) -> None:
    names = {node.name for node in cluster}
    listed = nodes.quorum_queues(cluster)
    # The work queue, its dead letters, and every level of the quorum delay chain.
    for queue in topology_of([on_cluster]).queue_declarations():
        state = listed[queue.name]
        assert state["type"] == "quorum", queue.name
        assert set(state["members"]) == names, queue.name  # type: ignore[call-overload]
        assert set(state["online"]) == names, queue.name  # type: ignore[call-overload]


async def test_worker_and_publisher_fail_over_when_their_node_stops(
    cluster: list[Node], cluster_url: str, database_url: str, on_cluster: type[Consumer[Item]]
) -> None:
    queue = on_cluster.queue
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        async with (
            running_worker([on_cluster], cluster_url, database_url, concurrency=2) as worker,
            Publisher(cluster_url) as publisher,
        ):
            assert await publish_range(publisher, queue, range(0, 20)) == 0
            await wait_for(lambda: finished(pool, queue, 20), timeout=30)
            first = worker.consuming_node
            assert first == mask_url(cluster[0].url)  # the first URL, which answers

            with node_stopped(cluster[0]):
                # The publisher's node is gone too: a publish in flight raises ConnectionLost,
                # the next goes to another node.
                await publish_range(publisher, queue, range(20, 40))
                await wait_for(lambda: finished(pool, queue, 40), timeout=60)
                assert worker.consuming_node != first
                assert worker.health().ok, worker.health().checks
            await assert_each_once(pool, queue, 40)
    finally:
        await pool.close()


async def test_outbox_relay_fails_over_when_its_node_stops(
    cluster: list[Node], cluster_url: str, pool: asyncpg.Pool, on_cluster: type[Consumer[Item]]
) -> None:
    queue = on_cluster.queue
    relay = OutboxRelay(pool, cluster_url, poll_interval=0.2, initial_backoff=0.2)
    running = asyncio.create_task(relay.run())
    try:
        await wait_for(lambda: _true(relay.ready or running.done()), timeout=15)
        await enqueue(pool, queue, 0)
        await wait_for(lambda: sent(pool, 1), timeout=15)
        with node_stopped(cluster[0]):
            await enqueue(pool, queue, 1)
            await wait_for(lambda: sent(pool, 2), timeout=60)
        assert await queue_depth(cluster[1].url, queue) == 2
    finally:
        relay.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(running, 30)


async def test_reconciler_fails_over_when_its_node_stops(
    cluster: list[Node], cluster_url: str, pool: asyncpg.Pool, on_cluster: type[Consumer[Item]]
) -> None:
    queue = on_cluster.queue
    reconciler = Reconciler(pool, cluster_url, grace=1)
    try:
        await lost_retry(pool, queue, 0)
        assert (await reconciler.run_once()).retries_redriven == 1
        await pool.execute("UPDATE rabbitretry.ledger SET status = 'succeeded'")  # m0 is done
        with node_stopped(cluster[0]):
            await lost_retry(pool, queue, 1)

            async def redriven() -> bool:
                # A pass that meets the connection moving ends with ConnectionLost, the row
                # still marked; a later pass, on the next node, publishes it.
                try:
                    return (await reconciler.run_once()).retries_redriven == 1
                except ConnectionLost:
                    return False

            await wait_for(redriven, timeout=60, interval=1.0)
        assert await message_ids(cluster[1], queue) == {"m0", "m1"}
    finally:
        await reconciler.close()


async def test_a_rejected_message_is_dead_lettered_while_its_dead_queue_leader_is_down(
    cluster: list[Node], cluster_url: str, on_cluster: type[Consumer[Item]]
) -> None:
    queue, dead = on_cluster.queue, on_cluster.work_queue().dead_queue_name
    leader = nodes.leader_of(cluster, dead)
    with node_stopped(leader):
        # The first URL may be the stopped node: the connection goes to the next.
        connection = await amqp.connect(cluster_url, name="rabbitretry-tests")
        try:
            channel = await connection.channel()
            await channel.default_exchange.publish(
                aio_pika.Message(b"{}", message_id="r1"), routing_key=queue
            )
            work = await channel.declare_queue(queue, passive=True)
            message = await wait_for(lambda: work.get(no_ack=False, fail=False), timeout=30)
            await message.reject(requeue=False)
            # At-least-once dead-lettering: the work queue keeps the message until the dead
            # queue (leader elected among the two running nodes) has it.
            running = next(node for node in cluster if node != leader)
            await wait_for(lambda: _true_async(queue_depth(running.url, dead)), timeout=30)
            assert await queue_depth(running.url, dead) == 1
        finally:
            await connection.close()


async def lost_retry(pool: asyncpg.Pool, queue: str, n: int) -> None:
    """A ledger row retrying since an hour ago, whose delay copy the broker lost."""
    await pool.execute(
        """INSERT INTO rabbitretry.ledger (queue, message_id, status, attempts, max_attempts,
                                           payload, next_retry_at)
           VALUES ($1, $2, 'retrying', 1, 5, $3, now() - interval '1 hour')""",
        queue,
        f"m{n}",
        Item(n=n).model_dump_json().encode(),
    )


async def _true_async(value: Awaitable[Any]) -> bool:
    return bool(await value)


async def enqueue(pool: asyncpg.Pool, queue: str, n: int) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await Outbox().enqueue(conn, "", Item(n=n), routing_key=queue, message_id=f"m{n}")


async def sent(pool: asyncpg.Pool, count: int) -> bool:
    done = await pool.fetchval("SELECT count(*) FROM rabbitretry.outbox WHERE status = 'sent'")
    return bool(done == count)


async def message_ids(node: Node, queue: str) -> set[str]:
    """The message_ids of every message in ``queue`` (taken off it)."""
    connection = await amqp.connect(node.url, name="rabbitretry-tests")
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        found = set()
        while (message := await declared.get(no_ack=True, fail=False)) is not None:
            found.add(str(message.message_id))
        return found
    finally:
        await connection.close()


async def _true(value: Any) -> bool:
    return bool(value)
