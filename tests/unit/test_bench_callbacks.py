"""The callback benchmark's arithmetic: rates, response times and the duplicate mix."""

from __future__ import annotations

import json

import pytest

from bench.callbacks import Answer, bodies, figures


def test_figures_count_only_stored_callbacks_in_the_rate() -> None:
    answers = [Answer(200, "stored", 0.010)] * 6 + [
        Answer(200, "duplicate", 0.020),
        Answer(503, "the database is unreachable", 0.030),
    ]
    result = figures(answers, wall_seconds=2.0)
    assert result["stored"] == 6
    assert result["duplicates"] == 1
    assert result["errors"] == 1
    assert result["stored_per_second"] == 3.0
    assert result["requests_per_second"] == 4.0
    assert result["p50_ms"] == pytest.approx(10.0)
    assert result["max_ms"] == pytest.approx(30.0)
    # p99 of 8 samples interpolates between the two largest: 20 + 0.93 * 10 ms.
    assert result["p99_ms"] == pytest.approx(29.3)


def test_figures_need_a_positive_duration() -> None:
    with pytest.raises(ValueError):
        figures([Answer(200, "stored", 0.1)], wall_seconds=0)


def test_bodies_send_the_chosen_fraction_again() -> None:
    sent = bodies(100, duplicates=0.1)
    assert len(sent) == 110
    assert len(set(sent)) == 100
    ids = [json.loads(body)["transaction_id"] for body in sent]
    assert ids[9:12] == ["t9", "t4", "t10"]  # the tenth callback, then a retry of the fifth
    assert bodies(5, duplicates=0) == bodies(5, duplicates=0.0) and len(bodies(5, 0)) == 5
    with pytest.raises(ValueError):
        bodies(5, duplicates=1.5)
