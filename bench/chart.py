"""The throughput chart (needs matplotlib, from the ``bench`` extra)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from bench.report import LABELS


def throughput_chart(rates: Mapping[str, Mapping[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    # A, B and C solid; the peers dashed, in colours of their own (D's red is its squares).
    styles = {
        "A": {"marker": "o", "color": "tab:blue"},
        "B": {"marker": "o", "color": "tab:orange"},
        "C": {"marker": "o", "color": "tab:green"},
        "E": {"marker": "^", "color": "tab:purple", "linestyle": "--"},
        "F": {"marker": "v", "color": "tab:brown", "linestyle": "--"},
    }
    for variant, style in styles.items():
        settings = [s for s in ("1", "8", "32") if s in rates.get(variant, {})]
        if settings:
            values = [rates[variant][s] for s in settings]
            ax.plot([int(s) for s in settings], values, label=LABELS[variant], **style)
    # C in two processes (--processes 2), at the concurrency of both together.
    two = {s: r for s, r in rates.get("C", {}).items() if s.startswith("2x")}
    if two:
        totals = [2 * int(s.partition("x")[2]) for s in two]
        ax.scatter(totals, list(two.values()), marker="D", color="tab:green")
        ax.scatter([], [], marker="D", color="tab:green", label=f"{LABELS['C']}, 2 processes")
    for setting, threads in (("1x1", 1), ("1x8", 8)):
        ax.scatter([threads], [rates["D"][setting]], marker="s", color="tab:red")
    ax.scatter([], [], marker="s", color="tab:red", label=f"{LABELS['D']} (1x1, 1x8 threads)")
    ax.set_xscale("log", base=2)
    ax.set_xticks([1, 8, 32], ["1", "8", "32"])
    ax.set_xlabel("concurrency (consumers; dramatiq threads; Celery pool processes)")
    ax.set_ylabel("messages per second (median)")
    ax.set_title("Consumer throughput, no-op handler, one broker and one database")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
