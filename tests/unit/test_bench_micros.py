"""The in-process micro-benchmarks that take ``--seconds`` still run (a fraction of a second each):
a refactoring that breaks one shows here, not when someone next measures. Timings are not checked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize(
    ("script", "reports"),
    [
        ("safeguards_micro.py", "checks' own cost"),
        ("tenancy_micro.py", "wire, remembered"),
        ("encryption_micro.py", "us per record"),
        ("encryption_plugin_micro.py", "fields encrypt"),
        ("auth_micro.py", "scram-sha-512"),
        ("dq_backtest_micro.py", "backtest job"),
    ],
)
def test_micro_benchmark_runs(script: str, reports: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), "--seconds", "0.01", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert reports in proc.stdout
