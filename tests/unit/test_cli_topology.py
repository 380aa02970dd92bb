"""How ``topology plan`` and ``declare`` show a plan: the shared delay chain in one row."""

from __future__ import annotations

from rabbitretry.cli.topology import plan_rows
from rabbitretry.topology import PlanEntry


def test_the_delay_chain_is_one_row_per_action_and_a_mismatch_stands_alone() -> None:
    entries = [
        PlanEntry("exchange", "orders", "create", "type='topic'"),
        PlanEntry("queue", "points.award", "ok"),
        *[PlanEntry("exchange", f"rabbitretry.delay.classic.{n:02d}", "ok") for n in range(3)],
        PlanEntry("queue", "rabbitretry.delay.classic.00", "create"),
        PlanEntry("queue", "rabbitretry.delay.classic.01", "mismatch", "inequivalent arg"),
        PlanEntry(
            "binding", "rabbitretry.delay.deliver -> points.award (routing key '')", "ensure"
        ),
    ]
    assert plan_rows(entries) == [
        ("exchange", "orders", "create", "type='topic'"),
        ("queue", "points.award", "ok", ""),
        ("queue", "rabbitretry.delay.classic.01", "mismatch", "inequivalent arg"),
        ("chain", "rabbitretry.delay.* (delay chain)", "ok", "3 exchanges"),
        ("chain", "rabbitretry.delay.* (delay chain)", "create", "1 queue"),
        ("chain", "rabbitretry.delay.* (delay chain)", "ensure", "1 binding"),
    ]


def test_a_plan_without_the_chain_is_shown_as_it_is() -> None:
    entries = [PlanEntry("queue", "q", "create", "x-queue-type='quorum'")]
    assert plan_rows(entries) == [("queue", "q", "create", "x-queue-type='quorum'")]
