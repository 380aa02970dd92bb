"""What every drill test checks of its run, whatever its faults."""

from __future__ import annotations

from drills.drill import DrillResult


def assert_nothing_lost(result: DrillResult, seed: int) -> None:
    """Print the run, then: the verdict holds, every message succeeded or is dead, and the dead
    are exactly the poison messages and the crashers."""
    print(result.details())
    print("\n".join(result.verdict.figures()))
    print(result.summary())

    verdict = result.verdict
    assert verdict.ok, "\n".join(
        [
            f"seed {seed}; kept: {result.worker_log}, database {result.database}",
            *verdict.explain(),
            *verdict.figures(),
        ]
    )
    plan = result.plan
    assert verdict.succeeded == len(plan.messages) - verdict.dead
    assert verdict.dead == len(plan.of_kind("poison")) + len(plan.of_kind("crasher"))
