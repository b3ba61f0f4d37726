"""``topicview-throughput``: consuming through a topic view against plain passthrough, in one run.

One broker, one gateway (admin API on). The input topic is filled once, directly on the broker, with
``--records`` JSON records of ``--size`` bytes (``{"id", "name", "amount", "pad"}``, see
``worker.values``). A ``TopicView`` is created through the admin API::

    SELECT id, name, amount FROM <topic> WHERE amount >= 500 AND name <> 'user-7'

(a numeric and a string condition, a 3-field projection; it keeps about half of the records). Then,
alternating, the same librdkafka consumer reads the whole input topic through the gateway
(*passthrough*, the ``direct`` column) and the whole view through the gateway (*view*, the ``gateway``
column): the ratio is view / passthrough. Rates count **input** records (every record the view
scans) per second; the consumer of the view receives only the kept ones.

    python bench/run.py topicview-throughput --size 200 --records 1000000 --repeats 5

The gateway runs with its defaults: read-ahead and the helper process on (see docs/topic-views.md);
``--gateway-env GATEWAY_FEATURE_FLAGS_TOPIC_VIEWS_READ_AHEAD=false`` or ``..._HELPER_PROCESS=false``
measures without them. The helper's CPU is reported beside the gateway's.
"""

from __future__ import annotations

import base64
import json
import urllib.request
from typing import Any

from kanalbench.cpu import children_cpu_seconds, cpu_seconds
from kanalbench.measure import MB, Options, log, stack_for
from kanalbench.report import Report
from kanalbench.runs import create_topic, run_worker
from kanalbench.scenarios import scenario
from kanalbench.stack import Stack
from kanalbench.worker import DISTINCT_VALUES, values

VIEW = "bench-view"
STATEMENT = "SELECT id, name, amount FROM \"{topic}\" WHERE amount >= 500 AND name <> 'user-7'"
USER, PASSWORD = "bench", "bench-password"
ENV = {
    "GATEWAY_ADMIN_API_USERS": json.dumps([{"username": USER, "password": PASSWORD, "admin": True}]),
    "GATEWAY_CLUSTER_ID": "kanalbench",
}


def _kept(size: int, payload: str, records: int) -> int:
    """How many of the produced records the view keeps (the same condition, in Python)."""
    keep: list[bool] = [
        v["amount"] >= 500 and v["name"] != "user-7" for v in (json.loads(raw) for raw in values(size, payload))
    ]
    full, rest = divmod(records, DISTINCT_VALUES)
    return full * sum(keep) + sum(keep[:rest])


def _put_view(stack: Stack, topic: str) -> dict[str, Any]:
    assert stack.gateway is not None
    port = stack.gateway.env["GATEWAY_HTTP_PORT"]
    manifest = {
        "apiVersion": "gateway/v2",
        "kind": "TopicView",
        "metadata": {"name": VIEW},
        "spec": {
            "transformation": {"type": "sql", "statement": STATEMENT.format(topic=topic)},
            "onError": {"type": "DROP"},
        },
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/gateway/v2/topic-view", data=json.dumps(manifest).encode(), method="PUT"
    )
    request.add_header("Content-Type", "application/json")
    request.add_header("Authorization", "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode())
    with urllib.request.urlopen(request, timeout=30) as response:
        answer: dict[str, Any] = json.loads(response.read())
    status = answer["resource"].get("status", {}).get("status")
    if status != "Ready":
        raise RuntimeError(f"the view is not ready: {answer}")
    return answer


def _consume(stack: Stack, topic: str, expected: int, scanned: int, label: str, report: Report | None) -> str:
    assert stack.gateway is not None
    pids = stack.pids()
    pid, broker = pids["gateway"], pids["broker"]
    cpu0, helper0, broker0 = cpu_seconds(pid), children_cpu_seconds(pid), cpu_seconds(broker)
    result = run_worker("consume", bootstrap=stack.bootstrap("gateway"), topic=topic, records=expected, partitions=1)
    cpu = cpu_seconds(pid) - cpu0
    helper = children_cpu_seconds(pid) - helper0
    broker_cpu = cpu_seconds(broker) - broker0
    seconds = result["seconds"]
    path = "direct" if label == "passthrough" else "gateway"
    if report is not None:
        report.metric("input records scanned", "rec/s").add(path, scanned / seconds)
        report.metric("input MB scanned", "MB/s").add(path, scanned * report.params["size"] / seconds / MB)
        report.metric("records delivered", "rec/s").add(path, result["records"] / seconds)
        report.metric("gateway CPU per run", "s").add(path, cpu)
        report.metric("helper process CPU per run", "s").add(path, helper)
        report.metric("broker CPU per run", "s").add(path, broker_cpu)
        report.metric("client CPU per run", "s").add(path, result["cpu"])
        # every process of the machine while the client consumed: ours, and other work on the same cores
        report.metric("machine busy (all processes)", "cores").add(path, result["machine_busy"])
    return f"{label}: {scanned / seconds:,.0f} input rec/s ({result['records']:,} delivered in {seconds:.2f}s)"


@scenario(
    "topicview-throughput",
    "consume through a topic view (WHERE on 2 fields, 3-field projection) vs passthrough, same gateway",
    size=200,
    records=1_000_000,
    payload="json",
)
def topicview_throughput(opts: Options, name: str) -> Report:
    report = Report(
        name,
        {"size": opts.size, "records": opts.records, "repeats": opts.repeats, "payload": opts.payload, "view": VIEW},
    )
    report.notes.append("direct column = passthrough: the input topic consumed through the gateway")
    report.notes.append("gateway column = the topic view consumed through the same gateway")
    report.notes.append("ratio = view / passthrough; rates count input records scanned per second")
    expected = _kept(opts.size, opts.payload, opts.records)
    with stack_for(opts, None, ENV) as stack:
        direct = stack.bootstrap("direct")
        topic = create_topic(direct, 1, "view-input")
        produced = run_worker(
            "produce", bootstrap=direct, topic=topic, size=opts.size, records=opts.records, payload=opts.payload
        )
        log(f"  input: {opts.records:,} records produced in {produced['seconds']:.2f}s; the view keeps {expected:,}")
        _put_view(stack, topic)
        report.notes.append(f"statement: {STATEMENT.format(topic=topic)}; keeps {expected:,} of {opts.records:,}")
        if opts.warmup:
            log("  warm-up " + _consume(stack, topic, opts.records, opts.records, "passthrough", None))
            log("  warm-up " + _consume(stack, VIEW, expected, opts.records, "view", None))
        for i in range(opts.repeats):
            log(
                f"  run {i + 1}/{opts.repeats} "
                + _consume(stack, topic, opts.records, opts.records, "passthrough", report)
            )
            log(f"  run {i + 1}/{opts.repeats} " + _consume(stack, VIEW, expected, opts.records, "view", report))
        stack.check_alive()
    return report
