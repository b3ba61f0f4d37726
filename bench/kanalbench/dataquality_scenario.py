"""``dataquality-throughput``: producing through data-quality policies against plain passthrough, in one run.

One broker, one gateway (admin API on, the ``data-quality`` plugin loaded through its entry point). A
DataQualityPolicy with **mark** enabled targets every topic whose name starts with ``bench-dq-``; it holds
a 3-clause CEL rule and a JSON schema rule that every record passes (the common case: records are
decoded and evaluated, none is changed)::

    value.amount >= 0 && value.name.startsWith('user-') && size(value.pad) < 1000
    {"type": "object", "required": ["id", "name", "amount"], "properties": {...}}

Then, alternating, the same librdkafka producer (the harness's throughput settings) writes ``--records``
JSON records of ``--size`` bytes through the gateway to a fresh plain topic (*passthrough*, the
``direct`` column) and to a fresh ``bench-dq-`` topic (*data quality*, the ``gateway`` column): the ratio is
data quality / passthrough, same gateway, same run. ``--violations N`` makes one record in N break
the CEL rule (marked, reported), to see the cost of marking.

    python bench/run.py dataquality-throughput --size 200 --records 500000 --repeats 5
"""

from __future__ import annotations

import base64
import json
import shutil
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from kanalbench.cpu import children_cpu_seconds, cpu_seconds
from kanalbench.measure import MB, Options, log, stack_for
from kanalbench.report import Report
from kanalbench.runs import create_topic, delete_topic, run_worker
from kanalbench.scenarios import scenario
from kanalbench.stack import Stack

USER, PASSWORD = "bench", "bench-password"
POLICY = "bench-quality"
CEL = "value.amount >= 0 && value.name.startsWith('user-') && size(value.pad) < 1000"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["id", "name", "amount"],
    "properties": {
        "id": {"type": "integer", "minimum": 0},
        "name": {"type": "string", "minLength": 1},
        "amount": {"type": "integer", "minimum": 0, "maximum": 1_000_000},
        "pad": {"type": "string"},
    },
}


def _plugin_path() -> str:
    """A ``.dist-info`` declaring the plugin's entry point, for a checkout not reinstalled since it was added."""
    root = Path(tempfile.mkdtemp(prefix="kanalbench-dq-"))
    info = root / "kanal_dataquality_bench-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kanal-dataquality-bench\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text("[kanal.plugins]\ndata-quality = kanal_dataquality.plugin\n")
    return str(root)


def _put(stack: Stack, path: str, manifest: dict[str, Any]) -> dict[str, Any]:
    assert stack.gateway is not None
    port = stack.gateway.env["GATEWAY_HTTP_PORT"]
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/gateway/v2/{path}", data=json.dumps(manifest).encode(), method="PUT"
    )
    request.add_header("Content-Type", "application/json")
    request.add_header("Authorization", "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode())
    with urllib.request.urlopen(request, timeout=30) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def _configure(stack: Stack) -> None:
    rules = [
        {"type": "Cel", "displayName": "Order fields", "celExpression": CEL},
        {"type": "JsonSchema", "displayName": "Order schema", "schema": SCHEMA},
    ]
    for name, spec in zip(("bench-cel", "bench-schema"), rules, strict=True):
        _put(
            stack,
            "data-quality-rule",
            {"apiVersion": "v1", "kind": "DataQualityRule", "metadata": {"name": name}, "spec": spec},
        )
    answer = _put(
        stack,
        "data-quality-policy",
        {
            "apiVersion": "v1",
            "kind": "DataQualityPolicy",
            "metadata": {"name": POLICY, "group": "bench"},
            "spec": {
                "displayName": "Bench",
                "rules": ["bench-cel", "bench-schema"],
                "targets": [{"cluster": "kanalbench", "topic": "bench-dq-*"}],
                "actions": {"mark": {"enabled": True}},
            },
        },
    )
    status = answer["resource"].get("status", {}).get("status")
    if status != "Ready":
        raise RuntimeError(f"the policy is not ready: {answer}")


def _produce(stack: Stack, opts: Options, label: str, report: Report | None) -> str:
    direct = stack.bootstrap("direct")
    topic = create_topic(direct, opts.partitions, "dq" if label == "data quality" else "plain")
    pids = stack.pids()
    pid, broker = pids["gateway"], pids["broker"]
    try:
        cpu0, helper0, broker0 = cpu_seconds(pid), children_cpu_seconds(pid), cpu_seconds(broker)
        result = run_worker(
            "produce",
            bootstrap=stack.bootstrap("gateway"),
            topic=topic,
            size=opts.size,
            records=opts.records,
            payload="json",
        )
        cpu = cpu_seconds(pid) - cpu0
        helper = children_cpu_seconds(pid) - helper0
        broker_cpu = cpu_seconds(broker) - broker0
    finally:
        delete_topic(direct, topic)
    seconds = result["seconds"]
    path = "direct" if label == "passthrough" else "gateway"
    if report is not None:
        report.metric("produce", "rec/s").add(path, result["records"] / seconds)
        report.metric("produce", "MB/s").add(path, result["bytes"] / seconds / MB)
        report.metric("gateway CPU per run", "s").add(path, cpu)
        report.metric("helper process CPU per run", "s").add(path, helper)
        report.metric("broker CPU per run", "s").add(path, broker_cpu)
    return (
        f"{label}: {result['records'] / seconds:,.0f} rec/s in {seconds:.2f}s "
        f"(CPU: gateway {cpu:.2f}s, helper {helper:.2f}s, broker {broker_cpu:.2f}s)"
    )


@scenario(
    "dataquality-throughput",
    "produce through a data-quality policy (3-clause CEL + JSON schema, mark on) vs passthrough, same gateway",
    size=200,
    records=500_000,
    payload="json",
)
def dataquality_throughput(opts: Options, name: str) -> Report:
    report = Report(name, {"size": opts.size, "records": opts.records, "repeats": opts.repeats, "policy": POLICY})
    report.notes.append("direct column = passthrough: a plain topic produced to through the gateway")
    report.notes.append("gateway column = a bench-dq- topic of the same gateway (policy: CEL + JSON schema, mark on)")
    report.notes.append("ratio = data quality / passthrough")
    plugin_path = _plugin_path()
    env = {
        "GATEWAY_ADMIN_API_USERS": json.dumps([{"username": USER, "password": PASSWORD, "admin": True}]),
        "GATEWAY_CLUSTER_ID": "kanalbench",
        "PYTHONPATH": plugin_path,
    }
    try:
        return _measure(opts, report, env)
    finally:
        shutil.rmtree(plugin_path, ignore_errors=True)


def _measure(opts: Options, report: Report, env: dict[str, str]) -> Report:
    with stack_for(opts, None, env) as stack:
        _configure(stack)
        if opts.warmup:
            warm = Options(**{**opts.__dict__, "records": max(1000, opts.records // 10)})
            log("  warm-up " + _produce(stack, warm, "passthrough", None))
            log("  warm-up " + _produce(stack, warm, "data quality", None))
        for i in range(opts.repeats):
            log(f"  run {i + 1}/{opts.repeats} " + _produce(stack, opts, "passthrough", report))
            log(f"  run {i + 1}/{opts.repeats} " + _produce(stack, opts, "data quality", report))
        stack.check_alive()
        evaluated = _evaluated(stack)
        expected = opts.repeats * opts.records + (max(1000, opts.records // 10) if opts.warmup else 0)
        if evaluated != expected:
            raise RuntimeError(f"the policy evaluated {evaluated:,} records, expected {expected:,}")
        report.notes.append(f"the policy evaluated {evaluated:,} records (Prometheus counter), as expected")
        hook = _hook_seconds(stack)
        if hook is not None:  # with --gateway-env GATEWAY_FEATURE_FLAGS_LIFECYCLE_METRICS=true
            report.notes.append(f"time in the data-quality hook: {hook / evaluated * 1e6:.2f} us per record")
    return report


def _hook_seconds(stack: Stack) -> float | None:
    """Seconds spent in the data-quality produce hook (lifecycle metrics), or None when they are off."""
    total = None
    for line in _metrics_text(stack).splitlines():
        if line.startswith("gateway_request_lifecycle_seconds_sum") and 'interceptor="data-quality"' in line:
            total = (total or 0.0) + float(line.split()[-1])
    return total


def _metrics_text(stack: Stack) -> str:
    assert stack.gateway is not None
    port = stack.gateway.env["GATEWAY_HTTP_PORT"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text: str = response.read().decode()
    return text


def _evaluated(stack: Stack) -> int:
    """The policy's evaluated-records counter, from the gateway's /metrics."""
    text = _metrics_text(stack)
    wanted = f'gateway_data_quality_messages_evaluated_total{{policy="{POLICY}"}}'
    for line in text.splitlines():
        if line.startswith(wanted):
            return int(float(line.split()[-1]))
    return 0
