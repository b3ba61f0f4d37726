"""Traffic control measured end to end: ``rate-limit`` (how well a byte-rate limit holds) and
``cache`` (repeated reads of a hot partition from the gateway's cache against the broker path).

``rate-limit``: one gateway with ``producer-rate-limiting`` at ``--rate`` bytes per second (10 MB/s
by default) on the topics named ``bench-rl-*``. ``--count`` producers (4) write to one such topic at
once, as fast as they can, ``--records`` records of ``--size`` bytes in all, sized so the run lasts
about ``--seconds`` (30) at the limit. The rate is the record batch bytes the gateway counted (its
limiter's own measure: values, keys, record and batch headers) over the time from the first
producer's start to the last one's last acknowledgement; the value bytes per second are printed
beside it. Every record must be delivered without error.

    python bench/run.py rate-limit --rate 10000000 --seconds 30 --count 4 --size 1024 --repeats 3

``cache``: one gateway with ``cache`` on the topics named ``bench-cache-*``. The same ``--records``
records of ``--size`` bytes are produced to a plain topic and to a cached topic (directly to the
broker); the cached topic is read once through the gateway to fill the cache. Then, alternating,
each topic is read whole through the gateway, twice: by a librdkafka consumer (records/s, where the
client's own record handling weighs in) and by raw Fetch requests of 1 MB one after the other,
timed without decoding the answers (the path's serving speed, what the cache itself changes; see
``worker.fetch_loop``). The plain topic goes to the broker
every time (*broker path*, the ``direct`` column), the cached one is served by the gateway
(*cache*, the ``gateway`` column). The run checks with the cache's hit counter that every raw
Fetch of a cached read was served from the cache, and none of a plain one.

    python bench/run.py cache --size 1024 --records 100000 --repeats 5
"""

from __future__ import annotations

import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from kanalbench.measure import MB, Options, log, stack_for
from kanalbench.report import Report
from kanalbench.runs import create_topic, delete_topic, run_worker
from kanalbench.scenarios import scenario
from kanalbench.stack import Stack


def _config(interceptors: list[dict[str, Any]]) -> Path:
    path = Path(tempfile.mkdtemp(prefix="kanalbench-traffic-")) / "traffic.yaml"
    path.write_text(yaml.safe_dump({"interceptors": interceptors}, sort_keys=False))
    return path


def _metric(stack: Stack, name: str) -> float:
    """A sample of the gateway's ``/metrics``, summed over its labels."""
    assert stack.gateway is not None
    port = stack.gateway.env["GATEWAY_HTTP_PORT"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith((f"{name} ", f"{name}{{")))


# ------------------------------------------------------------------------------------ rate-limit


def _limited_run(stack: Stack, opts: Options, report: Report | None) -> str:
    direct = stack.bootstrap("direct")
    topic = create_topic(direct, opts.partitions, "rl")
    per_producer = max(1, opts.records // opts.count)
    results: list[dict[str, Any]] = []
    failures: list[BaseException] = []

    def one() -> None:
        try:
            results.append(
                run_worker(
                    "produce", bootstrap=stack.bootstrap("gateway"), topic=topic, size=opts.size, records=per_producer
                )
            )
        except BaseException as exc:  # reported below: every producer must deliver every record
            failures.append(exc)

    threads = [threading.Thread(target=one) for _ in range(opts.count)]
    counted0 = _metric(stack, "kanal_rate_limit_bytes_total")
    start = time.perf_counter()
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        delete_topic(direct, topic)
    if failures:
        raise RuntimeError(f"a producer failed under the limit: {failures[0]}")
    # the producers' own clocks start after they connect: the slowest one's span is the run's
    seconds = max(r["seconds"] for r in results)
    wall = time.perf_counter() - start
    counted = _metric(stack, "kanal_rate_limit_bytes_total") - counted0
    values = sum(r["bytes"] for r in results)
    rate = counted / seconds if counted else values / seconds
    if report is not None:
        report.metric("limited rate (batch bytes)", "MB/s").add("gateway", rate / MB)
        report.metric("limited rate (value bytes)", "MB/s").add("gateway", values / seconds / MB)
        report.metric("limit", "MB/s").add("gateway", opts.rate / MB)
        report.metric("rate / limit", "x").add("gateway", rate / opts.rate)
    return (
        f"{opts.count} producers, {values / MB:,.0f} MB of values in {seconds:.1f}s (wall {wall:.1f}s): "
        f"{rate / MB:.2f} MB/s counted, {values / seconds / MB:.2f} MB/s of values; limit {opts.rate / MB:.2f} MB/s"
    )


@scenario(
    "rate-limit",
    "--count producers through a producer-rate-limiting limit of --rate bytes/s for about --seconds",
    size=1024,
    rate=10_000_000.0,
    seconds=30.0,
    count=4,
    repeats=3,
)
def rate_limit(opts: Options, name: str) -> Report:
    records = int(opts.rate * opts.seconds / opts.size)
    opts = Options(**{**opts.__dict__, "records": records})
    report = Report(name, {"size": opts.size, "limit": opts.rate, "seconds": opts.seconds, "producers": opts.count})
    report.notes.append("rate = batch bytes the limiter counted / the slowest producer's time; within 5% is the target")
    limit = {"topic": "bench-rl-.*", "maximumBytesPerSecond": int(opts.rate)}
    config = _config([{"name": "bench-limit", "plugin": "producer-rate-limiting", "priority": 10, "config": limit}])
    with stack_for(opts, config, None) as stack:
        for i in range(opts.repeats):
            log(f"  run {i + 1}/{opts.repeats} " + _limited_run(stack, opts, report))
        stack.check_alive()
    return report


# ----------------------------------------------------------------------------------------- cache


def _read(stack: Stack, topic: str, records: int, cached: bool, report: Report | None) -> str:
    hits0 = _metric(stack, "kanal_cache_hits_total")
    consumed = run_worker("consume", bootstrap=stack.bootstrap("gateway"), topic=topic, records=records)
    fetched = run_worker("fetch-loop", bootstrap=stack.bootstrap("gateway"), topic=topic, records=records)
    hits = _metric(stack, "kanal_cache_hits_total") - hits0
    if cached and report is not None and hits < 2 * fetched["fetches"]:  # (both passes of the loop)
        raise RuntimeError(f"cached reads were not all served from the cache ({hits:,.0f} hits)")
    if not cached and hits:
        raise RuntimeError("a plain topic's read was served from the cache")
    rate = consumed["records"] / consumed["seconds"]
    fetch_ms = fetched["seconds"] / fetched["fetches"] * 1000
    if report is not None:
        path = "gateway" if cached else "direct"
        report.metric("consume (librdkafka)", "rec/s").add(path, rate)
        report.metric("consume (librdkafka)", "MB/s").add(path, consumed["bytes"] / consumed["seconds"] / MB)
        report.metric("raw Fetch round trip", "ms").add(path, fetch_ms)
        report.metric("raw Fetch reads", "rec/s").add(path, fetched["records"] / fetched["seconds"])
        report.metric("raw Fetch reads", "MB/s").add(path, fetched["bytes"] / fetched["seconds"] / MB)
    return (
        f"{'cache' if cached else 'broker path'}: librdkafka {rate:,.0f} rec/s; raw fetches {fetch_ms:.2f} ms each "
        f"({fetched['fetches']} of them); {hits:,.0f} cache hits"
    )


@scenario(
    "cache",
    "repeated reads of a hot partition: the gateway's cache vs the broker path, same gateway",
    size=1024,
    records=100_000,
)
def cache(opts: Options, name: str) -> Report:
    report = Report(name, {"size": opts.size, "records": opts.records, "repeats": opts.repeats})
    report.notes.append("direct column = broker path: a plain topic read through the gateway")
    report.notes.append("gateway column = a bench-cache- topic read through the gateway, served from its cache")
    size = int(opts.records * opts.size * 2)  # room for the whole partition and its batches' headers
    settings = {
        "topic": "bench-cache-.*",
        "cacheConfig": {"inMemConfig": {"cacheSize": size, "expireTimeMs": 3_600_000}},
    }
    config = _config([{"name": "bench-cache", "plugin": "cache", "priority": 900, "config": settings}])
    with stack_for(opts, config, None) as stack:
        direct = stack.bootstrap("direct")
        plain, hot = create_topic(direct, 1, "plain"), create_topic(direct, 1, "cache")
        try:
            for topic in (plain, hot):
                run_worker("produce", bootstrap=direct, topic=topic, size=opts.size, records=opts.records)
            log("  fill: " + _read(stack, hot, opts.records, True, None))
            if opts.warmup:
                log("  warm-up " + _read(stack, plain, opts.records, False, None))
            for i in range(opts.repeats):
                log(f"  run {i + 1}/{opts.repeats} " + _read(stack, plain, opts.records, False, report))
                log(f"  run {i + 1}/{opts.repeats} " + _read(stack, hot, opts.records, True, report))
        finally:
            delete_topic(direct, plain)
            delete_topic(direct, hot)
        stack.check_alive()
    return report
