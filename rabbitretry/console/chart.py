"""A small chart drawn on the server as SVG: no script, nothing for the page to load.

Two lines per chart, messages handled and messages that died, one point a minute. The
colours are SVG attributes, not styles, so the Content-Security-Policy need not allow any.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup

WIDTH, HEIGHT, PAD = 360, 64, 2


@dataclass(frozen=True)
class Minute:
    handled: int = 0
    died: int = 0


def svg(minutes: Sequence[Minute], label: str) -> Markup:
    """A chart of ``minutes`` (oldest first); its title says the totals for screen readers."""
    top = max([1, *(m.handled for m in minutes), *(m.died for m in minutes)])
    handled = sum(m.handled for m in minutes)
    died = sum(m.died for m in minutes)
    title = f"{label}: {handled:,} handled, {died:,} died in the last {len(minutes)} minutes"
    return Markup(
        '<svg class="chart" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img"'
        ' aria-label="{title}"><title>{title}</title>'
        '<line x1="0" y1="{base}" x2="{w}" y2="{base}" stroke="#e5e7eb"/>'
        '<polyline fill="none" stroke="#16a34a" stroke-width="1.5" points="{ok}"/>'
        '<polyline fill="none" stroke="#dc2626" stroke-width="1.5" points="{bad}"/>'
        '<text x="{w}" y="10" text-anchor="end" font-size="9" fill="#6b7280">{top}/min</text>'
        '<text x="0" y="{h}" font-size="9" fill="#6b7280">-{hours}</text>'
        '<text x="{w}" y="{h}" text-anchor="end" font-size="9" fill="#6b7280">now</text>'
        "</svg>"
    ).format(
        w=WIDTH,
        h=HEIGHT,
        base=HEIGHT - PAD,
        title=title,
        ok=_points([m.handled for m in minutes], top),
        bad=_points([m.died for m in minutes], top),
        top=f"{top:,}",
        hours=f"{len(minutes) / 60:g} h" if len(minutes) >= 60 else f"{len(minutes)} min",
    )


def _points(values: Sequence[int], top: int) -> str:
    step = (WIDTH - 2 * PAD) / max(1, len(values) - 1)
    scale = (HEIGHT - 2 * PAD) / top
    return " ".join(
        f"{PAD + i * step:.1f},{HEIGHT - PAD - v * scale:.1f}" for i, v in enumerate(values)
    )
