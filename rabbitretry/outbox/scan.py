"""Where a relay's scan of the pending rows starts (pure: no I/O)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

FULL_SCAN_EVERY = 60.0  # seconds between a relay's scans of every pending row (ScanFloor)
LATE_COMMIT = timedelta(seconds=60)  # a producer's transaction this long is still seen at once


@dataclass
class ScanFloor:
    """Where a relay's scan of the pending rows starts.

    Each row sent leaves its entry in the index of pending rows (``outbox_pending_idx``) until
    a vacuum, and a scan that starts at the oldest due time walks all of them first. An
    outbox keeps its sent rows for the retention window, so autovacuum comes after days of
    them: with 500,000 sent since the last vacuum a poll read 1,900 pages (2.8 ms), and the
    first poll after them 116 ms. So a poll starts ``late_commit`` before the oldest due time
    the last poll found, and walks only what was sent since. A row's due time is when its
    transaction began: a row committed more than ``late_commit`` after that, behind a poll
    that found newer rows, is below the floor, and so is a row that waited behind an older
    row of its ordering key that backed off; every ``full_scan_every`` seconds a poll scans
    them all, and finds those.
    """

    full_scan_every: float = FULL_SCAN_EVERY
    late_commit: timedelta = LATE_COMMIT
    floor: datetime | None = None
    """The due time this relay's polls start at; None until a poll found a row."""
    _next_full_scan: float = field(default=float("-inf"), init=False)

    def start(self, now: float) -> datetime | None:
        """Where this poll starts (None: at the oldest row); ``now``, a monotonic clock."""
        if now >= self._next_full_scan:
            self._next_full_scan = now + self.full_scan_every
            return None
        return self.floor

    def found(self, due_times: Sequence[datetime]) -> None:
        """The due times of the rows a poll took: the next poll starts from the oldest."""
        if due_times:
            try:
                self.floor = min(due_times) - self.late_commit
            except (TypeError, OverflowError):
                # A row written by hand as due at -infinity (read as a naive datetime.min) or
                # in year 1: no floor, every row is scanned, as before the floor existed.
                self.floor = None
