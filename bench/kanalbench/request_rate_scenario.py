"""``request-rate``: one-record Produce requests at a fixed rate on three paths, in one run.

    python bench/run.py request-rate --rate 5000 --seconds 10 --repeats 3

The same librdkafka producer (acks=1, linger.ms 0, ``--size`` byte records, 100 by default) sends
``--rate`` records per second for ``--seconds`` (after a 1 s warm-up at the same rate) on each path,
alternating direct, relay, gateway, direct, ...:

- ``direct``: client -> Tansu;
- ``relay``: client -> socat (an L4 relay, one process per connection) -> a second Tansu with the
  same settings that advertises socat's port, so that no connection bypasses the relay
  (see :mod:`kanalbench.relay`);
- ``gateway``: client -> Kanal -> the first Tansu.

Per run: produce latency (produce() to delivery callback) p50/p99/p99.9, the achieved rate, records
per Produce request (1.0 unless the path falls behind and librdkafka batches), and the CPU each
process on the path used per Produce request, in microseconds: the processes' user+system time
(``/proc/PID/stat``, with their children) from the first record sent to the last one acknowledged,
divided by the Produce requests librdkafka sent meanwhile. ``other processes' load`` is the
machine's busy time in that window less the path's and the client's, in cores: a run that other
work on the machine disturbed shows it there. ``proxy CPU/request`` is socat's on the
relay path and the gateway's on the gateway path, so its ``ratio g/r`` is gateway CPU per request /
relay CPU per request. ``KANALBENCH_RELAY=trio`` runs :mod:`kanalbench.trio_relay` as the relay
(the floor of a trio proxy) instead of socat. ``--py-spy FILE`` profiles the gateway over the whole
scenario (it is sampled only while busy, i.e. during the gateway runs).
"""

from __future__ import annotations

from typing import Any

from kanalbench.measure import Options, log, stack_for
from kanalbench.relay import Relay
from kanalbench.report import Report
from kanalbench.runs import create_topic, delete_topic, order, run_worker
from kanalbench.scenarios import scenario
from kanalbench.stack import Stack

PATHS = ("direct", "relay", "gateway")
US = 1e6
#: The table's rows, in order: (name, unit).
ROWS = (
    ("latency p50", "ms"),
    ("latency p99", "ms"),
    ("latency p99.9", "ms"),
    ("achieved rate", "rec/s"),
    ("records per Produce request", "x"),
    ("broker CPU/request", "us"),
    ("proxy CPU/request (socat or Kanal)", "us"),
    ("path CPU/request (broker + proxy)", "us"),
    ("client CPU/request", "us"),
    ("other processes' load", "cores"),
)


def _run(stack: Stack, relay: Relay, path: str, opts: Options, seconds: float, report: Report | None) -> str:
    if path == "relay":
        bootstrap, admin, pids = relay.bootstrap, relay.bootstrap, relay.pids()
    else:
        bootstrap, admin = stack.bootstrap(path), stack.bootstrap("direct")
        pids = {name: pid for name, pid in stack.pids().items() if path == "gateway" or name == "broker"}
    topic = create_topic(admin, opts.partitions, "rr")
    try:
        result: dict[str, Any] = run_worker(
            "latency",
            bootstrap=bootstrap,
            topic=topic,
            size=opts.size,
            rate=opts.rate,
            seconds=seconds,
            payload=opts.payload,
            linger_ms=opts.linger_ms,
            pids=pids,
        )
    finally:
        delete_topic(admin, topic)
    stack.check_alive()
    relay.check_alive()
    requests = result["produce_requests"]
    cpu_us = {name: used * US / requests for name, used in result["cpu"].items()}
    proxy = cpu_us.get("relay", cpu_us.get("gateway"))
    used = result["client_cpu"] + sum(result["cpu"].values())
    others = (result["machine_busy_cpu"] - used) / result["window_s"]  # cores busy outside the benchmark
    if report is not None:
        row = {
            "latency p50": result["p50_ms"],
            "latency p99": result["p99_ms"],
            "latency p99.9": result["p999_ms"],
            "achieved rate": result["achieved_rate"],
            "records per Produce request": result["records_total"] / requests,
            "broker CPU/request": cpu_us["broker"],
            "proxy CPU/request (socat or Kanal)": proxy,
            "path CPU/request (broker + proxy)": sum(cpu_us.values()),
            "client CPU/request": result["client_cpu"] * US / requests,
            "other processes' load": others,
        }
        for name, unit in ROWS:
            if row[name] is not None:
                report.metric(name, unit).add(path, row[name])
    cpu = ", ".join(f"{name} {value:.1f} us" for name, value in cpu_us.items())
    return (
        f"p50 {result['p50_ms']:.3f} ms, p99 {result['p99_ms']:.3f} ms, rate {result['achieved_rate']:,.0f}/s, "
        f"{requests:,} requests; CPU/request {cpu}; other load {others:.2f} cores"
    )


@scenario(
    "request-rate",
    "one-record Produce requests at a fixed rate: direct, socat relay, gateway; latency and CPU per request",
    size=100,
    rate=3000.0,
    seconds=10.0,
    linger_ms=0.0,
    repeats=3,
)
def request_rate(opts: Options, name: str) -> Report:
    report = Report(
        name,
        {
            "size": opts.size,
            "rate": opts.rate,
            "seconds": opts.seconds,
            "linger_ms": opts.linger_ms,
            "repeats": opts.repeats,
            "partitions": opts.partitions,
            "config": str(opts.config) if opts.config else None,
        },
    )
    for metric, unit in ROWS:  # the table's row order, whichever path runs first
        report.metric(metric, unit)
    with stack_for(opts, None, None) as stack, Relay(opts.log_dir) as relay:
        if opts.warmup:
            for path in PATHS:
                log(f"  warm-up {path}: " + _run(stack, relay, path, opts, min(2.0, opts.seconds), None))
        for i, path in order(opts.repeats, PATHS):
            log(f"  run {i + 1}/{opts.repeats} {path}: " + _run(stack, relay, path, opts, opts.seconds, report))
        kind = relay.kind
    report.notes.append(
        f"relay: {kind} in front of a second Tansu (same settings) that advertises {kind}'s port; "
        f"proxy ratio g/r = gateway CPU per request / {kind} CPU per request"
    )
    return report
