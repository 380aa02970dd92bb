"""The cluster drill: the fault drill on the three local nodes of ``make cluster``.

The same seeded messages as the single-broker drill (transient, poison, crashers, slow), on a
quorum work queue replicated on three nodes. Three supervised worker processes, each given
every node's URL starting with its own (so one is connected to each node), two reconcilers
and two outbox relays; every fifth message goes through the outbox instead of being
published directly. While messages flow, the drill stops the application of the node that
leads the work queue (``rabbitmqctl -n NODE stop_app``), starts it again later, and SIGKILLs
one worker. The verdict is the single-broker drill's (:mod:`drills.verify`).

The drill never touches the shared broker on 5672; the scratch database goes on the
PostgreSQL server named by the URL (no database crash here: that is the other drill's).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

from drills import nodes
from drills.clock import Clock
from drills.consumer import QUEUE_TYPE_ENV, STARTS_ENV
from drills.drill import CONSUMER, RECONCILE_EVERY, RECONCILE_GRACE, ROOT, DrillResult
from drills.nodes import Node
from drills.plan import Fault, Message, make_plan
from drills.scratch import Keep, drill_queue, scratch_database
from drills.sending import Enqueue
from drills.settle import publish_and_settle
from drills.supervisor import Supervisor
from rabbitretry import db
from rabbitretry.outbox import Outbox, OutboxRelay
from rabbitretry.reconcile.reconciler import Reconciler

CLUSTER_FAULTS: tuple[Fault, ...] = ("stop-leader", "kill")
OUTBOX_SHARE = 5  # one message in five goes through the outbox and its relays
NEW_LEADER_TIMEOUT = 60.0


class ClusterDown(RuntimeError):
    """A node of the local cluster does not answer."""


@dataclass(frozen=True)
class ClusterDrillConfig:
    database_url: str
    """The PostgreSQL server to create the scratch database on (any database on it)."""
    messages: int = 5000
    seed: int = 0
    publish_seconds: float = 90.0
    concurrency: int = 8
    """Consumers per worker process."""
    settle_timeout: float = 300.0
    node_down_seconds: float = 20.0
    """How long the stopped node stays down before its application is started again."""
    keep: bool = False


@dataclass
class ClusterFaults:
    """``stop-leader`` and ``kill`` on the cluster; :meth:`restore` starts any stopped node."""

    cluster: list[Node]
    queue: str
    workers: list[Supervisor]
    say: Callable[[str], None]
    node_down_seconds: float
    stopped: list[Node] = field(default_factory=list, init=False)
    kills: int = field(default=0, init=False)
    failovers: list[float] = field(default_factory=list, init=False)
    """Seconds from each stop_app until another node led the work queue."""

    async def inject(self, fault: Fault) -> None:
        if fault == "kill":
            index = self.kills % len(self.workers)
            self.kills += 1
            pid = await self.workers[index].kill()
            self.say(f"SIGKILL worker {index + 1} (pid {pid})")
        elif fault == "stop-leader":
            await self._stop_leader()
        else:
            raise ValueError(f"the cluster drill has no fault {fault!r}")

    async def _stop_leader(self) -> None:
        leader = await asyncio.to_thread(nodes.leader_of, self.cluster, self.queue)
        self.say(f"rabbitmqctl -n {leader.name} stop_app (it leads the work queue)")
        self.stopped.append(leader)
        stopped_at = time.monotonic()
        try:
            await asyncio.to_thread(nodes.stop_app, leader)
            successor = await asyncio.to_thread(self._new_leader, leader)
            self.failovers.append(time.monotonic() - stopped_at)
            self.say(f"{successor.name} leads the work queue {self.failovers[-1]:.1f} s later")
            await asyncio.sleep(max(0.0, stopped_at + self.node_down_seconds - time.monotonic()))
        finally:
            # Blocking on purpose: runs to the end even when the drill is being cancelled.
            self.restore()
        self.say(f"rabbitmqctl -n {leader.name} start_app: the node answers again")

    def _new_leader(self, old: Node) -> Node:
        others = [node for node in self.cluster if node != old]
        deadline = time.monotonic() + NEW_LEADER_TIMEOUT
        while time.monotonic() < deadline:
            # While the election runs, the queue may have no leader, or the old one listed.
            with contextlib.suppress(LookupError, OSError, ValueError, subprocess.SubprocessError):
                return nodes.leader_of(others, self.queue)
            time.sleep(0.2)
        raise RuntimeError(f"no node took the lead of {self.queue} from {old.name}")

    def restore(self) -> None:
        """Start every node this drill stopped; safe to call at any time."""
        while self.stopped:
            nodes.start_app(self.stopped[-1])
            self.stopped.pop()


async def run_cluster_drill(
    config: ClusterDrillConfig, say: Callable[[str], None] = print
) -> DrillResult:
    clock = Clock(say)
    cluster = nodes.cluster_nodes()
    if down := nodes.unreachable(cluster):
        raise ClusterDown(
            f"the local cluster is not up ({', '.join(n.name for n in down)} not reachable): "
            "run `make cluster` first"
        )
    plan = make_plan(
        config.seed, config.messages, publish_seconds=config.publish_seconds, faults=CLUSTER_FAULTS
    )
    queue = f"rr-drill-{secrets.token_hex(4)}"
    scratch = f"rabbitretry_drill_{secrets.token_hex(4)}"
    logs = Path(tempfile.mkdtemp(prefix="rabbitretry-cluster-drill-"))
    starts = logs / "handler-starts.txt"
    clock.say(
        f"seed {plan.seed}: {len(plan.messages)} messages ({len(plan.of_kind('transient'))} "
        f"transient, {len(plan.of_kind('poison'))} poison, {len(plan.of_kind('crasher'))} "
        f"crashers, {len(plan.of_kind('slow'))} slow; one in {OUTBOX_SHARE} through the "
        f"outbox) on quorum queue {queue} across {', '.join(n.name for n in cluster)}, "
        f"database {scratch}, worker logs in {logs}"
    )
    clock.say(
        "faults, in seconds after publishing starts: "
        + ", ".join(f"{f.fault} at {f.at:.1f} s" for f in plan.faults)
    )
    every_node = nodes.urls_from(cluster, 0)
    keep = Keep(config.keep)
    try:
        async with contextlib.AsyncExitStack() as stack:
            database_url = await stack.enter_async_context(
                scratch_database(config.database_url, scratch, keep)
            )
            await stack.enter_async_context(drill_queue(every_node, queue, "quorum"))
            workers = [
                _worker(cluster, index, queue, database_url, logs, config.concurrency)
                for index in range(len(cluster))
            ]
            faults = ClusterFaults(cluster, queue, workers, clock.say, config.node_down_seconds)
            try:
                for worker in workers:
                    worker.start()
                async with _reconcilers_and_relays(cluster, queue, database_url) as enqueue:
                    settled = await publish_and_settle(
                        every_node,
                        plan,
                        queue,
                        database_url,
                        faults,
                        clock,
                        starts,
                        config.settle_timeout,
                        enqueue,
                    )
            finally:
                faults.restore()
                for worker in workers:
                    await worker.stop()
            exits = sum((worker.exits for worker in workers), Counter[int]())
            result = DrillResult(
                plan,
                settled.verdict,
                settled.republished,
                dict(exits),
                settled.recovered_seconds,
                clock.now(),
                logs,
                scratch,
                database_outages=[],
                leader_changes=faults.failovers,
            )
            keep.wanted = keep.wanted or not settled.verdict.ok
            return result
    finally:
        if not keep.wanted:
            shutil.rmtree(logs, ignore_errors=True)


def _worker(
    cluster: list[Node], index: int, queue: str, database_url: str, logs: Path, concurrency: int
) -> Supervisor:
    """A supervised worker connected to node ``index`` first, the others as its fail-overs."""
    env = {
        **os.environ,
        "RABBITRETRY_AMQP_URL": nodes.urls_from(cluster, index),
        "RABBITRETRY_DATABASE_URL": database_url,
        "RABBITRETRY_DRILL_QUEUE": queue,
        QUEUE_TYPE_ENV: "quorum",
        STARTS_ENV: str(logs / "handler-starts.txt"),
    }
    return Supervisor(
        CONSUMER, env, logs / f"worker-{index + 1}.log", concurrency=concurrency, cwd=ROOT
    )


@contextlib.asynccontextmanager
async def _reconcilers_and_relays(
    cluster: list[Node], queue: str, database_url: str
) -> AsyncIterator[Enqueue]:
    """Two reconcilers and two outbox relays, each connected to a node of its own first; the
    function that puts a share of the messages into the outbox."""
    pool = await db.create_pool(database_url, min_size=1, max_size=8)
    reconcilers = [
        Reconciler(
            pool,
            nodes.urls_from(cluster, index),
            grace=RECONCILE_GRACE,
            instance=f"drill-reconciler-{index + 1}",
        )
        for index in (0, 1)
    ]
    relays = [
        OutboxRelay(pool, nodes.urls_from(cluster, index), poll_interval=0.5, initial_backoff=0.5)
        for index in (1, 2)
    ]
    tasks = [asyncio.create_task(r.run(RECONCILE_EVERY)) for r in reconcilers]
    tasks += [asyncio.create_task(relay.run()) for relay in relays]

    async def enqueue(message: Message) -> bool:
        if int(message.message_id.lstrip("m")) % OUTBOX_SHARE:
            return False
        async with pool.acquire() as conn, conn.transaction():
            await Outbox().enqueue(
                conn, "", message.body(), routing_key=queue, message_id=message.message_id
            )
        return True

    try:
        yield enqueue
    finally:
        for reconciler in reconcilers:
            reconciler.stop()
        for relay in relays:
            relay.stop()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        await pool.close()
