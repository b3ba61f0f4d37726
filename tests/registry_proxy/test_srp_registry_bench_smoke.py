"""The registry proxy benchmark runs end to end (no timing thresholds: figures are in docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_registry_bench_runs(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "registry_bench.py"),
            "--seconds",
            "0.5",
            "--repeats",
            "1",
            "--rate",
            "100",
            "--bcrypt-rounds",
            "4",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "throughput  direct" in result.stdout and "ratio" in result.stdout
    summary = json.loads(out.read_text())["summary"]
    assert summary["throughput"]["proxy_rps"] > 0 and summary["latency"]["proxy_p99_ms"] > 0
