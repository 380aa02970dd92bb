"""Where the outbox relay's polls start: from the oldest due time the last poll found (less
the allowance for late commits), and every so often from the oldest row of all."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rabbitretry.outbox import ScanFloor

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SECOND = timedelta(seconds=1)


def test_the_first_poll_scans_every_pending_row() -> None:
    assert ScanFloor().start(now=0.0) is None


def test_a_poll_starts_before_the_oldest_row_the_last_one_found() -> None:
    scan = ScanFloor(full_scan_every=60.0, late_commit=30 * SECOND)
    scan.start(now=0.0)
    scan.found([T0 + 5 * SECOND, T0, T0 + 9 * SECOND])
    assert scan.start(now=1.0) == T0 - 30 * SECOND
    scan.found([T0 + 100 * SECOND])
    assert scan.start(now=2.0) == T0 + 70 * SECOND


def test_a_poll_that_found_nothing_leaves_the_floor_where_it_was() -> None:
    scan = ScanFloor(full_scan_every=60.0, late_commit=30 * SECOND)
    scan.start(now=0.0)
    scan.found([T0])
    scan.start(now=1.0)
    scan.found([])
    assert scan.start(now=2.0) == T0 - 30 * SECOND


def test_a_full_scan_comes_every_so_often_and_can_lower_the_floor() -> None:
    scan = ScanFloor(full_scan_every=60.0, late_commit=30 * SECOND)
    assert scan.start(now=0.0) is None
    scan.found([T0])
    assert scan.start(now=59.9) == T0 - 30 * SECOND
    assert scan.start(now=60.0) is None  # finds a row committed late, below the floor
    scan.found([T0 - 3600 * SECOND])
    assert scan.start(now=60.1) == T0 - 3630 * SECOND
    assert scan.start(now=120.0) is None


def test_an_idle_relay_without_a_floor_scans_every_row() -> None:
    scan = ScanFloor(full_scan_every=60.0)
    scan.start(now=0.0)
    scan.found([])
    assert scan.start(now=1.0) is None


def test_a_row_due_at_minus_infinity_leaves_no_floor_rather_than_failing_the_poll() -> None:
    # asyncpg reads -infinity as a naive datetime.min; year 1 cannot go a minute back.
    for due in (datetime.min, datetime.min.replace(tzinfo=UTC)):
        scan = ScanFloor(full_scan_every=60.0)
        scan.start(now=0.0)
        scan.found([T0])
        scan.found([due, T0])
        assert scan.start(now=1.0) is None
