"""The benchmark report's arithmetic: percentiles, medians, ratios and targets."""

from __future__ import annotations

import os
from typing import Any

import pytest

from bench import costs, report, stats
from bench.sustained import running_at, since_checkpoint

RATES = {
    "A": {"1": 3000.0, "8": 6000.0, "32": 9000.0},
    "B": {"1": 500.0, "8": 2000.0, "32": 2000.0},
    "C": {"1": 600.0, "8": 4000.0, "32": 5000.0},
    "D": {"1x1": 2000.0, "1x8": 8000.0},
}


def test_percentile_interpolates_between_ranks() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert stats.percentile(values, 0.5) == pytest.approx(50.5)
    assert stats.percentile(values, 0.99) == pytest.approx(99.01)
    assert stats.percentile(values, 0.0) == 1.0
    assert stats.percentile(values, 1.0) == 100.0
    assert stats.percentile([7.0], 0.99) == 7.0


def test_percentile_ignores_input_order_and_refuses_nonsense() -> None:
    assert stats.percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    with pytest.raises(ValueError):
        stats.percentile([], 0.5)
    with pytest.raises(ValueError):
        stats.percentile([1.0], 1.5)


def test_summary_reports_the_tail() -> None:
    values = [1.0] * 98 + [50.0, 100.0]
    found = stats.summary(values)
    assert found["count"] == 100
    assert found["p50"] == 1.0
    assert found["max"] == 100.0
    assert 50.0 <= found["p99"] <= 100.0


def test_medians_of_repeated_runs() -> None:
    runs = {"A": {"1": [10.0, 30.0, 20.0]}, "C": {"8": [5.0, 7.0]}}
    assert stats.medians(runs) == {"A": {"1": 20.0}, "C": {"8": 6.0}}


def test_ratios_compare_c_at_the_same_concurrency() -> None:
    found = stats.ratios(RATES)
    assert found["C(1)/B(1)"] == pytest.approx(1.2)
    assert found["C(32)/A(32)"] == pytest.approx(5000 / 9000)
    assert found["best C/D(1x8)"] == pytest.approx(5000 / 8000)


RUNS = {
    "A": {"1": [3000.0, 2800.0, 3100.0], "32": [9000.0, 8000.0, 9500.0]},
    "B": {"1": [500.0, 400.0, 600.0], "32": [2000.0, 2000.0, 2000.0]},
    "C": {"1": [600.0, 500.0, 540.0], "32": [5000.0, 3600.0, 4750.0]},
}


def test_paired_ratios_come_from_each_round_with_their_spread() -> None:
    found = stats.paired_ratios(RUNS)
    c1b1 = found["C(1)/B(1)"]
    assert c1b1["per_repeat"] == pytest.approx([1.2, 1.25, 0.9])
    assert (c1b1["min"], c1b1["median"], c1b1["max"]) == pytest.approx((0.9, 1.2, 1.25))
    assert found["C(32)/A(32)"]["median"] == pytest.approx(0.5)
    assert "C(8)/A(8)" not in found  # not measured


def summary_ms(p99: float) -> dict[str, float]:
    return {"count": 100, "p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": p99, "max_ms": p99 + 1}


RETRY = stats.lateness_summary([0.02, 0.03, 0.05, 0.04], parked=0)
MEASURED = stats.Measured(
    ratios=stats.ratios(RATES),
    latency={"A": summary_ms(5.0), "B": summary_ms(10.0), "C": summary_ms(30.0)},
    retry=RETRY,
    scan_1m_ms=3.0,
    rss_mb=60.0,
)


def test_targets_met_and_missed() -> None:
    found = {t.name: t for t in stats.targets(MEASURED)}
    assert found["C(1) / B(1)"].met
    assert found["C(32) / A(32)"].met
    assert found["best C / D(1x8)"].met
    assert not found["C p99 latency at half of C's peak"].met
    assert not found["C p99 / B p99 at the same rate"].met  # 3.0 against 1.5
    assert found["retry lateness p99"].met
    assert found["retry copies early at a worker"].met
    assert found["due-scan at 1M rows"].met
    assert found["worker peak RSS"].met
    assert found["C p99 latency at half of C's peak"].as_dict()["met"] is False


def test_lateness_counts_early_copies_and_early_starts() -> None:
    found = stats.lateness_summary([-0.01, 0.02, 0.5], parked=3)
    assert found["early_count"] == 3
    assert found["started_early"] == 1
    assert found["lateness_max_s"] == 0.5
    assert found["lateness_min_s"] == -0.01
    early = {
        t.name: t for t in stats.targets(stats.Measured(**{**MEASURED.__dict__, "retry": found}))
    }
    assert not early["retry copies early at a worker"].met
    assert not early["retries started early"].met


def test_latency_summary_names_milliseconds() -> None:
    found = stats.latency_summary([1.0, 2.0, 3.0])
    assert set(found) == {"count", "p50_ms", "p95_ms", "p99_ms", "max_ms"}


def results() -> dict[str, Any]:
    latency = {v: summary_ms(p) for v, p in (("A", 5.0), ("B", 10.0), ("C", 30.0))}
    return {
        "date": "2026-01-01T00:00:00+00:00",
        "messages": 3000,
        "repeats": 3,
        "seconds": 100,
        "machine": {
            "cpu": "cpu",
            "cores": 2,
            "system": "linux",
            "python": "3.11",
            "rabbitmq": "3.10.8",
            "postgres": "15",
        },
        "due_scan_statement": "reconcile_overdue_retries",
        "throughput": RATES,
        "costs": COSTS,
        "ratios": stats.ratios(RATES),
        "ratio_spread": stats.paired_ratios(RUNS),
        "latency": {
            "quarter": {"rate": 50.0, **latency},
            "half": {"rate": 100.0, **latency},
            **latency,
        },
        "processes": {"1": {"msgs_per_s": 900.0, "commits_per_s": 400.0}},
        "retry_delay": {**RETRY, "min_delay_s": 0.1, "max_delay_s": 60.0},
        "due_scan_ms": {"10000": 0.5, "1000000": 3.0},
        "callbacks": {
            "stored_per_second": 250.0,
            "p50_ms": 30.0,
            "p95_ms": 180.0,
            "p99_ms": 300.0,
            "max_ms": 600.0,
            "errors": 0,
            "statement_alone_per_second": 2263.0,
        },
        "console_pages": [
            {"page": "overview", "path": "/", "median_ms": 100.0, "slowest_ms": 121.0}
        ],
        "console_rows": 100_000,
        "rss_mb": 60.0,
        "targets": [t.as_dict() for t in stats.targets(MEASURED)],
    }


COSTS = {
    "cpu_us": {"A": {"32": 100.0}, "C": {"32": 350.4}, "D": {"1x8": 80.0}},
    "wal_bytes": {"C": {"32": 1460.2}},
    "commits": {"C": {"32": 0.125}},
    "rows": {"C": {"32": 4.0}},
    "table_bytes": {"C": {"32": 852.0}},
}


def test_costs_per_message_leave_out_the_benchmarks_own_reads() -> None:
    before = costs.DatabaseSnapshot(wal=1000, commits=10, rows=5, bytes=8192)
    after = costs.DatabaseSnapshot(wal=15600, commits=31, rows=45, bytes=16384)
    assert costs.per_message(before, after, 10, own_reads=11) == {
        "wal_bytes": 1460.0,
        "commits": 1.0,
        "rows": 4.0,
        "table_bytes": 819.2,
    }
    assert costs.cpu_per_message(0.0035, 10) == pytest.approx(350.0)
    with pytest.raises(ValueError):
        costs.per_message(before, after, 0)


def test_the_database_servers_cpu_counts_when_both_readings_have_it() -> None:
    before = costs.DatabaseSnapshot(wal=0, commits=0, rows=0, bytes=0, server_cpu=12.0)
    after = costs.DatabaseSnapshot(wal=0, commits=1, rows=0, bytes=0, server_cpu=12.003)
    assert costs.per_message(before, after, 10)["db_cpu_us"] == pytest.approx(300.0)
    remote = costs.DatabaseSnapshot(wal=0, commits=1, rows=0, bytes=0)
    assert "db_cpu_us" not in costs.per_message(before, remote, 10)


def test_stat_reads_a_process_own_ticks_or_its_ended_childrens() -> None:
    # pid (comm) state ppid ... utime stime cutime cstime (14th to 17th fields)
    line = "42 (post (gres)) S 7 " + " ".join(["0"] * 9) + " 30 12 500 70 20 0"
    assert costs.stat_cpu(line) == (7, 42)
    assert costs.stat_cpu(line, children=True) == (7, 570)


def test_a_server_not_on_this_machine_has_no_cpu_reading() -> None:
    assert costs.server_cpu(os.getpid()) is None  # this process is not a PostgreSQL one
    assert costs.server_cpu(2**22 + 1) is None  # no such process


def test_the_costs_table_shows_each_run_with_what_it_measured() -> None:
    table = report.costs_table(COSTS)
    assert "| A raw aio-pika (32) | 100 |  |  |  |  |  |" in table
    assert "| C rabbitretry (32) | 350 | 1,460 | 0.12 | 4.00 | 852 |  |" in table
    assert "| D dramatiq (1x8) | 80 |  |  |  |  |  |" in table


def test_report_tables_show_every_variant_spreads_and_missed_targets() -> None:
    table = report.throughput_table(RATES)
    assert "| C rabbitretry | 600 | 4,000 | 5,000 |  |  |" in table
    assert "8,000" in table
    text = report.console(results())
    assert "| C(1)/B(1) | 1.20 | 0.90 to 1.25 |" in text
    assert "| C p99 latency at half of C's peak | 30.00 ms | ≤ 15.00 ms | **no** |" in text
    assert "| retry copies early at a worker | 0 | ≤ 0 | yes |" in text
    assert "| C rabbitretry | 100 msgs/s | 1.0 | 2.0 | 30.0 | 31.0 |" in text
    assert "| 4 (0.1 s to 60 s) | 35 ms |" in text
    assert "| 1 | 900 | 400 |" in text
    assert "| 250 | 30.0 ms | 180.0 ms | 300.0 ms | 600.0 ms | 0 | 2,263 |" in text
    assert "| `/` | 100 ms | 121 ms |" in text


def test_the_generated_section_of_the_document_is_replaced_and_the_rest_kept() -> None:
    document = f"# Benchmarks\n\nintro\n\n{report.START}\nold figures\n{report.END}\n\nwhy\n"
    updated = report.with_results(document, results())
    assert updated.startswith("# Benchmarks\n\nintro\n\n")
    assert updated.endswith("\n\nwhy\n")
    assert "old figures" not in updated
    assert "| C rabbitretry | 600 | 4,000 | 5,000 |  |  |" in updated
    assert "| 1,000,000 | 3.00 |" in updated
    appended = report.with_results("# Benchmarks\n", results())
    assert appended.count(report.START) == 1 and appended.startswith("# Benchmarks\n\n")


BIG = {
    "rows": 10_000_000,
    "load_seconds": 150.0,
    "bytes_per_row": 498.0,
    "concurrency": 8,
    "empty": [1000.0, 1100.0, 900.0],
    "loaded": [1000.0, 950.0, 1050.0],
    "while_pruning": [800.0, 900.0],
}


def test_a_big_ledger_is_judged_by_its_medians() -> None:
    found = {t.name: t.value for t in stats.big_ledger_targets(BIG)}
    assert found == {"C at 10M rows / C empty": 1.0, "C while pruning / C loaded": 0.85}
    assert stats.big_ledger_targets(None) == []
    assert stats.big_ledger_targets({**BIG, "while_pruning": []})[-1].name.startswith("C at")


def test_a_big_ledger_reads_as_three_lines() -> None:
    lines = report.big_ledger_summary(BIG)
    assert lines[0].startswith("10,000,000 finished rows loaded in 150 s, 498 bytes")
    assert "loaded / empty: 1.00 (rounds 950-1,050 against 900-1,100 msgs/s)" in lines[1]
    assert "while pruning / loaded: 0.85 (2 runs, 800-900 msgs/s)" in lines[2]


def test_a_big_ledger_says_what_each_form_of_a_message_takes() -> None:
    found = {**BIG, "bytes_per_whole_row": 276.0, "bytes_per_compacted_key": 101.4}
    assert (
        "498 bytes a message (276 as a ledger row, 101 compacted; indexes included)"
        in (report.big_ledger_summary(found)[0])
    )


def test_a_slow_second_is_set_beside_what_ran_then() -> None:
    vacuums = [(100.0, 4.0)]  # ran from 100 s to 104 s
    assert running_at(101.0, vacuums)
    assert running_at(104.5, vacuums)  # a stall shows when the messages it held finish
    assert running_at(98.5, vacuums)  # the second 98.5-99.5 ends within the margin
    assert not running_at(106.0, vacuums)
    assert not running_at(97.0, vacuums)
    assert not running_at(101.0, [])


def test_a_slow_second_is_timed_from_the_checkpoint_before_it() -> None:
    began = [100.0, 400.0]
    assert since_checkpoint(130.0, began) == 30.0
    assert since_checkpoint(401.0, began) == 1.0
    assert since_checkpoint(99.0, began) is None  # before any checkpoint the run saw
