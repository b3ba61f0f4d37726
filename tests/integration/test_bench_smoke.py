"""The benchmark harness works end to end: its smallest scenario with tiny sizes prints ratios.

This only checks that bench/ runs (broker, gateway and client processes, ABAB runs, table, JSON); it
asserts nothing about timings. The real figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

RUN = Path(__file__).resolve().parents[2] / "bench" / "run.py"


def test_throughput_smoke_prints_ratios(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(RUN),
            "passthrough-throughput",
            "--size",
            "100",
            "--records",
            "500",
            "--repeats",
            "2",
            "--no-warmup",
            "--json",
            str(out),
            "--log-dir",
            str(tmp_path / "logs"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ratio g/d" in proc.stdout
    assert "run 2/2 gateway" in proc.stderr  # ABAB: both paths, every repeat

    (report,) = json.loads(out.read_text())["reports"]
    assert report["scenario"] == "passthrough-throughput"
    metrics = {(m["name"], m["unit"]): m for m in report["metrics"]}
    for key in (("produce", "rec/s"), ("produce", "MB/s"), ("consume", "rec/s"), ("consume", "MB/s")):
        metric = metrics[key]
        assert len(metric["direct"]) == len(metric["gateway"]) == 2
        assert metric["ratio"] is not None and metric["ratio"] > 0
