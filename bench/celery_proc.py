"""E: a Celery worker in a process of its own, for :func:`bench.peers.run_celery`.

``python -m bench.celery_proc QUEUE --concurrency N --warmup W --messages M`` runs a Celery
worker (the prefork pool, N processes) on the prefilled QUEUE with the settings Celery's
documentation gives for reliable delivery: the ack after the task (``task_acks_late``), one
message prefetched per pool process (``worker_prefetch_multiplier=1``), a message whose pool
process dies requeued (``task_reject_on_worker_lost``). Its no-op task counts the messages
handled in a counter the pool processes share; the one that handles the last warm-up message
marks the time and the CPU of the whole worker (the main process and its pool processes), the
one that handles the last measured message marks them again, and the main process then prints
one line, ``result {"seconds": ..., "cpu_s": ...}``, and stops the worker.

Left out, because they only serve a cluster of workers and would leave exchanges behind on a
broker others use: remote control (``worker_enable_remote_control=False``, no pidbox queue),
gossip, mingle and the worker heartbeat events (``--without-gossip --without-mingle
--without-heartbeat``). The queue is the benchmark's, declared before the worker starts
(``no_declare``). Everything else is Celery's default: JSON, no result backend, warm shutdown.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import aio_pika
from celery import Celery
from kombu import Queue
from kombu.serialization import dumps

from bench.costs import process_tree_cpu
from bench.services import AMQP_URL

TASK = "bench.noop"
RESULT = "result "  # the prefix of the line the worker prints when it is done
POLL = 0.02  # seconds between the main process's looks at the marks


def make_app(queue: str) -> Celery:
    app = Celery("bench", broker=AMQP_URL, set_as_current=False)
    app.conf.update(
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        task_reject_on_worker_lost=True,
        task_queues=[Queue(queue, routing_key=queue, no_declare=True)],
        task_default_queue=queue,
        worker_enable_remote_control=False,
        broker_connection_retry_on_startup=True,  # the default; set, so Celery does not warn
    )
    return app


def task_messages(queue: str, count: int) -> Iterator[aio_pika.Message]:
    """``count`` calls of the no-op task as Celery's own client would send them (message
    protocol 2: the task in the headers, ``[args, kwargs, embed]`` in a JSON body), for the
    benchmark to prefill with its own publisher."""
    app = make_app(queue)
    for index in range(count):
        task_id = str(uuid.uuid4())
        headers, properties, body, _ = app.amqp.as_task_v2(task_id, TASK, args=(index,))
        content_type, encoding, data = dumps(body, serializer="json")
        yield aio_pika.Message(
            data.encode() if isinstance(data, str) else data,
            message_id=task_id,
            correlation_id=properties["correlation_id"],
            content_type=content_type,
            content_encoding=encoding,
            headers=headers,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )


def main(args: argparse.Namespace) -> None:
    app = make_app(args.queue)
    worker_pid = os.getpid()
    total = args.warmup + args.messages
    # Shared with the pool processes, which the prefork pool forks from this one.
    count = multiprocessing.Value("q", 0)
    marks = multiprocessing.Array("d", 4)  # started, its CPU, ended, its CPU

    @app.task(name=TASK)
    def noop(index: int) -> None:
        with count.get_lock():
            count.value += 1
            handled = count.value
        if handled == args.warmup:
            marks[0], marks[1] = time.monotonic(), process_tree_cpu(worker_pid)
        elif handled == total:
            marks[2], marks[3] = time.monotonic(), process_tree_cpu(worker_pid)

    parent = os.getppid()

    def report_when_done() -> None:
        while not marks[2]:
            if os.getppid() != parent:  # the benchmark is gone: do not hold its queue
                os.kill(worker_pid, signal.SIGTERM)
                return
            time.sleep(POLL)
        found: dict[str, Any] = {"seconds": marks[2] - marks[0], "cpu_s": marks[3] - marks[1]}
        # To the pipe itself: Celery sends what is printed to its log.
        os.write(sys.__stdout__.fileno(), (RESULT + json.dumps(found) + "\n").encode())
        os.kill(worker_pid, signal.SIGTERM)  # Celery's warm shutdown

    threading.Thread(target=report_when_done, daemon=True).start()
    app.worker_main(
        [
            "worker",
            "--pool=prefork",
            f"--concurrency={args.concurrency}",
            "--loglevel=WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.celery_proc", description=__doc__)
    parser.add_argument("queue")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--messages", type=int, required=True)
    main(parser.parse_args())
