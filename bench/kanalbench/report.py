"""Results: metrics measured on both paths, their medians and ratios, as a table or JSON."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Metric:
    """One quantity, measured once per run on each path. ``direct`` may be empty (gateway-only)."""

    name: str
    unit: str
    direct: list[float] = field(default_factory=list)
    gateway: list[float] = field(default_factory=list)

    @property
    def direct_median(self) -> float | None:
        return statistics.median(self.direct) if self.direct else None

    @property
    def gateway_median(self) -> float | None:
        return statistics.median(self.gateway) if self.gateway else None

    @property
    def ratio(self) -> float | None:
        """gateway / direct, of the medians."""
        d, g = self.direct_median, self.gateway_median
        return g / d if d and g is not None else None

    @property
    def diff(self) -> float | None:
        """gateway - direct, of the medians."""
        d, g = self.direct_median, self.gateway_median
        return g - d if d is not None and g is not None else None

    def add(self, path: str, value: float) -> None:
        (self.direct if path == "direct" else self.gateway).append(value)

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "direct_median": self.direct_median,
            "gateway_median": self.gateway_median,
            "ratio": self.ratio,
            "diff": self.diff,
        }


@dataclass
class Report:
    scenario: str
    params: dict[str, Any]
    metrics: list[Metric] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def metric(self, name: str, unit: str) -> Metric:
        for m in self.metrics:
            if m.name == name and m.unit == unit:
                return m
        m = Metric(name, unit)
        self.metrics.append(m)
        return m

    def as_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "params": self.params,
            "metrics": [m.as_dict() for m in self.metrics],
            "notes": self.notes,
        }


def _num(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit in ("rec/s", "B", "count") or abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3f}"


def format_report(report: Report) -> str:
    params = " ".join(f"{k}={v}" for k, v in report.params.items() if v is not None)
    lines = [f"== {report.scenario}  ({params})", ""]
    head = ("metric", "unit", "direct", "gateway", "ratio g/d", "diff g-d")
    rows = [head]
    for m in report.metrics:
        ratio = f"{m.ratio:.3f}" if m.ratio is not None else "-"
        diff = _num(m.diff, m.unit) if m.diff is not None else "-"
        if m.diff is not None and m.diff > 0:
            diff = "+" + diff
        rows.append((m.name, m.unit, _num(m.direct_median, m.unit), _num(m.gateway_median, m.unit), ratio, diff))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for n, row in enumerate(rows):
        cells = zip(row, widths, strict=True)
        lines.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(cells)))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("")
    lines.append("medians of the runs; raw numbers, in run order:")
    for m in report.metrics:
        for path, values in (("direct", m.direct), ("gateway", m.gateway)):
            if values:
                lines.append(f"  {m.name} [{m.unit}] {path}: " + ", ".join(_num(v, m.unit) for v in values))
    for note in report.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines) + "\n"


def write_json(path: Path, reports: list[Report], meta: dict[str, Any]) -> None:
    path.write_text(json.dumps({"meta": meta, "reports": [r.as_dict() for r in reports]}, indent=2) + "\n")
