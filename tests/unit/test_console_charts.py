"""The console's server-side SVG charts and its metrics history: the axis, the bars' heights, labels
escaped, empty series, rates between samples."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge

from kanal.admin.console.charts import bar_chart, line_chart, nice_max
from kanal.admin.console.metrics_history import MetricsHistory


@pytest.mark.parametrize(
    ("value", "top"), [(0, 1), (0.3, 0.5), (1, 1), (7, 10), (12, 20), (45, 50), (50, 50), (51, 100), (999, 1000)]
)
def test_the_axis_top_is_a_round_number_at_least_the_value(value: float, top: float) -> None:
    assert nice_max(value) == pytest.approx(top)


def test_bars_are_as_high_as_their_share_of_the_axis() -> None:
    svg = bar_chart([0, 5, 10], ["a", "b", "c"], "violations")
    heights = [float(h) for h in re.findall(r'<rect class="bar"[^>]* height="([\d.]+)"', svg)]
    assert heights[0] == 0 and heights[2] == pytest.approx(2 * heights[1]) and heights[2] > 0
    assert 'aria-label="violations (max 10)"' in svg and "<title>b: 5</title>" in svg


def test_labels_are_escaped() -> None:
    svg = bar_chart([1], ['<script>alert("x")</script>'], "<b>label</b>")
    assert "<script>" not in svg and "<b>" not in svg
    assert "&lt;script&gt;" in svg and "&lt;b&gt;label&lt;/b&gt;" in svg


def test_an_empty_series_draws_an_empty_frame() -> None:
    assert "<polyline" not in line_chart([], [], "nothing") and "<rect" not in bar_chart([], [], "nothing")
    assert "<polyline" in line_chart([1, 2], ["t1", "t2"], "two points")


def test_the_history_gives_rates_between_samples() -> None:
    registry = CollectorRegistry()
    requests = Counter("gateway_requests", "r", ["api_key"], registry=registry)
    connections = Gauge("gateway_client_connections_active", "c", registry=registry)
    history = MetricsHistory(registry, keep=3)
    history.sample(now=100)
    requests.labels("Produce").inc(30)
    requests.labels("Fetch").inc(20)  # summed over every API
    connections.set(4)
    history.sample(now=110)
    assert history.rates() == [(110, 5.0, 0.0, 0.0, 4.0)]
    for t in (120, 130):
        history.sample(now=t)
    assert len(history.samples) == 3 and [r[0] for r in history.rates()] == [120, 130]  # bounded
