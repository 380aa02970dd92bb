"""``python -m bench``: every variant, latency, retry timing, scaling and the due-scan, in one run.

Writes ``bench/results/latest.json`` and ``bench/results/throughput.png``, the generated part of
docs/benchmarks.md, and prints the tables. ``--quick`` is the short run (3,000 messages a
variant, retries up to a minute, 1,000 callbacks).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import signal
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg

from bench import big_ledger, console_pages, report, stats
from bench import callbacks as callback_receiver
from bench.due_scan import run_due_scan, scan_statement
from bench.latency import run_latency
from bench.processes import run_processes
from bench.retry_delay import MIN_DELAY, run_retry_delays
from bench.rounds import throughput
from bench.services import AMQP_URL, scratch_database

RESULTS = Path(__file__).parent / "results"
DOCUMENT = Path(__file__).parent.parent / "docs" / "benchmarks.md"

CONSOLE_ROWS = 100_000  # dead letters (and as many succeeded) behind the console's pages


def cpu_model() -> str:
    path = Path("/proc/cpuinfo")
    if not path.exists():
        return platform.processor() or "?"
    lines = path.read_text().splitlines()
    models = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return models[0] if models else "?"


async def machine(database_url: str) -> dict[str, Any]:
    connection = await aio_pika.connect(AMQP_URL)
    try:
        props = connection.transport.connection.server_properties  # type: ignore[union-attr]
        rabbitmq = props.get("version", "?")
    finally:
        await connection.close()
    conn = await asyncpg.connect(database_url)
    try:
        postgres = await conn.fetchval("SHOW server_version")
    finally:
        await conn.close()
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "rabbitmq": str(rabbitmq),
        "postgres": postgres,
        "system": platform.platform(),
    }


async def latencies(database_url: str, peak: float, seconds: float) -> dict[str, Any]:
    """A, B and C at a quarter and at half of C's peak, each at concurrency 32."""
    found: dict[str, Any] = {}
    for load, fraction in (("quarter", 0.25), ("half", 0.5)):
        rate = fraction * peak
        count = max(500, int(rate * seconds))
        found[load] = {"rate": rate}
        for variant in ("A", "B", "C"):
            print(f"  latency {variant} at {rate:,.0f} msgs/s, {count:,} messages", flush=True)
            report = await run_latency(database_url, variant, rate, count, 32)
            found[load][variant] = stats.latency_summary(report.latencies_ms)
            if variant == "C":
                found[load]["rss_mb"] = report.peak_rss_mb
    return found


async def main(
    messages: int,
    repeats: int,
    retries: int,
    max_retry_delay: float,
    latency_seconds: float,
    callbacks: int,
    big_rows: int,
) -> None:
    # SIGTERM stops the run like Ctrl-C: cleanup (scratch database, queues) still runs.
    this = asyncio.current_task()
    assert this is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, this.cancel)
    started = time.monotonic()
    async with scratch_database() as database_url:
        print(f"throughput: {messages:,} messages a run, {repeats} rounds, medians", flush=True)
        runs, cost_runs = await throughput(database_url, messages, repeats)
        rates = stats.medians(runs)
        costs = {name: stats.medians(by_variant) for name, by_variant in cost_runs.items()}
        spread = stats.paired_ratios(runs)
        ratios = {**stats.ratios(rates), **{name: r["median"] for name, r in spread.items()}}

        print("latency: A, B and C at 25 % and 50 % of C's peak", flush=True)
        # The latency runs' worker is one process: their load is set from its own peak.
        one_process = {s: rate for s, rate in rates["C"].items() if "x" not in s}
        latency = await latencies(database_url, stats.best(one_process), latency_seconds)
        latency.update({v: latency["half"][v] for v in ("A", "B", "C")})  # stable names
        latency["rate"] = latency["half"]["rate"]

        print("worker processes: 1, 2 and 4, concurrency 8 each", flush=True)
        processes = {
            str(count): await run_processes(database_url, count, messages, max(200, messages // 10))
            for count in (1, 2, 4)
        }

        print(f"retry timing: {retries} retries of {MIN_DELAY}-{max_retry_delay:g} s", flush=True)
        timing = await run_retry_delays(database_url, retries, max_retry_delay)
        retry = {
            **stats.lateness_summary(timing.lateness_s, timing.parked),
            "min_delay_s": MIN_DELAY,
            "max_delay_s": max_retry_delay,
        }

        print("due-scan: 10k, 100k, 1M ledger rows", flush=True)
        scan = await run_due_scan(database_url)
        info = await machine(database_url)

    print(f"callback receiver: {callbacks:,} callbacks, 16 clients", flush=True)
    receiver = await callback_receiver.run(callbacks, 16, 0.1)

    print(f"console pages: {CONSOLE_ROWS:,} dead letters", flush=True)
    async with scratch_database() as console_url:
        await console_pages.fill(console_url, CONSOLE_ROWS)
        pages = await console_pages.measure(console_url, repeats=15)

    print(
        f"big ledger: {big_rows:,} finished rows, C({big_ledger.CONCURRENCY}) and a prune",
        flush=True,
    )
    big = await big_ledger.run(big_rows, min(messages, 8_000), repeats)

    rss = latency["half"]["rss_mb"]
    targets = stats.targets(stats.Measured(ratios, latency, retry, scan.get("1000000"), rss, big))
    results = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": info,
        "messages": messages,
        "repeats": repeats,
        "runs": runs,
        "throughput": rates,
        "costs": costs,
        "cost_runs": cost_runs,
        "ratios": ratios,
        "ratio_spread": spread,
        "latency": latency,
        "processes": processes,
        "rss_mb": rss,
        "retry_delay": retry,
        "due_scan_ms": scan,
        "due_scan_statement": scan_statement()[1],
        "callbacks": receiver,
        "console_pages": [
            {"page": name, "path": path, "median_ms": median, "slowest_ms": slowest}
            for name, path, median, slowest in pages
        ],
        "console_rows": CONSOLE_ROWS,
        "big_ledger": big,
        "targets": [t.as_dict() for t in targets],
        "seconds": round(time.monotonic() - started),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latest.json").write_text(json.dumps(results, indent=2) + "\n")
    from bench.chart import throughput_chart

    throughput_chart(rates, RESULTS / "throughput.png")
    if DOCUMENT.exists():
        DOCUMENT.write_text(report.with_results(DOCUMENT.read_text(), results))
    print()
    print(report.console(results))
    print(f"\nwrote {RESULTS / 'latest.json'}, throughput.png and {DOCUMENT.name}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3,000 messages a run")
    parser.add_argument("--messages", type=int, help="messages a run (default 20,000)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of every variant")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    messages = args.messages or (3_000 if args.quick else 20_000)
    asyncio.run(
        main(
            messages,
            args.repeats,
            retries=200 if args.quick else 400,
            max_retry_delay=60.0 if args.quick else 180.0,
            latency_seconds=5.0 if args.quick else 15.0,
            callbacks=1_000 if args.quick else 5_000,
            big_rows=1_000_000 if args.quick else 10_000_000,
        )
    )
