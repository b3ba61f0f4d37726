"""``safeguards``: policy-checked traffic against unchecked traffic through the same gateway, in one run.

One broker, one gateway with the ``safeguards`` plugin and two interceptors on the topics named
``bench-sg-*`` (both let every record of the harness through, so what is measured is the cost of
checking):

- ``produce-policy``: acks must be 1 (the harness's), each batch's compression one of the five,
  the Produce version at least 3;
- ``producer-rate-limiting``: a limit of 10 GB/s, far above the traffic (so it counts, never
  throttles).

Each repeat measures, alternating a plain topic (*unchecked*, the ``direct`` column) and a
``bench-sg-`` topic (*checked*, the ``gateway`` column):

- throughput: ``--records`` records of ``--size`` bytes produced as fast as the client can;
- cost per request: one-record Produce requests (100 bytes, linger 0) at ``--rate`` for
  ``--seconds``, and the gateway's CPU per Produce request (``/proc``), as ``request-rate`` measures.

At the end a producer with acks=all on a ``bench-sg-`` topic must be refused with
POLICY_VIOLATION: the policy was in force, so the run cannot pass by checking nothing.

    python bench/run.py safeguards --size 1024 --records 200000 --rate 3000 --seconds 5 --repeats 5
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import yaml

from kanalbench.measure import MB, Options, log, stack_for
from kanalbench.report import Report
from kanalbench.runs import create_topic, delete_topic, run_worker
from kanalbench.scenarios import scenario
from kanalbench.stack import Stack

US = 1e6
LIMIT = 10 * 1000 * MB  # bytes per second: far above what one client sends
INTERCEPTORS: list[dict[str, Any]] = [
    {
        "name": "bench-produce-policy",
        "plugin": "produce-policy",
        "priority": 10,
        "config": {
            "topic": "bench-sg-.*",
            "acks": {"value": 1},
            "compressions": {"values": ["NONE", "GZIP", "SNAPPY", "LZ4", "ZSTD"]},
            "version": {"min": 3},
        },
    },
    {
        "name": "bench-rate-limit",
        "plugin": "producer-rate-limiting",
        "priority": 20,
        "config": {"topic": "bench-sg-.*", "maximumBytesPerSecond": LIMIT},
    },
]


def _config() -> Path:
    path = Path(tempfile.mkdtemp(prefix="kanalbench-sg-")) / "safeguards.yaml"
    path.write_text(yaml.safe_dump({"interceptors": INTERCEPTORS}, sort_keys=False))
    return path


def _throughput(stack: Stack, opts: Options, checked: bool, report: Report | None) -> str:
    direct = stack.bootstrap("direct")
    topic = create_topic(direct, opts.partitions, "sg" if checked else "plain")
    try:
        result = run_worker(
            "produce", bootstrap=stack.bootstrap("gateway"), topic=topic, size=opts.size, records=opts.records
        )
    finally:
        delete_topic(direct, topic)
    rate = result["records"] / result["seconds"]
    if report is not None:
        path = "gateway" if checked else "direct"
        report.metric("produce", "rec/s").add(path, rate)
        report.metric("produce", "MB/s").add(path, result["bytes"] / result["seconds"] / MB)
    return f"{'checked' if checked else 'unchecked'} produce {rate:,.0f} rec/s"


def _requests(stack: Stack, opts: Options, checked: bool, report: Report | None) -> str:
    direct = stack.bootstrap("direct")
    topic = create_topic(direct, opts.partitions, "sg" if checked else "plain")
    try:
        result: dict[str, Any] = run_worker(
            "latency",
            bootstrap=stack.bootstrap("gateway"),
            topic=topic,
            size=100,
            rate=opts.rate,
            seconds=opts.seconds,
            payload="bytes",
            linger_ms=0.0,
            pids={"gateway": stack.pids()["gateway"]},
        )
    finally:
        delete_topic(direct, topic)
    requests = result["produce_requests"]
    cpu_us = result["cpu"]["gateway"] * US / requests
    if report is not None:
        path = "gateway" if checked else "direct"
        report.metric("gateway CPU per Produce request", "us").add(path, cpu_us)
        report.metric("produce latency p50", "ms").add(path, result["p50_ms"])
        report.metric("achieved rate", "rec/s").add(path, result["achieved_rate"])
    return f"{'checked' if checked else 'unchecked'} requests: gateway CPU {cpu_us:.1f} us/request, {requests:,}"


def _check_enforced(stack: Stack) -> str:
    """A producer the policy refuses (acks=all) gets POLICY_VIOLATION on a checked topic."""
    from confluent_kafka import KafkaError, Producer

    direct = stack.bootstrap("direct")
    topic = create_topic(direct, 1, "sg")
    errors: list[Any] = []
    try:
        producer = Producer({"bootstrap.servers": stack.bootstrap("gateway"), "acks": "all", "retries": 0})
        producer.produce(topic, b"x", on_delivery=lambda error, _message: errors.append(error))
        producer.flush(30)
    finally:
        delete_topic(direct, topic)
    if len(errors) != 1 or errors[0] is None or errors[0].code() != KafkaError.POLICY_VIOLATION:
        raise RuntimeError(f"the produce policy was not in force: acks=all got {errors}")
    return "acks=all on a checked topic: POLICY_VIOLATION, as configured"


@scenario(
    "safeguards",
    "produce through a produce policy and a byte-rate limit vs unchecked, same gateway: throughput, CPU per request",
    size=1024,
    records=200_000,
    rate=3000.0,
    seconds=5.0,
)
def safeguards(opts: Options, name: str) -> Report:
    report = Report(
        name,
        {
            "size": opts.size,
            "records": opts.records,
            "rate": opts.rate,
            "seconds": opts.seconds,
            "repeats": opts.repeats,
        },
    )
    report.notes.append("direct column = unchecked: a plain topic through the gateway")
    report.notes.append("gateway column = a bench-sg- topic: produce-policy + producer-rate-limiting (10 GB/s)")
    report.notes.append("ratio = checked / unchecked; diff = checked - unchecked")
    with stack_for(opts, _config(), None) as stack:
        if opts.warmup:
            warm = Options(**{**opts.__dict__, "records": max(1000, opts.records // 10), "seconds": 1.0})
            for checked in (False, True):
                log("  warm-up " + _throughput(stack, warm, checked, None))
                log("  warm-up " + _requests(stack, warm, checked, None))
        for i in range(opts.repeats):
            for checked in (False, True):
                log(f"  run {i + 1}/{opts.repeats} " + _throughput(stack, opts, checked, report))
            for checked in (False, True):
                log(f"  run {i + 1}/{opts.repeats} " + _requests(stack, opts, checked, report))
        stack.check_alive()
        report.notes.append(_check_enforced(stack))
    return report
