"""The benchmark report's arithmetic: percentiles, medians, ratios and targets."""

from __future__ import annotations

import pytest

from bench import report, stats

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


def test_targets_met_and_missed() -> None:
    found = {
        t.name: t
        for t in stats.targets(
            RATES,
            latency_p99_ms=30.0,
            retry_error_p99_s=0.8,
            retry_allowance_s=1.0,
            scan_1m_ms=3.0,
            rss_mb=60.0,
        )
    }
    assert found["C(1) / B(1)"].met
    assert found["C(32) / A(32)"].met
    assert found["best C / D(1x8)"].met
    assert not found["p99 latency at half load"].met
    assert found["retry-delay error p99"].met
    assert found["due-scan at 1M rows"].met
    assert found["worker peak RSS"].met
    assert found["p99 latency at half load"].as_dict()["met"] is False


def test_retry_allowance_is_one_second_or_five_percent() -> None:
    assert stats.retry_allowance([1.0, 8.0]) == 1.0
    assert stats.retry_allowance([40.0]) == 2.0


def test_report_tables_show_every_variant_and_missed_targets() -> None:
    table = report.throughput_table(RATES)
    assert "| C rabbitretry | 600 | 4,000 | 5,000 |  |  |" in table
    assert "8,000" in table
    targets = [t.as_dict() for t in stats.targets(RATES, 30.0, 0.8, 1.0, None, 60.0)]
    text = report.targets_table(targets)
    assert "| p99 latency at half load | 30.00 ms | ≤ 25.00 ms | **no** |" in text
    assert "due-scan" not in text


def test_the_generated_section_of_the_document_is_replaced_and_the_rest_kept() -> None:
    targets = [t.as_dict() for t in stats.targets(RATES, 30.0, 0.8, 1.0, 3.0, 60.0)]
    results = {
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
        "ratios": stats.ratios(RATES),
        "latency": {"rate": 100.0, "p50": 1.0, "p95": 2.0, "p99": 30.0, "max": 40.0},
        "retry_delay": {"count": 10, "p50": 0.1, "p95": 0.5, "p99": 0.8, "max": 0.9},
        "due_scan_ms": {"10000": 0.5, "1000000": 3.0},
        "rss_mb": 60.0,
        "targets": targets,
    }
    document = f"# Benchmarks\n\nintro\n\n{report.START}\nold figures\n{report.END}\n\nwhy\n"
    updated = report.with_results(document, results)
    assert updated.startswith("# Benchmarks\n\nintro\n\n")
    assert updated.endswith("\n\nwhy\n")
    assert "old figures" not in updated
    assert "| C rabbitretry | 600 | 4,000 | 5,000 |  |  |" in updated
    assert "| 1,000,000 | 3.00 |" in updated
    appended = report.with_results("# Benchmarks\n", results)
    assert appended.count(report.START) == 1 and appended.startswith("# Benchmarks\n\n")
