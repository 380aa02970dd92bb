"""Results as text: the console summary and the tables of docs/benchmarks.md. Pure."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

LABELS = {
    "A": "A raw aio-pika",
    "B": "B naive ledger (2 commits)",
    "C": "C rabbitretry",
    "D": "D dramatiq",
    "E": "E Celery (prefork, acks late)",
    "F": "F FastStream (manual ack)",
}


def throughput_table(rates: Mapping[str, Mapping[str, float]]) -> str:
    """Markdown: one row per variant, one column per concurrency setting."""
    settings = [
        s
        for s in ("1", "8", "32", "2x4", "2x16", "1x1", "1x8")
        if any(s in row for row in rates.values())
    ]
    lines = [
        "| variant | " + " | ".join(settings) + " |",
        "|---|" + "---:|" * len(settings),
    ]
    for variant, label in LABELS.items():
        row = rates.get(variant, {})
        if not row:
            continue  # not run (python -m bench.rounds --variants)
        cells = [f"{row[s]:,.0f}" if s in row else "" for s in settings]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


COSTS = (
    ("cpu_us", "consumer CPU (µs)", ",.0f"),
    ("wal_bytes", "WAL (bytes)", ",.0f"),
    ("commits", "commits", ".2f"),
    ("rows", "rows written", ".2f"),
    ("table_bytes", "bytes stored", ",.0f"),
    ("db_cpu_us", "database CPU (µs)", ",.0f"),
)


def costs_table(costs: Mapping[str, Mapping[str, Mapping[str, float]]]) -> str:
    """Markdown: each cost per message (medians over the rounds), one row per run."""
    lines = [
        "| variant | " + " | ".join(label for _, label, _ in COSTS) + " |",
        "|---|" + "---:|" * len(COSTS),
    ]
    for variant, label in LABELS.items():
        settings = {
            setting for name, _, _ in COSTS for setting in costs.get(name, {}).get(variant, {})
        }
        for setting in sorted(settings, key=lambda s: (len(s), s)):
            cells = [
                format(costs[name][variant][setting], spec)
                if setting in costs.get(name, {}).get(variant, {})
                else ""
                for name, _, spec in COSTS
            ]
            lines.append(f"| {label} ({setting}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratio_table(ratios: Mapping[str, float], spread: Mapping[str, Mapping[str, Any]]) -> str:
    """Each ratio, with its spread over the repeats where it was measured pairwise."""
    lines = ["| ratio | value | per repeat (min to max) |", "|---|---:|---:|"]
    for name, value in ratios.items():
        paired = spread.get(name)
        span = f"{paired['min']:.2f} to {paired['max']:.2f}" if paired else ""
        lines.append(f"| {name} | {value:.2f} | {span} |")
    return "\n".join(lines)


def targets_table(targets: list[Mapping[str, Any]]) -> str:
    lines = ["| target | measured | limit | met |", "|---|---:|---:|:---:|"]
    for t in targets:
        sign = "≥" if t["higher_is_better"] else "≤"
        unit = f" {t['unit']}" if t["unit"] else ""
        digits = 0 if not t["unit"] else 2
        lines.append(
            f"| {t['name']} | {t['value']:.{digits}f}{unit} | {sign} {t['limit']:.{digits}f}{unit} "
            f"| {'yes' if t['met'] else '**no**'} |"
        )
    return "\n".join(lines)


def latency_table(latency: Mapping[str, Any]) -> str:
    """Publish-to-ack latency of each variant at each offered rate, in milliseconds."""
    lines = [
        "| variant | offered rate | p50 | p95 | p99 | max |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for load in ("quarter", "half"):
        at = latency[load]
        for variant in ("A", "B", "C"):
            s = at[variant]
            lines.append(
                f"| {LABELS[variant]} | {at['rate']:,.0f} msgs/s | {s['p50_ms']:.1f} "
                f"| {s['p95_ms']:.1f} | {s['p99_ms']:.1f} | {s['max_ms']:.1f} |"
            )
    return "\n".join(lines)


def retry_table(retry: Mapping[str, Any]) -> str:
    return "\n".join(
        [
            "| retries | lateness p50 | p95 | p99 | max | copies early at a worker |",
            "|---:|---:|---:|---:|---:|---:|",
            f"| {retry['count']} ({retry['min_delay_s']:g} s to {retry['max_delay_s']:g} s) "
            f"| {retry['lateness_p50_s'] * 1000:.0f} ms | {retry['lateness_p95_s'] * 1000:.0f} ms "
            f"| {retry['lateness_p99_s'] * 1000:.0f} ms | {retry['lateness_max_s'] * 1000:.0f} ms "
            f"| {retry['early_count']} |",
        ]
    )


def processes_table(processes: Mapping[str, Mapping[str, float]]) -> str:
    lines = [
        "| worker processes (concurrency 8 each) | msgs/s | ledger commits/s |",
        "|---:|---:|---:|",
    ]
    lines += [
        f"| {count} | {p['msgs_per_s']:,.0f} | {p['commits_per_s']:,.0f} |"
        for count, p in processes.items()
    ]
    return "\n".join(lines)


def callbacks_table(receiver: Mapping[str, float]) -> str:
    """The callback receiver: callbacks stored per second and response times."""
    return "\n".join(
        [
            "| callbacks stored/s | p50 | p95 | p99 | max | errors | store statement alone/s |",
            "|---:|---:|---:|---:|---:|---:|---:|",
            f"| {receiver['stored_per_second']:,.0f} | {receiver['p50_ms']:.1f} ms "
            f"| {receiver['p95_ms']:.1f} ms | {receiver['p99_ms']:.1f} ms "
            f"| {receiver['max_ms']:.1f} ms | {receiver['errors']:.0f} "
            f"| {receiver['statement_alone_per_second']:,.0f} |",
        ]
    )


def console_table(pages: list[Mapping[str, Any]], rows: int) -> str:
    """The console's list pages on a large ledger (goal: each under 300 ms)."""
    lines = [
        f"| console page ({rows:,} dead letters) | median | slowest |",
        "|---|---:|---:|",
    ]
    lines += [
        f"| `{p['path']}` | {p['median_ms']:.0f} ms | {p['slowest_ms']:.0f} ms |" for p in pages
    ]
    return "\n".join(lines)


def other_table(results: Mapping[str, Any]) -> str:
    lines = ["| ledger rows | due-scan (ms, median) |", "|---:|---:|"]
    lines += [f"| {int(rows):,} | {ms:.2f} |" for rows, ms in results["due_scan_ms"].items()]
    lines.append("")
    lines.append(f"Worker peak RSS: {results['rss_mb']:.1f} MB.")
    if results.get("big_ledger"):
        lines.append("")
        lines += [f"- {line}" for line in big_ledger_summary(results["big_ledger"])]
    return "\n".join(lines)


def tables(results: Mapping[str, Any]) -> list[str]:
    return [
        "Costs per message (medians):\n\n" + costs_table(results["costs"]),
        ratio_table(results["ratios"], results["ratio_spread"]),
        latency_table(results["latency"]),
        retry_table(results["retry_delay"]),
        processes_table(results["processes"]),
        callbacks_table(results["callbacks"]),
        console_table(results["console_pages"], results["console_rows"]),
        other_table(results),
        targets_table(results["targets"]),
    ]


def console(results: Mapping[str, Any]) -> str:
    return "\n\n".join([throughput_table(results["throughput"]), *tables(results)])


START = "<!-- results:start -->"
END = "<!-- results:end -->"


def results_section(results: Mapping[str, Any]) -> str:
    """The generated part of docs/benchmarks.md: machine, tables, chart."""
    m = results["machine"]
    return "\n".join(
        [
            START,
            f"Run of {results['date']}: {results['messages']:,} messages a run, median of "
            f"{results['repeats']} rounds, {results['seconds']} s in all. Machine: {m['cpu']}, "
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
            "\n\n".join(tables(results)),
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


def _forms(found: Mapping[str, Any]) -> str:
    """What a message takes in each form, where the run measured it."""
    if "bytes_per_compacted_key" not in found:
        return " (ledger and attempt log, indexes)"
    return (
        f" ({found['bytes_per_whole_row']:.0f} as a ledger row, "
        f"{found['bytes_per_compacted_key']:.0f} compacted; indexes included)"
    )


def big_ledger_summary(found: Mapping[str, Any]) -> list[str]:
    """bench.big_ledger's figures, a line each."""
    concurrency = found.get("concurrency", 8)
    loaded = statistics.median(found["loaded"])
    empty = statistics.median(found["empty"])
    lines = [
        f"{found['rows']:,} finished rows loaded in {found['load_seconds']:.0f} s, "
        f"{found['bytes_per_row']:.0f} bytes a message{_forms(found)}",
        f"C({concurrency}) loaded / empty: {loaded / empty:.2f} "
        f"(rounds {min(found['loaded']):,.0f}-{max(found['loaded']):,.0f} against "
        f"{min(found['empty']):,.0f}-{max(found['empty']):,.0f} msgs/s)",
    ]
    if found["while_pruning"]:
        during = statistics.median(found["while_pruning"])
        lines.append(
            f"C({concurrency}) while pruning / loaded: {during / loaded:.2f} "
            f"({len(found['while_pruning'])} runs, "
            f"{min(found['while_pruning']):,.0f}-{max(found['while_pruning']):,.0f} msgs/s)"
        )
    return lines
