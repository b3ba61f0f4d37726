"""Results: metrics measured on both paths, their medians and ratios, as a table or JSON."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return top / bottom if bottom and top is not None else None


@dataclass
class Metric:
    """One quantity, measured once per run on each path. ``direct`` may be empty (gateway-only);
    ``relay`` (an L4 relay in front of the broker) is measured by the request-rate scenario only."""

    name: str
    unit: str
    direct: list[float] = field(default_factory=list)
    gateway: list[float] = field(default_factory=list)
    relay: list[float] = field(default_factory=list)

    @property
    def direct_median(self) -> float | None:
        return _median(self.direct)

    @property
    def gateway_median(self) -> float | None:
        return _median(self.gateway)

    @property
    def relay_median(self) -> float | None:
        return _median(self.relay)

    @property
    def ratio(self) -> float | None:
        """gateway / direct, of the medians."""
        return _ratio(self.gateway_median, self.direct_median)

    @property
    def relay_ratio(self) -> float | None:
        """relay / direct, of the medians."""
        return _ratio(self.relay_median, self.direct_median)

    @property
    def gateway_relay_ratio(self) -> float | None:
        """gateway / relay, of the medians."""
        return _ratio(self.gateway_median, self.relay_median)

    @property
    def diff(self) -> float | None:
        """gateway - direct, of the medians."""
        d, g = self.direct_median, self.gateway_median
        return g - d if d is not None and g is not None else None

    def add(self, path: str, value: float) -> None:
        (self.relay if path == "relay" else self.direct if path == "direct" else self.gateway).append(value)

    def as_dict(self) -> dict[str, Any]:
        out = {
            **asdict(self),
            "direct_median": self.direct_median,
            "gateway_median": self.gateway_median,
            "ratio": self.ratio,
            "diff": self.diff,
        }
        if self.relay:
            out.update(
                relay_median=self.relay_median,
                relay_ratio=self.relay_ratio,
                gateway_relay_ratio=self.gateway_relay_ratio,
            )
        else:
            del out["relay"]
        return out


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


def _fmt_ratio(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "-"


def format_report(report: Report) -> str:
    params = " ".join(f"{k}={v}" for k, v in report.params.items() if v is not None)
    lines = [f"== {report.scenario}  ({params})", ""]
    relay = any(m.relay for m in report.metrics)  # three paths: relay columns between direct and gateway
    head = ("metric", "unit", "direct", *(("relay",) if relay else ()), "gateway", "ratio g/d")
    head += ("ratio r/d", "ratio g/r") if relay else ()
    rows: list[tuple[str, ...]] = [(*head, "diff g-d")]
    for m in report.metrics:
        diff = _num(m.diff, m.unit) if m.diff is not None else "-"
        if m.diff is not None and m.diff > 0:
            diff = "+" + diff
        row = [m.name, m.unit, _num(m.direct_median, m.unit)]
        row += [_num(m.relay_median, m.unit)] if relay else []
        row += [_num(m.gateway_median, m.unit), _fmt_ratio(m.ratio)]
        row += [_fmt_ratio(m.relay_ratio), _fmt_ratio(m.gateway_relay_ratio)] if relay else []
        rows.append((*row, diff))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, cells_row in enumerate(rows):
        cells = zip(cells_row, widths, strict=True)
        lines.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(cells)))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("")
    lines.append("medians of the runs; raw numbers, in run order:")
    for m in report.metrics:
        for path, values in (("direct", m.direct), ("relay", m.relay), ("gateway", m.gateway)):
            if values:
                lines.append(f"  {m.name} [{m.unit}] {path}: " + ", ".join(_num(v, m.unit) for v in values))
    for note in report.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines) + "\n"


def write_json(path: Path, reports: list[Report], meta: dict[str, Any]) -> None:
    path.write_text(json.dumps({"meta": meta, "reports": [r.as_dict() for r in reports]}, indent=2) + "\n")
