"""The peers in the benchmark report: ratios against Celery and FastStream, their targets, the
CPU of a worker's process tree, and choosing variants. No broker, and neither peer imported."""

from __future__ import annotations

import argparse
import os
import sys

import pytest

from bench import costs, report, rounds, stats

RATES = {
    "A": {"1": 3000.0, "8": 6000.0, "32": 9000.0},
    "B": {"1": 500.0, "8": 2000.0, "32": 2000.0},
    "C": {"1": 600.0, "8": 2000.0, "32": 3000.0},
    "D": {"1x1": 2000.0, "1x8": 4000.0},
    "E": {"1": 1500.0, "8": 2500.0, "32": 2000.0},
    "F": {"1": 1200.0, "8": 2400.0, "32": 3200.0},
}

RUNS = {
    "C": {"8": [2000.0, 1800.0, 2200.0], "32": [3000.0, 2000.0, 2400.0]},
    "E": {"8": [2500.0, 2000.0, 2000.0], "32": [2000.0, 2500.0, 1000.0]},
    "F": {"8": [1000.0, 1000.0, 1100.0]},
}


def test_ratios_against_the_peers_at_the_same_concurrency_and_at_their_best() -> None:
    found = stats.ratios(RATES)
    assert found["C(8)/E(8)"] == pytest.approx(0.8)
    assert found["C(32)/F(32)"] == pytest.approx(3000 / 3200)
    assert found["best C/best E"] == pytest.approx(3000 / 2500)
    assert found["best C/best F"] == pytest.approx(3000 / 3200)
    assert found["C(1)/B(1)"] == pytest.approx(1.2)  # the anchors' ratios stay
    assert found["best C/D(1x8)"] == pytest.approx(0.75)


def test_ratios_leave_out_what_did_not_run() -> None:
    found = stats.ratios({"C": {"8": 2000.0}, "E": {"8": 1000.0}})
    assert found == {"C(8)/E(8)": 2.0, "best C/best E": 2.0}
    assert stats.ratios({"E": {"8": 1000.0}}) == {}


def test_paired_ratios_against_the_peers_come_from_each_round() -> None:
    found = stats.paired_ratios(RUNS)
    c8e8 = found["C(8)/E(8)"]
    assert c8e8["per_repeat"] == pytest.approx([0.8, 0.9, 1.1])
    assert (c8e8["min"], c8e8["median"], c8e8["max"]) == pytest.approx((0.8, 0.9, 1.1))
    assert "C(32)/F(32)" not in found  # F ran at 8 only
    assert "C(8)/A(8)" not in found


def test_best_against_best_takes_each_rounds_own_best() -> None:
    found = stats.paired_ratios(RUNS)
    # Round 1: best C 3000 (32), best E 2500 (8); round 2: 2000 / 2500; round 3: 2400 / 2000.
    assert found["best C/best E"]["per_repeat"] == pytest.approx([1.2, 0.8, 1.2])
    assert found["best C/best E"]["median"] == pytest.approx(1.2)
    assert found["best C/best F"]["per_repeat"] == pytest.approx([3.0, 2.0, 2400 / 1100])


def test_peer_targets_ask_for_at_least_the_peers_rate() -> None:
    found = {t.name: t for t in stats.peer_targets(stats.ratios(RATES))}
    assert set(found) == {"best C / Celery", "best C / FastStream"}
    assert found["best C / Celery"].met  # 1.2
    assert not found["best C / FastStream"].met  # 0.94
    assert found["best C / Celery"].limit == 1.0
    assert stats.peer_targets({"best C/best E": 1.0})[0].met
    assert stats.peer_targets({}) == []


def test_the_targets_table_has_the_peers_rows() -> None:
    latency = {
        v: {"count": 1, "p50_ms": 1.0, "p95_ms": 1.0, "p99_ms": p, "max_ms": p}
        for v, p in (("A", 1.0), ("B", 2.0), ("C", 3.0))
    }
    retry = stats.lateness_summary([0.01], parked=0)
    targets = stats.targets(stats.Measured(stats.ratios(RATES), latency, retry, None, 50.0))
    table = report.targets_table([t.as_dict() for t in targets])
    assert "| best C / Celery | 1.20 x | ≥ 1.00 x | yes |" in table
    assert "| best C / FastStream | 0.94 x | ≥ 1.00 x | **no** |" in table


def test_the_report_labels_the_peers_and_their_cpu() -> None:
    table = report.throughput_table(RATES)
    assert "| E Celery (prefork, acks late) | 1,500 | 2,500 | 2,000 |  |  |" in table
    assert "| F FastStream (manual ack) | 1,200 | 2,400 | 3,200 |  |  |" in table
    cpu = report.costs_table({"cpu_us": {"E": {"8": 470.0}, "F": {"32": 330.4}}})
    assert "| E Celery (prefork, acks late) (8) | 470 |  |  |  |  |" in cpu
    assert "| F FastStream (manual ack) (32) | 330 |  |  |  |  |" in cpu


def test_the_throughput_table_leaves_out_variants_and_settings_not_run() -> None:
    table = report.throughput_table({"C": {"8": 2000.0, "2x4": 2500.0}, "E": {"8": 1000.0}})
    assert "A raw aio-pika" not in table
    assert table.startswith("| variant | 8 | 2x4 |\n")
    assert "| C rabbitretry | 2,000 | 2,500 |" in table
    assert "| E Celery (prefork, acks late) | 1,000 |  |" in table


STAT = "4242 (celery: worker (x)) S 4200 4242 4200 0 -1 4194560 900 0 0 0 {u} {s} 7 3 20 0 1"


def test_stat_cpu_reads_the_parent_and_user_plus_system_ticks() -> None:
    # The name holds spaces and a parenthesis; the children's ticks (7, 3) are not counted.
    assert costs.stat_cpu(STAT.format(u=150, s=25)) == (4200, 175)


def test_tree_ticks_add_a_process_and_all_its_descendants() -> None:
    processes = {
        10: (1, 100),  # the worker
        11: (10, 20),  # its pool processes
        12: (10, 30),
        13: (12, 5),  # a grandchild
        20: (1, 1000),  # another process, not counted
    }
    assert costs.tree_ticks(processes, 10) == 155
    assert costs.tree_ticks(processes, 12) == 35
    assert costs.tree_ticks(processes, 99) == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_process_tree_cpu_of_this_process_grows() -> None:
    before = costs.process_tree_cpu(os.getpid())
    sum(i * i for i in range(300_000))
    assert costs.process_tree_cpu(os.getpid()) >= before >= 0


def test_choice_parses_a_comma_separated_selection() -> None:
    assert rounds.choice("C, E,F", rounds.VARIANTS) == ["C", "E", "F"]
    with pytest.raises(argparse.ArgumentTypeError):
        rounds.choice("C,G", rounds.VARIANTS)
    with pytest.raises(argparse.ArgumentTypeError):
        rounds.choice(",", rounds.VARIANTS)


def test_variants_keeps_the_chosen_ones_in_round_order() -> None:
    chosen = rounds.variants("postgresql://unused", ["C", "E", "F"], [8, 32])
    assert [(v, s) for v, s, _ in chosen] == [
        ("C", "8"),
        ("C", "2x4"),
        ("E", "8"),
        ("F", "8"),
        ("C", "32"),
        ("C", "2x16"),
        ("E", "32"),
        ("F", "32"),
    ]
    everything = rounds.variants("postgresql://unused")
    assert len(everything) == 3 * 5 + 2 + 2
    assert [s for v, s, _ in everything if v == "D"] == ["1x1", "1x8"]


def test_choosing_variants_imports_neither_peer() -> None:
    rounds.variants("postgresql://unused", ["E", "F"])
    assert "bench.celery_proc" not in sys.modules
    assert "bench.faststream_handler" not in sys.modules
