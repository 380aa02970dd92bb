"""Results as text: the console summary and the tables of docs/benchmarks.md. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

LABELS = {
    "A": "A raw aio-pika",
    "B": "B naive ledger (2 commits)",
    "C": "C rabbitretry",
    "D": "D dramatiq",
}


def throughput_table(rates: Mapping[str, Mapping[str, float]]) -> str:
    """Markdown: one row per variant, one column per concurrency setting."""
    settings = ["1", "8", "32", "1x1", "1x8"]
    lines = [
        "| variant | " + " | ".join(settings) + " |",
        "|---|" + "---:|" * len(settings),
    ]
    for variant, label in LABELS.items():
        row = rates.get(variant, {})
        cells = [f"{row[s]:,.0f}" if s in row else "" for s in settings]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratio_table(ratios: Mapping[str, float]) -> str:
    lines = ["| ratio | value |", "|---|---:|"]
    lines += [f"| {name} | {value:.2f} |" for name, value in ratios.items()]
    return "\n".join(lines)


def targets_table(targets: list[Mapping[str, Any]]) -> str:
    lines = ["| target | measured | limit | met |", "|---|---:|---:|:---:|"]
    for t in targets:
        sign = "≥" if t["higher_is_better"] else "≤"
        lines.append(
            f"| {t['name']} | {t['value']:.2f} {t['unit']} | {sign} {t['limit']:.2f} {t['unit']} "
            f"| {'yes' if t['met'] else '**no**'} |"
        )
    return "\n".join(lines)


def other_table(results: Mapping[str, Any]) -> str:
    latency = results["latency"]
    retry = results["retry_delay"]
    lines = [
        "| measure | p50 | p95 | p99 | max |",
        "|---|---:|---:|---:|---:|",
        f"| end-to-end latency at {latency['rate']:.0f} msgs/s (ms) | {latency['p50']:.1f} "
        f"| {latency['p95']:.1f} | {latency['p99']:.1f} | {latency['max']:.1f} |",
        f"| retry-delay error, {retry['count']} retries of 1-8 s (s) | {retry['p50']:.3f} "
        f"| {retry['p95']:.3f} | {retry['p99']:.3f} | {retry['max']:.3f} |",
        "",
        "| ledger rows | due-scan (ms, median) |",
        "|---:|---:|",
    ]
    lines += [f"| {int(rows):,} | {ms:.2f} |" for rows, ms in results["due_scan_ms"].items()]
    lines.append("")
    lines.append(f"Worker peak RSS: {results['rss_mb']:.1f} MB.")
    return "\n".join(lines)


def console(results: Mapping[str, Any]) -> str:
    return "\n\n".join(
        [
            throughput_table(results["throughput"]),
            ratio_table(results["ratios"]),
            other_table(results),
            targets_table(results["targets"]),
        ]
    )


START = "<!-- results:start -->"
END = "<!-- results:end -->"


def results_section(results: Mapping[str, Any]) -> str:
    """The generated part of docs/benchmarks.md: machine, tables, chart."""
    m = results["machine"]
    return "\n".join(
        [
            START,
            f"Run of {results['date']}: {results['messages']:,} messages a run, median of "
            f"{results['repeats']} runs, {results['seconds']} s in all. Machine: {m['cpu']}, "
            f"{m['cores']} cores, {m['system']}; Python {m['python']}, RabbitMQ "
            f"{m['rabbitmq']}, PostgreSQL {m['postgres']}; due-scan statement: "
            f"{results['due_scan_statement']}.",
            "",
            "Throughput (msgs/s):",
            "",
            throughput_table(results["throughput"]),
            "",
            "![throughput](../bench/results/throughput.png)",
            "",
            ratio_table(results["ratios"]),
            "",
            other_table(results),
            "",
            targets_table(results["targets"]),
            END,
        ]
    )


def with_results(document: str, results: Mapping[str, Any]) -> str:
    """``document`` with its generated section replaced (or appended if it has none)."""
    section = results_section(results)
    if START in document and END in document:
        before, rest = document.split(START, 1)
        _, after = rest.split(END, 1)
        return before + section + after
    return document.rstrip("\n") + "\n\n" + section + "\n"
