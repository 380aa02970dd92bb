"""``python -m bench.breaker_cost``: what a closed downstream breaker costs a delivery.

The same no-op consumer at concurrency 8, with and without a declared downstream whose block
wraps the handler, alternated round by round so that a noisy minute hits both: the rate
ratio, and the consumer's CPU time per message beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

from bench.services import scratch_database
from bench.throughput import run_rabbitretry


async def measure(messages: int, rounds: int, concurrency: int) -> None:
    rates: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    async with scratch_database() as database_url:
        for round_ in range(1, rounds + 1):
            for downstream in (False, True) if round_ % 2 else (True, False):
                result = await run_rabbitretry(
                    database_url, concurrency, messages, messages // 10, downstream
                )
                rates[downstream].append(result.rate)
                cpu[downstream].append(result.costs["cpu_us"])
                print(
                    f"  round {round_}/{rounds} {'with' if downstream else 'without'} "
                    f"a downstream: {result.rate:,.0f} msgs/s, {result.costs['cpu_us']:.0f} µs",
                    flush=True,
                )
    ratio = statistics.median(rates[True]) / statistics.median(rates[False])
    extra = statistics.median(cpu[True]) - statistics.median(cpu[False])
    print(
        f"C({concurrency}) with a closed breaker / without: {ratio:.3f} of the rate "
        f"(median of {rounds}); CPU per message {extra:+.1f} µs"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.breaker_cost", description=__doc__)
    parser.add_argument("--messages", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    asyncio.run(measure(args.messages, args.rounds, args.concurrency))


if __name__ == "__main__":
    main()
