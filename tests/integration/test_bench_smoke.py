"""The benchmark harness works end to end: its smallest scenario with tiny sizes prints ratios.

This only checks that bench/ runs (broker, gateway and client processes, ABAB runs, table, JSON); it
asserts nothing about timings. The real figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

RUN = Path(__file__).resolve().parents[2] / "bench" / "run.py"


def _bench(tmp_path: Path, scenario: str, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Runs one scenario without warm-up; its output and its JSON report (asserting it succeeded)."""
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(RUN),
            scenario,
            *args,
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
    (report,) = json.loads(out.read_text())["reports"]
    return proc, report


def test_throughput_smoke_prints_ratios(tmp_path: Path) -> None:
    proc, report = _bench(tmp_path, "passthrough-throughput", "--size", "100", "--records", "500", "--repeats", "2")
    assert "ratio g/d" in proc.stdout
    assert "run 2/2 gateway" in proc.stderr  # ABAB: both paths, every repeat
    assert report["scenario"] == "passthrough-throughput"
    metrics = {(m["name"], m["unit"]): m for m in report["metrics"]}
    for key in (("produce", "rec/s"), ("produce", "MB/s"), ("consume", "rec/s"), ("consume", "MB/s")):
        metric = metrics[key]
        assert len(metric["direct"]) == len(metric["gateway"]) == 2
        assert metric["ratio"] is not None and metric["ratio"] > 0


def test_request_rate_smoke_reports_three_paths(tmp_path: Path) -> None:
    proc, report = _bench(tmp_path, "request-rate", "--rate", "200", "--seconds", "1", "--repeats", "1")
    assert "ratio g/r" in proc.stdout
    metrics = {m["name"]: m for m in report["metrics"]}
    for name in ("latency p99", "achieved rate", "records per Produce request", "broker CPU/request"):
        assert len(metrics[name]["direct"]) == len(metrics[name]["relay"]) == len(metrics[name]["gateway"]) == 1
    assert metrics["records per Produce request"]["gateway"][0] >= 1.0  # every record was sent in some request
    proxy = metrics["proxy CPU/request (socat or Kanal)"]
    assert proxy["direct"] == [] and len(proxy["relay"]) == len(proxy["gateway"]) == 1
    assert "gateway_relay_ratio" in proxy  # gateway CPU per request / socat CPU per request


def test_pooled_clients_smoke_reports_both_modes_and_fewer_upstream_connections(tmp_path: Path) -> None:
    clients, pool = 6, 2
    proc, report = _bench(
        tmp_path,
        "pooled-clients",
        *("--count", str(clients), "--partitions", str(clients), "--rate", "60", "--seconds", "1"),
        *("--repeats", "1", "--gateway-env", f"GATEWAY_UPSTREAM_NUM_CONNECTION={pool}"),
    )
    assert "produce latency p99, pooled - unpooled" in proc.stdout
    metrics = {m["name"]: m for m in report["metrics"]}
    for mode in ("unpooled", "pooled"):
        latency = metrics[f"produce latency p99, {mode}"]
        assert len(latency["direct"]) == len(latency["gateway"]) == 1
        assert metrics[f"gateway CPU per Produce request, {mode}"]["gateway"][0] > 0
    assert len(metrics["produce latency p99, pooled - unpooled"]["gateway"]) == 1
    (unpooled,) = metrics["gateway upstream connections, unpooled"]["gateway"]
    (pooled,) = metrics["gateway upstream connections, pooled"]["gateway"]
    assert unpooled >= 2 * clients  # without pooling every producer and consumer has its own
    # Pooled: the shared links, a link of its own per long-polling consumer, the gateway's own client
    # (its bootstrap and broker connections, for metadata) and its membership group's connection.
    assert pooled <= pool + clients + 3


def test_sasl_throughput_smoke_compares_authenticated_and_plaintext_clients(tmp_path: Path) -> None:
    proc, report = _bench(tmp_path, "sasl-throughput", "--size", "100", "--records", "500", "--repeats", "1")
    assert "produce, sasl / plaintext" in proc.stdout
    metrics = {(m["name"], m["unit"]): m for m in report["metrics"]}
    for mode in ("plaintext", "sasl"):
        produced = metrics[(f"produce, {mode}", "rec/s")]
        assert len(produced["direct"]) == len(produced["gateway"]) == 1 and produced["gateway"][0] > 0
    assert metrics[("consume, sasl / plaintext", "x")]["gateway"][0] > 0


def test_tenancy_smoke_compares_a_virtual_cluster_with_acls_and_passthrough(tmp_path: Path) -> None:
    proc, report = _bench(
        tmp_path,
        "tenancy",
        *("--size", "100", "--records", "500", "--rate", "200", "--seconds", "1", "--repeats", "1"),
    )
    assert "gateway CPU/request, vcluster - passthrough" in proc.stdout
    metrics = {(m["name"], m["unit"]): m for m in report["metrics"]}
    for mode in ("passthrough", "vcluster"):
        for metric in ("produce", "consume"):
            rate = metrics[(f"{metric}, {mode}", "rec/s")]
            assert len(rate["direct"]) == len(rate["gateway"]) == 1 and rate["gateway"][0] > 0
        cpu = metrics[(f"gateway CPU/request, {mode}", "us")]
        assert cpu["direct"] == [] and len(cpu["gateway"]) == 1 and cpu["gateway"][0] > 0
    for metric in ("produce", "consume"):
        assert metrics[(f"{metric} rec/s, vcluster / passthrough", "x")]["gateway"][0] > 0
    assert len(metrics[("gateway CPU/request, vcluster - passthrough", "us")]["gateway"]) == 1  # either sign
