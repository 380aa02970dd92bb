"""``python -m drills``: run the fault drill and print its verdict (exit 1 on any problem)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import signal
import sys

from drills import downstream, private_postgres
from drills.cluster import ClusterDown, ClusterDrillConfig, run_cluster_drill
from drills.drill import DATABASE_CRASH_ENV, DrillConfig, DrillResult, run_drill
from rabbitretry.settings import DEFAULT_AMQP_URL, DEFAULT_DATABASE_URL


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m drills",
        description=(
            "Publish seeded messages (20%% transient failures, 1%% poison, 0.5%% that crash the "
            "worker, 5%% with a 1-4 s handler) to a supervised `rabbitretry run` worker; SIGKILL "
            "it three times, cut its broker and database connections, silence each (connections "
            "kept, no byte through), restart RabbitMQ's application, crash PostgreSQL (a "
            "private server of the drill's own, stopped in immediate mode); then check the "
            "ledger and the effects table: every message finished once, nothing lost. "
            "It restarts the broker: run it alone on a shared one (see docs/drills.md)."
        ),
    )
    parser.add_argument("--messages", "-n", type=int, default=5000, help="default 5000")
    parser.add_argument("--seed", type=int, help="replay a drill exactly (default: random)")
    parser.add_argument(
        "--publish-seconds",
        type=float,
        help="spread publishing (and the faults) over this long (default: 18 s per 1000 messages)",
    )
    parser.add_argument(
        "--concurrency",
        "-c",
        type=int,
        help="consumers per worker process (default 16; with --cluster 8)",
    )
    parser.add_argument(
        "--settle-timeout",
        type=float,
        default=300.0,
        help="seconds to wait, once all is published, for every message to finish (default 300)",
    )
    parser.add_argument(
        "--no-broker-restart",
        action="store_true",
        default=os.environ.get("RABBITRETRY_DRILL_BROKER_RESTART") == "0",
        help=(
            "skip rabbitmqctl stop_app/start_app (no rights on the broker, or not alone on it); "
            "RABBITRETRY_DRILL_BROKER_RESTART=0 does the same"
        ),
    )
    parser.add_argument(
        "--no-database-crash",
        action="store_true",
        default=os.environ.get(DATABASE_CRASH_ENV) == "0",
        help=(
            "skip the database crash, and with it the private PostgreSQL server it needs "
            f"(the scratch database goes on the server given by the URL); {DATABASE_CRASH_ENV}=0 "
            "does the same"
        ),
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help=(
            "the cluster drill instead, on the three local nodes of `make cluster`: a quorum "
            "queue, a worker per node, two reconcilers and two outbox relays; stop the node "
            "leading the work queue and start it again, SIGKILL one worker (it never touches "
            "the broker on 5672, nor crashes a database)"
        ),
    )
    parser.add_argument(
        "--downstream",
        action="store_true",
        help=(
            "the WMS outage drill instead: a stub WMS down for 60 s under 1,500 orders "
            "(its options: python -m drills --downstream --help)"
        ),
    )
    parser.add_argument(
        "--node-down-seconds",
        type=float,
        default=20.0,
        help="with --cluster: how long the stopped node stays down (default 20)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the scratch database and the worker log even when the drill passes",
    )
    args = parser.parse_args(argv)
    if args.messages < 100:
        parser.error("--messages must be at least 100 (the shares need whole messages)")
    if args.cluster:
        args.no_database_crash = args.no_broker_restart = True
    if not args.no_database_crash and (why := private_postgres.available()):
        parser.error(
            f"the database crash needs a private PostgreSQL server: {why} "
            "(or pass --no-database-crash)"
        )
    return args


def config_from(args: argparse.Namespace) -> DrillConfig | ClusterDrillConfig:
    seed = args.seed if args.seed is not None else random.randrange(1_000_000)
    if args.cluster:
        return ClusterDrillConfig(
            database_url=os.environ.get("RABBITRETRY_DATABASE_URL", DEFAULT_DATABASE_URL),
            messages=args.messages,
            seed=seed,
            publish_seconds=args.publish_seconds or default_publish_seconds(args.messages),
            concurrency=args.concurrency or 8,
            settle_timeout=args.settle_timeout,
            node_down_seconds=args.node_down_seconds,
            keep=args.keep,
        )
    return DrillConfig(
        amqp_url=os.environ.get("RABBITRETRY_AMQP_URL", DEFAULT_AMQP_URL),
        database_url=os.environ.get("RABBITRETRY_DATABASE_URL", DEFAULT_DATABASE_URL),
        messages=args.messages,
        seed=seed,
        publish_seconds=args.publish_seconds or default_publish_seconds(args.messages),
        concurrency=args.concurrency or 16,
        settle_timeout=args.settle_timeout,
        restart_broker=not args.no_broker_restart,
        crash_database=not args.no_database_crash,
        keep=args.keep,
    )


def default_publish_seconds(messages: int) -> float:
    return max(30.0, 18.0 * messages / 1000)


def report(result: DrillResult) -> None:
    print(result.details())
    for line in [*result.verdict.explain(), *result.verdict.figures()]:
        print(line)
    if not result.verdict.ok:
        print(
            f"drill: FAILED (seed {result.plan.seed}); kept for a post-mortem: the worker log "
            f"{result.worker_log} and the database {result.database}"
        )
    print(result.summary())


async def main_async(config: DrillConfig | ClusterDrillConfig) -> DrillResult:
    # SIGTERM interrupts the drill like Ctrl-C does, so that its finally blocks restore everything.
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    if isinstance(config, ClusterDrillConfig):
        return await run_cluster_drill(config, say=lambda line: print(line, flush=True))
    return await run_drill(config, say=lambda line: print(line, flush=True))


def main(argv: list[str] | None = None) -> int:
    # The publisher's reconnects while the broker is away are expected: keep them quiet.
    for name in ("aio_pika", "aiormq"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    argv = sys.argv[1:] if argv is None else argv
    if "--downstream" in argv:  # a drill of its own, with its own options
        return downstream.main([arg for arg in argv if arg != "--downstream"])
    config = config_from(parse_args(argv))
    print(f"drill: seed {config.seed} (replay with --seed {config.seed})", flush=True)
    try:
        result = asyncio.run(main_async(config))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("drill: interrupted; everything it changed was restored", file=sys.stderr)
        return 130
    except ClusterDown as error:
        print(f"drill: {error}", file=sys.stderr)
        return 2
    report(result)
    return 0 if result.verdict.ok else 1


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
