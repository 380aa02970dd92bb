"""Where one delivery's time goes, and where the worker's CPU goes.

``python -m bench.stages [--messages N] [--concurrency C] [--profile]`` runs a real
``Worker`` with a no-op consumer over a prefilled queue and times each delivery's stages:

* receive: from the previous delivery's ack to this delivery's arrival in the pipeline (the
  broker's turnaround with prefetch 1; meaningful at concurrency 1 only);
* claim: the ledger's claim (one round trip);
* attempt: parsing, validating and the (empty) handler;
* success: the success mark (one round trip, the durable flush);
* ack: the ack to the broker;
* other: the pipeline's own bookkeeping (the rest of the delivery);

and the CPU time the worker's process spent per message (the stage timing included).

``--profile`` adds a cProfile of the worker over the measured messages, summarised by the
functions with the most time of their own.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import logging
import pstats
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, TypeVar

from bench import stats
from bench.services import scratch_database, wait_until
from bench.throughput import Clock, prefilled_worker
from rabbitretry.delivery import pipeline
from rabbitretry.ledger import AttemptLedger

STAGES = ("receive", "claim", "attempt", "success", "ack", "other")
T = TypeVar("T")


class StageClock:
    """Per-stage durations of the deliveries after the warm-up, in milliseconds."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.seen = 0
        # Each delivery runs in a task of its own: its stages go to its own dict.
        self.current: ContextVar[dict[str, float]] = ContextVar("stages")
        self.samples: dict[str, list[float]] = defaultdict(list)
        self.last_ack = 0.0

    def timed(self, stage: str, call: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        async def timed_call(*args: Any, **kwargs: Any) -> T:
            started = time.perf_counter()
            try:
                return await call(*args, **kwargs)
            finally:
                ended = time.perf_counter()
                current = self.current.get()
                current[stage] = current.get(stage, 0.0) + (ended - started) * 1000
                if stage == "ack":
                    self.last_ack = ended

        return timed_call

    def timed_future(
        self, stage: str, send: Callable[..., asyncio.Future[T]]
    ) -> Callable[..., asyncio.Future[T]]:
        """``send``, timed until the future it returns is set; the future itself is returned,
        as its callers may read it after their own cancellation."""

        def timed_send(*args: Any) -> asyncio.Future[T]:
            started = time.perf_counter()
            current = self.current.get()
            future = send(*args)

            def ended(_: asyncio.Future[T]) -> None:
                current[stage] = current.get(stage, 0.0) + (time.perf_counter() - started) * 1000

            future.add_done_callback(ended)
            return future

        return timed_send

    def delivery(self, process: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def timed_process(pipe: Any, message: Any, *rest: Any) -> Any:
            started = time.perf_counter()
            receive = (started - self.last_ack) * 1000 if self.last_ack else None
            current: dict[str, float] = {}
            self.current.set(current)
            try:
                return await process(pipe, message, *rest)
            finally:
                total = (time.perf_counter() - started) * 1000
                self.seen += 1
                if self.seen > self.warmup:
                    if receive is not None:
                        self.samples["receive"].append(receive)
                    for stage in STAGES[1:-1]:
                        self.samples[stage].append(current.get(stage, 0.0))
                    self.samples["other"].append(total - sum(current.values()))

        return timed_process


def instrument(clock: StageClock) -> None:
    """Wrap the pipeline's stages (this process only: a benchmark, never the library)."""
    AttemptLedger.claim_sent = clock.timed_future("claim", AttemptLedger.claim_sent)  # type: ignore[method-assign]
    AttemptLedger.succeed = clock.timed("success", AttemptLedger.succeed)  # type: ignore[method-assign]
    pipeline.run_attempt = clock.timed("attempt", pipeline.run_attempt)
    pipeline._settle = clock.timed("ack", pipeline._settle)
    pipeline.Pipeline.process = clock.delivery(pipeline.Pipeline.process)  # type: ignore[method-assign]


async def run_stages(
    database_url: str, messages: int, concurrency: int, profile: bool
) -> tuple[dict[str, dict[str, float]], float, float, pstats.Stats | None]:
    warmup = max(200, messages // 10)
    clock = StageClock(warmup)
    instrument(clock)
    done = Clock(warmup, messages)
    profiler = cProfile.Profile() if profile else None
    async with prefilled_worker(database_url, concurrency, done, "stages") as (_, task):
        await wait_until(lambda: done.count >= warmup or task.done(), timeout=120)
        if profiler is not None:
            profiler.enable()
        cpu_before = time.process_time()
        await wait_until(lambda: done.done or task.done(), timeout=600)
        cpu_us = (time.process_time() - cpu_before) / messages * 1e6
        if profiler is not None:
            profiler.disable()
        rate = messages / (time.monotonic() - done.started)
        if task.done():
            task.result()
    summaries = {stage: stats.summary(clock.samples[stage]) for stage in STAGES}
    profiled = pstats.Stats(profiler) if profiler is not None else None
    return summaries, rate, cpu_us, profiled


def stage_table(summaries: dict[str, dict[str, float]]) -> str:
    lines = ["| stage | p50 (ms) | p99 (ms) |", "|---|---:|---:|"]
    lines += [f"| {stage} | {s['p50']:.3f} | {s['p99']:.3f} |" for stage, s in summaries.items()]
    total = sum(s["p50"] for s in summaries.values())
    lines.append(f"| sum of medians | {total:.3f} | |")
    return "\n".join(lines)


async def main(messages: int, concurrency: int, profile: bool) -> None:
    async with scratch_database() as database_url:
        summaries, rate, cpu_us, profiled = await run_stages(
            database_url, messages, concurrency, profile
        )
    print(
        f"{messages:,} messages at concurrency {concurrency}: {rate:,.0f} msgs/s, "
        f"{cpu_us:,.0f} µs of the worker's CPU per message (this process, timing included)\n"
    )
    print(stage_table(summaries))
    if profiled is not None:
        print()
        profiled.sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.stages", description=__doc__)
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--profile", action="store_true", help="a cProfile of the worker too")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(main(args.messages, args.concurrency, args.profile))
