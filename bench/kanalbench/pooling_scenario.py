"""``pooled-clients``: many producers and long-polling consumers at once, through a gateway with and
without pooled upstream connections, and direct.

    python bench/run.py pooled-clients --count 100 --rate 2000 --seconds 10 --repeats 3

``--count`` producers (librdkafka, acks=1, linger.ms 0: one record per Produce request) send
``--rate`` records/s of ``--size`` bytes between them, and ``--count`` consumers long-poll
(fetch.wait.max.ms 500), consumer ``j`` assigned partition ``j % --partitions`` of the run's topic
from its end, each in a group of its own. The clients are spread over :data:`WORKERS` processes,
which connect every client and fetch metadata, then start sending together; the first
:data:`WARMUP` seconds are not measured. Paths, alternating (direct, unpooled, pooled, direct, ...):

- ``direct``: clients -> Tansu;
- ``unpooled``: clients -> Kanal with ``GATEWAY_UPSTREAM_CONNECTION_POOL_TYPE=NONE`` -> Tansu;
- ``pooled``: the same with ``ROUND_ROBIN`` (``GATEWAY_UPSTREAM_NUM_CONNECTION`` shared links, 10
  unless ``--gateway-env`` says otherwise; the consumers' Fetches go on links of their own).

Every gateway run has a fresh gateway process. The table has a row per gateway mode (``, unpooled``
and ``, pooled``), its direct column the direct runs; ``pooled - unpooled`` and ``pooled / unpooled``
rows compare the two modes within each repeat (medians of those). CPU is the processes' user+system
time over the measured window (``/proc/PID/stat``); the gateway's per Produce request divides it by
the Produce requests it counted meanwhile (``gateway_requests_total``), so it includes the Fetches and
everything else it did. Connections are counted from ``/proc`` after the window, every client still
connected: the gateway's established ones to the broker, and the broker's on its Kafka port.
"""

from __future__ import annotations

import os
import time

from kanalbench.cpu import cpu_seconds, machine_idle_seconds
from kanalbench.measure import MB, Options, log, stack_for
from kanalbench.report import Report
from kanalbench.runs import LiveWorker, create_topic, delete_topic, order
from kanalbench.scenarios import scenario
from kanalbench.stack import Stack, proc_status
from kanalbench.worker import percentile

PATHS = ("direct", "unpooled", "pooled")
POOL_TYPE = "GATEWAY_UPSTREAM_CONNECTION_POOL_TYPE"
POOL_SIZE = "GATEWAY_UPSTREAM_NUM_CONNECTION"
MODES = {"unpooled": "NONE", "pooled": "ROUND_ROBIN"}
#: Client processes per run (the clients are spread over them).
WORKERS = 4
#: Seconds of sending before the measured window (consumers resolve their offsets meanwhile).
WARMUP = 2.0
FETCH_WAIT_MS = 500
US = 1e6
PRODUCE = ("gateway_requests_total", (("api_key", "Produce"),))

#: Rows measured on every path (a row per gateway mode, the direct runs in its direct column).
PER_MODE = (
    ("produce latency p50", "ms"),
    ("produce latency p99", "ms"),
    ("produce latency p99.9", "ms"),
    ("produce rate achieved", "rec/s"),
    ("records consumed", "rec/s"),
    ("gateway CPU per Produce request", "us"),
    ("broker CPU per record", "us"),
    ("gateway upstream connections", "count"),
    ("broker connections", "count"),
    ("gateway RSS", "MB"),
    ("machine busy (all processes)", "cores"),
)
#: Rows comparing the two gateway modes within a repeat: (row, unit, source row, how).
COMPARED = (
    ("produce latency p50, pooled - unpooled", "ms", "produce latency p50", "diff"),
    ("produce latency p99, pooled - unpooled", "ms", "produce latency p99", "diff"),
    ("produce latency p99, pooled / unpooled", "x", "produce latency p99", "ratio"),
    ("gateway CPU per Produce request, pooled / unpooled", "x", "gateway CPU per Produce request", "ratio"),
    ("gateway upstream connections, pooled / unpooled", "x", "gateway upstream connections", "ratio"),
)


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _run(stack: Stack, path: str, opts: Options, seconds: float) -> dict[str, float]:
    """One run on ``path``; its figures by row name (gateway rows absent on the direct path)."""
    direct = stack.bootstrap("direct")
    if path != "direct":
        stack.restart_gateway({**opts.env, POOL_TYPE: MODES[path]})
    topic = create_topic(direct, opts.partitions, "pool")
    workers: list[LiveWorker] = []
    try:
        nproc = max(1, min(WORKERS, opts.count))
        first = 0
        for w, clients in enumerate(_split(opts.count, nproc)):  # producers and as many consumers
            workers.append(
                LiveWorker(
                    "clients",
                    opts.log_dir / f"clients-{path}-{w}.log",
                    bootstrap=stack.bootstrap("direct" if path == "direct" else "gateway"),
                    topic=topic,
                    producers=clients,
                    consumers=clients,
                    partitions=[(first + j) % opts.partitions for j in range(clients)],
                    rate=opts.rate * clients / opts.count,
                    seconds=seconds,
                    warmup=WARMUP,
                    size=opts.size,
                    fetch_wait_ms=FETCH_WAIT_MS,
                    group_prefix=f"{topic}-{w}",
                )
            )
            first += clients
        for worker in workers:
            worker.read()  # every client connected and has its metadata
        start = time.time() + 0.5
        for worker in workers:
            worker.send(repr(start))
        pids = stack.pids()
        gateway = path != "direct"
        time.sleep(max(0.0, start + WARMUP - time.time()))
        before = stack.gateway_metrics() if gateway else {}
        cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        t0, idle0 = time.perf_counter(), machine_idle_seconds()
        time.sleep(max(0.0, start + WARMUP + seconds - time.time()))
        cpu1 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        window, idle1 = time.perf_counter() - t0, machine_idle_seconds()
        after = stack.gateway_metrics() if gateway else {}
        for worker in workers:
            worker.read()  # done sending; its clients stay connected until told
        upstream = stack.upstream_connections()
        # On the direct path the gateway idles, but keeps its shared links (and its own client's) open.
        broker_connections = stack.broker_connections() - (0 if gateway else upstream)
        rss = proc_status(pids["gateway"]) if gateway else None
        for worker in workers:
            worker.send("close")
        results = [worker.result() for worker in workers]
    finally:
        for worker in workers:
            worker.kill()
        delete_topic(direct, topic)
    stack.check_alive()
    latencies = sorted(x for r in results for x in r["latencies_ms"])
    measured = sum(r["measured"] for r in results)
    row: dict[str, float] = {
        "produce latency p50": percentile(latencies, 50),
        "produce latency p99": percentile(latencies, 99),
        "produce latency p99.9": percentile(latencies, 99.9),
        "produce rate achieved": measured / max(r["send_seconds"] - WARMUP for r in results),
        "records consumed": sum(r["consumed"] for r in results) / (WARMUP + seconds),
        "broker CPU per record": (cpu1["broker"] - cpu0["broker"]) * US / max(1, opts.rate * window),
        "broker connections": broker_connections,
        "machine busy (all processes)": (window * (os.cpu_count() or 1) - (idle1 - idle0)) / window,
    }
    if gateway:
        if PRODUCE not in after:
            raise RuntimeError(f"the gateway's /metrics has no {PRODUCE[0]} for Produce")
        requests = after[PRODUCE] - before.get(PRODUCE, 0.0)
        row["gateway CPU per Produce request"] = (cpu1["gateway"] - cpu0["gateway"]) * US / max(1.0, requests)
        assert rss is not None
        row["gateway upstream connections"] = upstream
        row["gateway RSS"] = rss / MB
    return row


def _describe(path: str, row: dict[str, float]) -> str:
    text = (
        f"p50 {row['produce latency p50']:.3f} ms, p99 {row['produce latency p99']:.3f} ms, "
        f"rate {row['produce rate achieved']:,.0f}/s, consumed {row['records consumed']:,.0f}/s, "
        f"broker connections {row['broker connections']:.0f}, machine busy {row['machine busy (all processes)']:.2f}"
    )
    if path != "direct":
        text += (
            f"; gateway CPU/Produce {row['gateway CPU per Produce request']:.1f} us, "
            f"upstream connections {row['gateway upstream connections']:.0f}"
        )
    return text


@scenario(
    "pooled-clients",
    "--count producers at a total --rate and --count long-polling consumers: direct, gateway unpooled, pooled",
    count=100,
    rate=2000.0,
    seconds=10.0,
    size=100,
    partitions=100,
    repeats=3,
)
def pooled_clients(opts: Options, name: str) -> Report:
    pool_size = int(opts.env.get(POOL_SIZE, "10"))
    report = Report(
        name,
        {
            "producers": opts.count,
            "consumers": opts.count,
            "rate": opts.rate,
            "size": opts.size,
            "seconds": opts.seconds,
            "partitions": opts.partitions,
            "repeats": opts.repeats,
            "pool size": pool_size,
            "gateway env": " ".join(f"{k}={v}" for k, v in sorted(opts.env.items())) or None,
        },
    )
    for metric, unit in PER_MODE:  # the table's row order, whichever run comes first
        for mode in MODES:
            report.metric(f"{metric}, {mode}", unit)
    for metric, unit, _, _ in COMPARED:
        report.metric(metric, unit)
    with stack_for(opts, None, None) as stack:
        if opts.warmup:
            for path in PATHS:
                log(f"  warm-up {path}: " + _describe(path, _run(stack, path, opts, min(2.0, opts.seconds))))
        rows: dict[str, dict[str, float]] = {}
        for i, path in order(opts.repeats, PATHS):
            rows[path] = _run(stack, path, opts, opts.seconds)
            log(f"  run {i + 1}/{opts.repeats} {path}: " + _describe(path, rows[path]))
            for metric, unit in PER_MODE:
                value = rows[path].get(metric)
                if value is None:
                    continue
                for mode in MODES if path == "direct" else (path,):
                    report.metric(f"{metric}, {mode}", unit).add("direct" if path == "direct" else "gateway", value)
            if path == PATHS[-1]:
                _compare(report, rows)
    # Rows no path measured (gateway rows of a direct-only scenario) are left out of the table.
    report.metrics = [m for m in report.metrics if m.direct or m.gateway]
    report.notes.append(
        "rows ', unpooled' / ', pooled': gateway column = gateway with "
        f"{POOL_TYPE}=NONE / ROUND_ROBIN ({pool_size} shared links), direct column = the direct runs; "
        "'pooled - unpooled' and 'pooled / unpooled' rows: within each repeat, medians in the gateway column"
    )
    report.notes.append(
        "gateway CPU per Produce request = all its CPU in the window (Fetches included) / Produce requests; "
        "connections are counted after the window, every client still connected (one broker)"
    )
    return report


def _compare(report: Report, rows: dict[str, dict[str, float]]) -> None:
    unpooled, pooled = rows["unpooled"], rows["pooled"]
    for metric, unit, source, how in COMPARED:
        a, b = unpooled.get(source), pooled.get(source)
        if a is None or b is None:
            continue
        value = b - a if how == "diff" else (b / a if a else None)
        if value is not None:
            report.metric(metric, unit).add("gateway", value)
