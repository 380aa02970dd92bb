"""Rounds of the throughput variants: every variant once a round, round-robin.

``python -m bench`` runs them all (A, B and C at concurrency 1, 8 and 32, C also as two
processes of 4 and of 16 consumers, D with 1 and 8 threads, the peers E and F at 1, 8 and
32). ``python -m bench.rounds`` runs some of them alone, in a scratch database, and prints
their rates, costs, ratios and the peers' targets::

    python -m bench.rounds --variants C,E,F --concurrency 8,32 --messages 5000 --repeats 3
    python -m bench.rounds --variants A,C --event-loop uvloop

``--concurrency`` selects A, B, C, E and F's settings; D keeps its own (1x1 and 1x8).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Iterable

from bench import report, stats
from bench.peers import run_celery, run_faststream
from bench.services import scratch_database
from bench.supervised import run_supervised
from bench.throughput import RunResult, run_dramatiq, run_naive, run_rabbitretry, run_raw

Runner = Callable[[int, int], Awaitable[RunResult]]  # (messages, warmup) -> rate and costs
Runs = dict[str, dict[str, list[float]]]  # variant -> setting -> one figure per round

VARIANTS = ("A", "B", "C", "D", "E", "F")
CONCURRENCIES = (1, 8, 32)


def variants(
    database_url: str,
    only: Iterable[str] = VARIANTS,
    concurrencies: Iterable[int] = CONCURRENCIES,
) -> list[tuple[str, str, Runner]]:
    """(variant, setting, runner) in the order of a round; the variants at one concurrency run
    back to back, so that a round's ratios compare runs a minute apart at most."""
    chosen = set(only)
    found: list[tuple[str, str, Runner]] = []
    for c in concurrencies:
        found.append(("A", str(c), lambda m, w, c=c: run_raw(c, m, w)))
        found.append(("B", str(c), lambda m, w, c=c: run_naive(database_url, c, m, w)))
        found.append(("C", str(c), lambda m, w, c=c: run_rabbitretry(database_url, c, m, w)))
        if c > 1:  # the same consumers in two processes: rabbitretry run --processes 2
            found.append(
                (
                    "C",
                    f"2x{c // 2}",
                    lambda m, w, c=c: run_supervised(database_url, 2, c // 2, m, w),
                )
            )
        found.append(("E", str(c), lambda m, w, c=c: run_celery(c, m, w)))
        found.append(("F", str(c), lambda m, w, c=c: run_faststream(c, m, w)))
    for threads in (1, 8):
        found.append(("D", f"1x{threads}", lambda m, w, t=threads: run_dramatiq(t, m, w)))
    return [entry for entry in found if entry[0] in chosen]


async def throughput(
    database_url: str,
    messages: int,
    repeats: int,
    only: Iterable[str] = VARIANTS,
    concurrencies: Iterable[int] = CONCURRENCIES,
) -> tuple[Runs, dict[str, Runs]]:
    """Every variant ``repeats`` times, round-robin so that a noisy minute hits them all: the
    rates, and each cost per message (``cpu_us``, ``wal_bytes``...) in the same shape."""
    warmup = max(200, messages // 10)
    runs: Runs = {}
    costs: dict[str, Runs] = {}
    chosen = variants(database_url, only, concurrencies)
    for repeat in range(1, repeats + 1):
        for variant, setting, runner in chosen:
            result = await runner(messages, warmup)
            runs.setdefault(variant, {}).setdefault(setting, []).append(result.rate)
            for name, value in result.costs.items():
                costs.setdefault(name, {}).setdefault(variant, {}).setdefault(setting, [])
                costs[name][variant][setting].append(value)
            print(
                f"  run {repeat}/{repeats}  {variant}({setting}): {result.rate:,.0f} msgs/s, "
                + ", ".join(f"{name} {value:,.1f}" for name, value in result.costs.items()),
                flush=True,
            )
    return runs, costs


def choice(text: str, allowed: Iterable[str]) -> list[str]:
    """A comma-separated list, each item one of ``allowed``."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    wrong = [item for item in items if item not in set(allowed)]
    if wrong or not items:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(allowed)}, not {text!r}")
    return items


async def main(messages: int, repeats: int, only: list[str], concurrencies: list[int]) -> None:
    # SIGTERM stops the run like Ctrl-C: cleanup (scratch database, queues, workers) still runs.
    this = asyncio.current_task()
    assert this is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, this.cancel)
    started = time.monotonic()
    async with scratch_database() as database_url:
        print(
            f"throughput of {','.join(only)}: {messages:,} messages a run, {repeats} rounds",
            flush=True,
        )
        runs, cost_runs = await throughput(database_url, messages, repeats, only, concurrencies)
    rates = stats.medians(runs)
    costs = {name: stats.medians(by_variant) for name, by_variant in cost_runs.items()}
    spread = stats.paired_ratios(runs)
    ratios = {**stats.ratios(rates), **{name: r["median"] for name, r in spread.items()}}
    targets = [t.as_dict() for t in stats.peer_targets(ratios)]
    print()
    print(report.throughput_table(rates))
    print("\nCosts per message (medians):\n\n" + report.costs_table(costs))
    print()
    print(report.ratio_table(ratios, spread))
    if targets:
        print()
        print(report.targets_table(targets))
    print(f"\n{time.monotonic() - started:.0f} s in all")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.rounds", description=__doc__)
    parser.add_argument(
        "--variants",
        type=lambda text: choice(text, VARIANTS),
        default=list(VARIANTS),
        help="comma-separated, of A,B,C,D,E,F (default: all)",
    )
    parser.add_argument(
        "--concurrency",
        type=lambda text: [int(c) for c in choice(text, [str(c) for c in CONCURRENCIES])],
        default=list(CONCURRENCIES),
        help="comma-separated, of 1,8,32 (default: all)",
    )
    parser.add_argument("--messages", type=int, default=20_000, help="messages a run")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of every variant")
    parser.add_argument(
        "--event-loop",
        choices=["asyncio", "uvloop"],
        default="asyncio",
        help="the loop every in-process variant runs on (uvloop: rabbitretry[uvloop])",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    loop_factory = None
    if args.event_loop == "uvloop":
        import uvloop

        loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(main(args.messages, args.repeats, args.variants, args.concurrency))
