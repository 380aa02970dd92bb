"""The drill's plan: seeded, exact shares, every fault inside the publishing window."""

from __future__ import annotations

from collections import Counter

from drills.plan import CRASH_BURST_SECONDS, FAULTS, make_plan


def test_same_seed_same_plan_and_another_seed_another() -> None:
    first = make_plan(7, 1000, publish_seconds=30)
    assert make_plan(7, 1000, publish_seconds=30) == first
    assert make_plan(8, 1000, publish_seconds=30).messages != first.messages


def test_shares_of_each_kind_are_exact() -> None:
    plan = make_plan(1, 5000, publish_seconds=90)
    kinds = Counter(m.kind for m in plan.messages)
    assert {k: kinds[k] for k in ("transient", "poison", "crasher")} == {
        "transient": 1000,
        "poison": 50,
        "crasher": 25,
    }
    # 5% slow, plus the ok messages published just before the database crash.
    assert kinds["slow"] > 250 and kinds["ok"] + kinds["slow"] == 3925
    assert len({m.message_id for m in plan.messages}) == 5000
    assert all(1 <= m.fail_times <= 2 for m in plan.of_kind("transient"))
    assert all(1.0 <= m.sleep <= 4.0 for m in plan.of_kind("slow"))


def test_the_messages_published_just_before_a_database_crash_are_slow() -> None:
    plan = make_plan(2, 1000, publish_seconds=30)
    (crash,) = [f.at for f in plan.faults if f.fault == "crash-database"]
    interval = 30 / 1000
    burst = plan.messages[int((crash - CRASH_BURST_SECONDS) / interval) + 1 : int(crash / interval)]
    assert len(burst) >= 15
    assert all(m.kind != "ok" for m in burst)
    assert all(m.sleep >= 3.0 for m in burst if m.kind == "slow")
    assert plan.without("crash-database").messages == plan.messages
    assert "crash-database" not in {f.fault for f in plan.without("crash-database").faults}


def test_dead_expected_exactly_for_poison_and_crashers() -> None:
    plan = make_plan(3, 1000, publish_seconds=30)
    dead = {m.message_id for m in plan.messages if m.expected_status == "dead"}
    assert dead == {m.message_id for m in plan.messages if m.kind in ("poison", "crasher")}


def test_every_fault_once_in_order_of_time_within_the_window() -> None:
    plan = make_plan(5, 1000, publish_seconds=40)
    assert sorted(f.fault for f in plan.faults) == sorted(FAULTS)
    times = [f.at for f in plan.faults]
    assert times == sorted(times)
    assert all(0.1 * 40 <= at <= 0.85 * 40 for at in times)
