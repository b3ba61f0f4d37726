"""The three measurements, each run on both paths in ABAB order against one broker and one gateway.

A scenario is one of these with a gateway config (see :mod:`kanalbench.scenarios`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kanalbench.cpu import cpu_seconds
from kanalbench.report import Report
from kanalbench.runs import (
    PATHS,
    WorkerError,
    create_topic,
    delete_topic,
    order,
    run_worker,
    worker_argv,
    worker_env,
)
from kanalbench.stack import Stack, nofile_limit, open_fds, proc_status

MB = 1_000_000


@dataclass
class Options:
    """Everything a scenario may use; the CLI fills it (each scenario has its own defaults)."""

    size: int = 1024
    records: int = 200_000
    repeats: int = 5
    rate: float = 5000.0
    seconds: float = 10.0
    linger_ms: float = 1.0
    count: int = 1000
    partitions: int = 1
    payload: str = "bytes"
    warmup: bool = True
    config: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    log_dir: Path = Path("bench-logs")
    py_spy: Path | None = None
    cprofile: Path | None = None


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextmanager
def stack_for(opts: Options, config: Path | None, env: dict[str, str] | None) -> Iterator[Stack]:
    """The broker and gateway of one scenario; optionally py-spy recording the gateway meanwhile."""
    with Stack(opts.log_dir, config or opts.config, {**(env or {}), **opts.env}, opts.cprofile) as stack:
        spy = None
        if opts.py_spy is not None:
            spy = subprocess.Popen(
                [
                    _py_spy(),
                    "record",
                    "--pid",
                    str(stack.pids()["gateway"]),
                    "--rate",
                    "250",
                    "--format",
                    "raw",
                    "--output",
                    str(opts.py_spy),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        try:
            yield stack
        finally:
            if spy is not None:
                spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
                spy.wait(30)


def _py_spy() -> str:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else "py-spy"


class PhaseProfiler:
    """py-spy on the gateway for each phase of a scenario (or each gateway process it starts), one
    raw file per phase and run in ``log_dir``, merged at the end into ``out`` (all phases) and
    ``out.<phase>``. Does nothing when ``out`` is None."""

    def __init__(self, out: Path | None, log_dir: Path, scenario: str) -> None:
        self.out = out
        self.log_dir = log_dir
        self.scenario = scenario
        self.files: dict[str, list[Path]] = {}

    @contextmanager
    def record(self, pid: int, phase: str) -> Iterator[None]:
        if self.out is None:
            yield
            return
        files = self.files.setdefault(phase, [])
        raw = self.log_dir / f"py-spy-{self.scenario}-{phase}-{len(files)}.txt"
        files.append(raw)
        argv = [_py_spy(), "record", "--pid", str(pid), "--rate", "250", "--format", "raw", "--output", str(raw)]
        spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            yield
        finally:
            spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
            spy.wait(30)

    def merge(self) -> None:
        if self.out is None:
            return
        every: list[str] = []
        for phase, files in self.files.items():
            text = "".join(f.read_text() for f in files if f.exists())
            Path(f"{self.out}.{phase}").write_text(text)
            every.append(text)
        self.out.write_text("".join(every))


def _cpu(stack: Stack) -> dict[str, float]:
    return {name: cpu_seconds(pid) for name, pid in stack.pids().items()}


# ------------------------------------------------------------------------------------- throughput


def _throughput_run(stack: Stack, path: str, opts: Options, records: int, report: Report | None) -> str:
    direct = stack.bootstrap("direct")
    topic = create_topic(direct, opts.partitions, "tput")
    try:
        bootstrap = stack.bootstrap(path)
        cpu0 = _cpu(stack)
        produced = run_worker(
            "produce", bootstrap=bootstrap, topic=topic, size=opts.size, records=records, payload=opts.payload
        )
        cpu1 = _cpu(stack)
        consumed = run_worker("consume", bootstrap=bootstrap, topic=topic, records=records, partitions=opts.partitions)
        cpu2 = _cpu(stack)
    finally:
        delete_topic(direct, topic)
    stack.check_alive()
    p_rate = produced["records"] / produced["seconds"]
    c_rate = consumed["records"] / consumed["seconds"]
    if report is not None:
        report.metric("produce", "rec/s").add(path, p_rate)
        report.metric("produce", "MB/s").add(path, produced["bytes"] / produced["seconds"] / MB)
        report.metric("consume", "rec/s").add(path, c_rate)
        report.metric("consume", "MB/s").add(path, consumed["bytes"] / consumed["seconds"] / MB)
        report.metric("broker CPU, produce", "s").add(path, cpu1["broker"] - cpu0["broker"])
        report.metric("broker CPU, consume", "s").add(path, cpu2["broker"] - cpu1["broker"])
        if path == "gateway":
            report.metric("gateway CPU, produce", "s").add(path, cpu1["gateway"] - cpu0["gateway"])
            report.metric("gateway CPU, consume", "s").add(path, cpu2["gateway"] - cpu1["gateway"])
    return f"produce {p_rate:,.0f} rec/s in {produced['seconds']:.2f}s, consume {c_rate:,.0f} rec/s"


def throughput(opts: Options, name: str, config: Path | None = None, env: dict[str, str] | None = None) -> Report:
    """Produce ``records`` records of ``size`` bytes as fast as librdkafka can (acks=1), then consume
    them from the beginning; records/s and MB/s (of record values) on each path."""
    report = Report(
        name,
        {
            "size": opts.size,
            "records": opts.records,
            "repeats": opts.repeats,
            "partitions": opts.partitions,
            "payload": opts.payload,
            "config": str(config or opts.config or "") or None,
        },
    )
    with stack_for(opts, config, env) as stack:
        if opts.warmup:
            for path in PATHS:
                log(f"  warm-up {path}: " + _throughput_run(stack, path, opts, max(1000, opts.records // 10), None))
        for i, path in order(opts.repeats):
            log(f"  run {i + 1}/{opts.repeats} {path}: " + _throughput_run(stack, path, opts, opts.records, report))
    return report


# ---------------------------------------------------------------------------------------- latency


def _latency_run(stack: Stack, path: str, opts: Options, seconds: float, report: Report | None) -> str:
    direct = stack.bootstrap("direct")
    topic = create_topic(direct, opts.partitions, "lat")
    try:
        cpu0 = _cpu(stack)
        result = run_worker(
            "latency",
            bootstrap=stack.bootstrap(path),
            topic=topic,
            size=opts.size,
            rate=opts.rate,
            seconds=seconds,
            payload=opts.payload,
            linger_ms=opts.linger_ms,
        )
        cpu1 = _cpu(stack)
    finally:
        delete_topic(direct, topic)
    stack.check_alive()
    if report is not None:
        report.metric("latency p50", "ms").add(path, result["p50_ms"])
        report.metric("latency p99", "ms").add(path, result["p99_ms"])
        report.metric("latency p99.9", "ms").add(path, result["p999_ms"])
        report.metric("latency mean", "ms").add(path, result["mean_ms"])
        report.metric("achieved rate", "rec/s").add(path, result["achieved_rate"])
        report.metric("broker CPU", "s").add(path, cpu1["broker"] - cpu0["broker"])
        if path == "gateway":
            report.metric("gateway CPU", "s").add(path, cpu1["gateway"] - cpu0["gateway"])
    return (
        f"p50 {result['p50_ms']:.3f} ms, p99 {result['p99_ms']:.3f} ms, "
        f"rate {result['achieved_rate']:,.0f}/s over {result['records']:,} records"
    )


def latency(opts: Options, name: str, config: Path | None = None, env: dict[str, str] | None = None) -> Report:
    """A producer at a steady ``rate`` (acks=1, linger.ms ``linger_ms``); produce()-to-ack time of every record
    after a 1 s warm-up; per-run p50/p99, medians over runs."""
    report = Report(
        name,
        {
            "size": opts.size,
            "rate": opts.rate,
            "seconds": opts.seconds,
            "linger_ms": opts.linger_ms,
            "repeats": opts.repeats,
            "partitions": opts.partitions,
            "payload": opts.payload,
            "config": str(config or opts.config or "") or None,
        },
    )
    with stack_for(opts, config, env) as stack:
        if opts.warmup:
            for path in PATHS:
                log(f"  warm-up {path}: " + _latency_run(stack, path, opts, min(2.0, opts.seconds), None))
        for i, path in order(opts.repeats):
            log(f"  run {i + 1}/{opts.repeats} {path}: " + _latency_run(stack, path, opts, opts.seconds, report))
    return report


# ------------------------------------------------------------------------------- idle connections


def _hold_connections(bootstrap: str, count: int, while_held: Any) -> tuple[dict[str, Any], Any]:
    """Runs the idle worker; calls ``while_held(holding_info)`` while its connections are open."""
    proc = subprocess.Popen(
        worker_argv("idle", bootstrap=bootstrap, count=count),
        env=worker_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        line = proc.stdout.readline()
        if not line:
            raise WorkerError(f"idle worker failed:\n{proc.stderr.read()[-3000:]}")
        observed = while_held(json.loads(line))
        out, err = proc.communicate(input="", timeout=120)  # closing stdin releases the connections
        if proc.returncode != 0:
            raise WorkerError(f"idle worker failed (exit {proc.returncode}):\n{err[-3000:]}")
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return result, observed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def idle_connections(opts: Options, name: str, config: Path | None = None, env: dict[str, str] | None = None) -> Report:
    """``count`` client connections, each with one ApiVersions answered, held open; the gateway's RSS
    (VmRSS) and its upstream connections to the broker while holding them, and the connections the
    broker holds. A fresh gateway process for every gateway run."""
    gateway_env = {**(env or {}), **opts.env}
    report = Report(
        name,
        {
            "count": opts.count,
            "repeats": opts.repeats,
            "config": str(config or opts.config or "") or None,
            "gateway env": " ".join(f"{k}={v}" for k, v in sorted(gateway_env.items())) or None,
        },
    )
    settle = 2.0
    with stack_for(opts, config, env) as stack:
        used = False
        for i, path in order(opts.repeats):
            if path == "gateway" and used:
                stack.restart_gateway()
            pids = stack.pids()
            time.sleep(0.5)
            rss_before = proc_status(pids["gateway"])

            def while_held(info: dict[str, Any], pids: dict[str, int] = pids, path: str = path) -> dict[str, int]:
                time.sleep(settle)
                return {
                    "gateway": proc_status(pids["gateway"]),
                    "broker": proc_status(pids["broker"]),
                    "gateway_fds": open_fds(pids["gateway"]),
                    "broker_fds": open_fds(pids["broker"]),
                    "upstream": stack.upstream_connections() if path == "gateway" else 0,
                    "broker_connections": stack.broker_connections(),
                }

            result, rss = _hold_connections(stack.bootstrap(path), opts.count, while_held)
            stack.check_alive()
            used = used or path == "gateway"
            report.metric("connections answered", "count").add(path, result["answered"])
            report.metric("connections alive after hold", "count").add(path, result["alive_at_end"])
            report.metric("time to open and answer all", "s").add(path, result["open_seconds"])
            report.metric("broker RSS holding", "MB").add(path, rss["broker"] / MB)
            report.metric("broker open files holding", "count").add(path, rss["broker_fds"])
            report.metric("broker connections holding", "count").add(path, rss["broker_connections"])
            if path == "gateway":
                report.metric("gateway upstream connections holding", "count").add(path, rss["upstream"])
                report.metric("gateway RSS before", "MB").add(path, rss_before / MB)
                report.metric("gateway RSS holding", "MB").add(path, rss["gateway"] / MB)
                report.metric("gateway RSS per connection", "KB").add(
                    path, (rss["gateway"] - rss_before) / opts.count / 1000
                )
                report.metric("gateway open files holding", "count").add(path, rss["gateway_fds"])
            held = (
                f"gateway RSS {rss['gateway'] / MB:.1f} MB, {rss['upstream']} upstream connections, "
                if path == "gateway"
                else ""
            )
            log(
                f"  run {i + 1}/{opts.repeats} {path}: {result['answered']}/{opts.count} answered in "
                f"{result['open_seconds']:.2f}s; {held}broker RSS {rss['broker'] / MB:.1f} MB, "
                f"{rss['broker_connections']} broker connections"
            )
        limit = nofile_limit(stack.pids()["gateway"])
    report.notes.append(
        "one broker: gateway upstream connections are those to it (shared, own, the gateway's metadata "
        "client's and its membership group's), counted in /proc; "
        f"gateway open-file limit {limit:,} (each unpooled client needs two)"
    )
    return report
