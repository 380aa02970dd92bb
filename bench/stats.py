"""Pure statistics and the targets: no I/O, so the report's arithmetic is unit-tested."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any


def percentile(values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` (0..1) percentile, linearly interpolated between closest ranks."""
    if not values:
        raise ValueError("no values")
    if not 0 <= fraction <= 1:
        raise ValueError("fraction must be within 0..1")
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summary(values: Sequence[float]) -> dict[str, float]:
    """Count, p50, p95, p99 and max of a sample."""
    return {
        "count": len(values),
        "p50": percentile(values, 0.50),
        "p95": percentile(values, 0.95),
        "p99": percentile(values, 0.99),
        "max": max(values),
    }


def medians(runs: Mapping[str, Mapping[str, Sequence[float]]]) -> dict[str, dict[str, float]]:
    """variant -> setting -> median of its repeated runs."""
    return {
        variant: {setting: statistics.median(rates) for setting, rates in settings.items()}
        for variant, settings in runs.items()
    }


def best(rates: Mapping[str, float]) -> float:
    return max(rates.values())


def ratios(rates: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """C against A and B at each concurrency, and C against dramatiq."""
    a, b, c, d = rates["A"], rates["B"], rates["C"], rates["D"]
    found = {}
    for setting, rate in c.items():
        if setting in a:
            found[f"C({setting})/A({setting})"] = rate / a[setting]
        if setting in b:
            found[f"C({setting})/B({setting})"] = rate / b[setting]
    for setting, rate in d.items():
        found[f"best C/D({setting})"] = best(c) / rate
    return found


@dataclass(frozen=True)
class Target:
    name: str
    value: float
    limit: float
    unit: str
    higher_is_better: bool

    @property
    def met(self) -> bool:
        return self.value >= self.limit if self.higher_is_better else self.value <= self.limit

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "met": self.met}


def retry_allowance(scheduled: Sequence[float]) -> float:
    """The retry-delay error allowed: the larger of 1 s and 5 % of the longest delay."""
    return max(1.0, 0.05 * max(scheduled, default=0.0))


def targets(
    rates: Mapping[str, Mapping[str, float]],
    latency_p99_ms: float,
    retry_error_p99_s: float,
    retry_allowance_s: float,
    scan_1m_ms: float | None,
    rss_mb: float,
) -> list[Target]:
    a, b, c, d = rates["A"], rates["B"], rates["C"], rates["D"]
    found = [
        Target("C(1) / B(1)", c["1"] / b["1"], 1.0, "x", True),
        Target("C(32) / A(32)", c["32"] / a["32"], 0.5, "x", True),
        Target("best C / D(1x8)", best(c) / d["1x8"], 0.5, "x", True),
        Target("p99 latency at half load", latency_p99_ms, 25.0, "ms", False),
        Target("retry-delay error p99", retry_error_p99_s, retry_allowance_s, "s", False),
    ]
    if scan_1m_ms is not None:
        found.append(Target("due-scan at 1M rows", scan_1m_ms, 50.0, "ms", False))
    found.append(Target("worker peak RSS", rss_mb, 100.0, "MB", False))
    return found
