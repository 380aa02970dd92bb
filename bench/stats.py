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


PEERS = {"E": "Celery", "F": "FastStream"}


def ratios(rates: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """C against A, B and the peers E and F at each concurrency, best C against dramatiq and
    against each peer's best, from the medians; a variant that did not run is left out."""
    c = rates.get("C", {})
    if not c:
        return {}
    found = {}
    for setting, rate in c.items():
        for other in ("A", "B", *PEERS):
            if setting in rates.get(other, {}):
                found[f"C({setting})/{other}({setting})"] = rate / rates[other][setting]
    for setting, rate in rates.get("D", {}).items():
        found[f"best C/D({setting})"] = best(c) / rate
    for peer in PEERS:
        if rates.get(peer):
            found[f"best C/best {peer}"] = best(c) / best(rates[peer])
    return found


def _spread(per_repeat: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(per_repeat),
        "min": min(per_repeat),
        "max": max(per_repeat),
        "per_repeat": per_repeat,
    }


def paired_ratios(
    runs: Mapping[str, Mapping[str, Sequence[float]]],
) -> dict[str, dict[str, Any]]:
    """C against A, B, E and F per repeat: each ratio from the runs of one round, back to back.

    A noisy minute slows both runs of a round, so the ratio of a round varies less than
    either rate; its spread over the rounds (min to max) tells a change from noise. The value
    reported is the median of the rounds' ratios. ``best C/best E`` (and F) compares, in each
    round, C's best rate of the round with the peer's best of the same round.
    """
    found: dict[str, dict[str, Any]] = {}
    c_runs_by_setting = runs.get("C", {})
    for other in ("A", "B", *PEERS):
        for setting, c_runs in c_runs_by_setting.items():
            other_runs = runs.get(other, {}).get(setting)
            if not other_runs:
                continue
            per_repeat = [c / o for c, o in zip(c_runs, other_runs, strict=True)]
            found[f"C({setting})/{other}({setting})"] = _spread(per_repeat)
    for peer in PEERS:
        peer_runs = runs.get(peer, {})
        if c_runs_by_setting and peer_runs:
            found[f"best C/best {peer}"] = _spread(
                [
                    max(c_round) / max(peer_round)
                    for c_round, peer_round in zip(
                        zip(*c_runs_by_setting.values(), strict=True),
                        zip(*peer_runs.values(), strict=True),
                        strict=True,
                    )
                ]
            )
    return found


def latency_summary(values: Sequence[float]) -> dict[str, float]:
    """Count, p50, p95, p99 and max of latencies in milliseconds (keys end in ``_ms``)."""
    return {
        "count": len(values),
        **{f"{name}_ms": value for name, value in summary(values).items() if name != "count"},
    }


def lateness_summary(lateness: Sequence[float], parked: int) -> dict[str, float]:
    """Retry timing: lateness percentiles in seconds, and the copies that came early.

    ``early_count`` counts the copies that reached a worker before they were due (each
    parked again by the ledger); ``started_early`` the retries whose attempt began before
    their due time, which the ledger's check makes impossible.
    """
    return {
        "count": len(lateness),
        **{f"lateness_{k}_s": v for k, v in summary(lateness).items() if k != "count"},
        "lateness_min_s": min(lateness),
        "early_count": parked,
        "started_early": sum(1 for value in lateness if value < 0),
    }


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


@dataclass(frozen=True)
class Measured:
    """What the targets are checked against."""

    ratios: Mapping[str, float]
    latency: Mapping[str, Any]  # variant -> latency_summary, at half of C's peak
    retry: Mapping[str, float]  # lateness_summary
    scan_1m_ms: float | None
    rss_mb: float
    big_ledger: Mapping[str, Any] | None = None  # bench.big_ledger.run's result


def targets(measured: Measured) -> list[Target]:
    r, latency, retry = measured.ratios, measured.latency, measured.retry
    c_p99, b_p99 = latency["C"]["p99_ms"], latency["B"]["p99_ms"]
    found = [
        Target("C(1) / B(1)", r["C(1)/B(1)"], 1.0, "x", True),
        Target("C(32) / A(32)", r["C(32)/A(32)"], 0.5, "x", True),
        Target("best C / D(1x8)", r["best C/D(1x8)"], 0.5, "x", True),
        Target("C p99 latency at half of C's peak", c_p99, 15.0, "ms", False),
        Target("C p99 / B p99 at the same rate", c_p99 / b_p99, 1.5, "x", False),
        Target("retry lateness p99", retry["lateness_p99_s"], 0.10, "s", False),
        Target("retry copies early at a worker", retry["early_count"], 0, "", False),
        Target("retries started early", retry["started_early"], 0, "", False),
    ]
    found += peer_targets(r)
    if measured.scan_1m_ms is not None:
        found.append(Target("due-scan at 1M rows", measured.scan_1m_ms, 50.0, "ms", False))
    found.append(Target("worker peak RSS", measured.rss_mb, 100.0, "MB", False))
    found += big_ledger_targets(measured.big_ledger)
    return found


def big_ledger_targets(big: Mapping[str, Any] | None) -> list[Target]:
    """C on a bulk-loaded ledger against an empty one, and while a prune runs on it."""
    if not big:
        return []
    loaded = statistics.median(big["loaded"])
    rows = f"{big['rows'] / 1e6:g}M"
    found = [
        Target(
            f"C at {rows} rows / C empty", loaded / statistics.median(big["empty"]), 0.95, "x", True
        )
    ]
    if big["while_pruning"]:
        during = statistics.median(big["while_pruning"]) / loaded
        found.append(Target("C while pruning / C loaded", during, 0.90, "x", True))
    return found


def peer_targets(ratios: Mapping[str, float]) -> list[Target]:
    """rabbitretry at its best at least as fast as each peer at its best (those that ran)."""
    return [
        Target(f"best C / {name}", ratios[f"best C/best {peer}"], 1.0, "x", True)
        for peer, name in PEERS.items()
        if f"best C/best {peer}" in ratios
    ]
