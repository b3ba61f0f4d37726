"""Charts drawn on the server as inline SVG: a page shows its figures without any JavaScript or
chart library, and every label goes through the same escaping as the rest of the page.

Both charts take plain numbers and labels; the caller picks the buckets (a policy's violations per
interval, a metric's rate per sample). The SVG scales with its container (``viewBox``), carries a
``<title>`` per bar or point for a tooltip, and a ``role="img"`` with an ``aria-label`` summary for
screen readers.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from markupsafe import Markup

__all__ = ["bar_chart", "line_chart", "nice_max"]

_WIDTH, _HEIGHT, _LEFT, _BOTTOM, _TOP = 600, 160, 44, 22, 8


def nice_max(value: float) -> float:
    """The axis top for ``value``: 1, 2 or 5 times a power of ten, at least ``value`` (1 for 0)."""
    if value <= 0:
        return 1.0
    power = 1.0
    while power * 10 <= value:
        power *= 10
    while power > value:
        power /= 10
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return step * power
    return 10 * power  # (not reached)


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 or value == int(value) else f"{value:,.2f}"


def _frame(label: str, top: float, body: list[str], x_labels: list[tuple[float, str]]) -> Markup:
    plot_h = _HEIGHT - _BOTTOM - _TOP
    parts = [
        f'<svg class="chart" viewBox="0 0 {_WIDTH} {_HEIGHT}" role="img" aria-label="{escape(label)}"'
        ' xmlns="http://www.w3.org/2000/svg">',
        f'<line class="axis" x1="{_LEFT}" y1="{_TOP + plot_h}" x2="{_WIDTH}" y2="{_TOP + plot_h}"/>',
        f'<text class="tick" x="{_LEFT - 4}" y="{_TOP + 8}" text-anchor="end">{escape(_number(top))}</text>',
        f'<text class="tick" x="{_LEFT - 4}" y="{_TOP + plot_h}" text-anchor="end">0</text>',
        *body,
    ]
    for x, text in x_labels:
        parts.append(f'<text class="tick" x="{x:.1f}" y="{_HEIGHT - 6}" text-anchor="middle">{escape(text)}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))


def _label_every(count: int, most: int = 8) -> int:
    return max(1, -(-count // most))


def bar_chart(values: Sequence[float], labels: Sequence[str], label: str) -> Markup:
    """Bars of ``values`` (one per label, left to right); ``label`` summarises the chart."""
    top = nice_max(max(values, default=0))
    plot_w, plot_h = _WIDTH - _LEFT, _HEIGHT - _BOTTOM - _TOP
    slot = plot_w / max(1, len(values))
    body, ticks = [], []
    every = _label_every(len(values))
    for i, (value, text) in enumerate(zip(values, labels, strict=True)):
        h = plot_h * value / top
        x = _LEFT + i * slot
        body.append(
            f'<rect class="bar" x="{x + slot * 0.1:.1f}" y="{_TOP + plot_h - h:.1f}" width="{slot * 0.8:.1f}"'
            f' height="{h:.1f}"><title>{escape(text)}: {escape(_number(value))}</title></rect>'
        )
        if i % every == 0:
            ticks.append((x + slot / 2, text))
    return _frame(f"{label} (max {_number(max(values, default=0))})", top, body, ticks)


def line_chart(values: Sequence[float], labels: Sequence[str], label: str) -> Markup:
    """A line through ``values`` (one per label, left to right); ``label`` summarises the chart."""
    top = nice_max(max(values, default=0))
    plot_w, plot_h = _WIDTH - _LEFT, _HEIGHT - _BOTTOM - _TOP
    step = plot_w / max(1, len(values) - 1)
    points = [(_LEFT + i * step, _TOP + plot_h - plot_h * v / top) for i, v in enumerate(values)]
    body = []
    if points:
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        body.append(f'<polyline class="line" points="{path}"/>')
        for (x, y), value, text in zip(points, values, labels, strict=True):
            body.append(
                f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="2">'
                f"<title>{escape(text)}: {escape(_number(value))}</title></circle>"
            )
    every = _label_every(len(values))
    ticks = [(points[i][0], labels[i]) for i in range(0, len(points), every)]
    return _frame(f"{label} (last {_number(values[-1]) if values else 'none'})", top, body, ticks)
