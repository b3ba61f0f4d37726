"""``tenancy``: a client in a virtual cluster with ACLs on against a client of the passthrough cluster
without ACLs, through the same gateway build, same run.

    python bench/run.py tenancy --size 1024 --records 100000 --rate 2000 --seconds 5 --repeats 3

Paths, alternating (direct, passthrough, vcluster, then direct, vcluster, passthrough, ...):

- ``direct``: librdkafka -> Tansu, no credentials;
- ``passthrough``: -> Kanal (SASL_PLAINTEXT, GATEWAY_MANAGED) -> Tansu; the client logs in with SASL
  PLAIN as a LOCAL service account in no virtual cluster and a gateway token; no ACLs
  (GATEWAY_ACL_ENABLED unset), no virtual cluster on the gateway;
- ``vcluster``: the same gateway settings, plus a ``VirtualCluster`` ``bench.`` (``aclEnabled``,
  ``aclMode: REST_API``, ACLs allowing the client's principal everything it does) and the client's
  service account in it: every request goes through the ACL enforcer (outermost) and the renaming
  interceptor (innermost); the client's topic ``T`` is ``bench.T`` on the broker.

Every gateway run has a fresh gateway process, set up through the admin API (its service account,
and the virtual cluster, are deleted after each run, and each run checks that it starts with none).
Each run's topic is created, and deleted after, by the client itself with its credentials: on the
broker directly on the direct path, through the gateway on the others (in the virtual cluster that is
its logical name; the run checks that the broker holds ``bench.<topic>`` and not ``<topic>``).

Per gateway run, first the request cost: one-record Produce requests (``REQUEST_SIZE`` bytes, acks=1,
``--linger-ms`` 0) at ``--rate`` for ``--seconds`` after a 1 s warm-up, and the gateway's CPU
(user+system, ``/proc/PID/stat``) from the first record to the last ack divided by the Produce
requests librdkafka sent (as ``request-rate`` measures it); then throughput: ``--records`` records
of ``--size`` bytes produced as fast as librdkafka can, then consumed (as ``sasl-throughput``). The
direct path measures throughput only (it has no gateway). Rows ``, passthrough`` and ``, vcluster``
hold the gateway mode in the gateway column and the direct runs, where there are any, in the direct
column; ``vcluster / passthrough`` and ``vcluster - passthrough`` rows compare the two modes within
each repeat (medians of those).

``KANALBENCH_TENANCY_PATHS=vcluster`` (a comma-separated subset of the paths) runs only those paths.
``--py-spy FILE`` profiles the gateway of every gateway run (one py-spy per gateway process): FILE
holds all of them, ``FILE.passthrough`` and ``FILE.vcluster`` each path's (``python -m
kanalbench.profile FILE.vcluster``). Profiling slows the gateway: timings are not comparable then.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from kanal.embedded.admin_http import AdminHttp
from kanalbench.cpu import cpu_seconds
from kanalbench.measure import MB, Options, PhaseProfiler, log, stack_for
from kanalbench.report import Report
from kanalbench.runs import create_topic, delete_topic, run_worker
from kanalbench.scenarios import scenario
from kanalbench.stack import Stack

PATHS = ("direct", "passthrough", "vcluster")
MODES = ("passthrough", "vcluster")
PATHS_ENV = "KANALBENCH_TENANCY_PATHS"
USER = "bench-app"
VCLUSTER = "bench."
ADMIN_USERS = "[{username: admin, password: secret, admin: true}]"
#: Record size of the request-cost runs (one record per Produce request), as in ``request-rate``.
REQUEST_SIZE = 100
US = 1e6
#: What the client does in the virtual cluster, and no more: topics (create, describe, write, read,
#: delete), its consumer's group, and idempotent producers (librdkafka's default elsewhere).
ACLS = (
    {"resourcePattern": {"resourceType": "TOPIC", "name": "*", "patternType": "LITERAL"}, "operation": "ALL"},
    {"resourcePattern": {"resourceType": "GROUP", "name": "*", "patternType": "LITERAL"}, "operation": "ALL"},
    {
        "resourcePattern": {"resourceType": "CLUSTER", "name": "kafka-cluster", "patternType": "LITERAL"},
        "operation": "IDEMPOTENT_WRITE",
    },
)
#: Rows measured on every path (the direct runs in the direct column of both modes' rows).
THROUGHPUT = (("produce", "rec/s"), ("produce", "MB/s"), ("consume", "rec/s"), ("consume", "MB/s"))
#: Rows measured on the gateway paths only.
GATEWAY = (
    ("gateway CPU/request", "us"),
    ("broker CPU/request", "us"),
    ("latency p50", "ms"),
    ("latency p99", "ms"),
    ("achieved rate", "rec/s"),
    ("records per Produce request", "x"),
    ("other processes' load", "cores"),
    ("gateway CPU, produce", "s"),
    ("gateway CPU, consume", "s"),
)
#: Rows comparing the two modes within a repeat: (row, unit, source row, how).
COMPARED = (
    ("produce rec/s, vcluster / passthrough", "x", "produce rec/s", "ratio"),
    ("consume rec/s, vcluster / passthrough", "x", "consume rec/s", "ratio"),
    ("gateway CPU/request, vcluster - passthrough", "us", "gateway CPU/request us", "diff"),
    ("gateway CPU/request, vcluster / passthrough", "x", "gateway CPU/request us", "ratio"),
    ("latency p50, vcluster - passthrough", "ms", "latency p50 ms", "diff"),
)


def _paths() -> tuple[str, ...]:
    wanted = [p.strip() for p in os.environ.get(PATHS_ENV, "").split(",") if p.strip()]
    unknown = set(wanted) - set(PATHS)
    if unknown:
        raise SystemExit(f"{PATHS_ENV}: unknown path {sorted(unknown)[0]!r} (paths: {', '.join(PATHS)})")
    return tuple(p for p in PATHS if p in wanted) if wanted else PATHS


def _order(repeats: int, paths: tuple[str, ...]) -> list[tuple[int, str]]:
    """direct, passthrough, vcluster, then direct, vcluster, passthrough, ...: the two gateway modes
    take turns at running last, as a broker that slows down over a run would favour the earlier one."""
    turns = (PATHS, ("direct", "vcluster", "passthrough"))
    return [(i, p) for i in range(repeats) for p in turns[i % 2] if p in paths]


def _gateway_env(opts: Options, secret: str) -> dict[str, str]:
    return {
        **opts.env,
        "GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "GATEWAY_SECURITY_MODE": "GATEWAY_MANAGED",
        "GATEWAY_USER_POOL_SECRET_KEY": secret,
        "GATEWAY_ADMIN_API_USERS": ADMIN_USERS,
    }


def _expect(answer: tuple[int, Any], what: str, ok: tuple[int, ...] = (200,)) -> Any:
    status, body = answer
    if status not in ok:
        raise RuntimeError(f"{what} failed: HTTP {status} {body}")
    return body


def _login(admin: AdminHttp, vcluster: str | None) -> dict[str, Any]:
    """A LOCAL service account (in ``vcluster``, which must exist), and the client properties that
    log in as it with a gateway token."""
    metadata: dict[str, Any] = {"name": USER}
    token_request: dict[str, Any] = {"username": USER, "lifeTimeSeconds": 3600}
    if vcluster is not None:
        metadata["vCluster"] = vcluster
        token_request["vCluster"] = vcluster
    account = {"apiVersion": "gateway/v2", "kind": "GatewayServiceAccount", "metadata": metadata}
    _expect(admin.put("/gateway/v2/service-account", {**account, "spec": {"type": "LOCAL"}}), "the service account")
    token = _expect(admin.call("POST", "/gateway/v2/token", token_request), "minting a token")
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": USER,
        "sasl.password": token["token"],
    }


def _create_vcluster(admin: AdminHttp) -> None:
    acls = [{**acl, "principal": f"User:{USER}"} for acl in ACLS]
    manifest = {
        "apiVersion": "gateway/v2",
        "kind": "VirtualCluster",
        "metadata": {"name": VCLUSTER},
        "spec": {"aclEnabled": True, "aclMode": "REST_API", "acls": acls},
    }
    answer = _expect(admin.put("/gateway/v2/virtual-cluster", manifest), "creating the virtual cluster")
    status = answer.get("resource", {}).get("status", {}).get("status")
    if status not in (None, "Ready"):
        raise RuntimeError(f"the virtual cluster is not ready: {answer}")


def _clean_up(admin: AdminHttp, vcluster: str | None) -> None:
    """A run's service account and virtual cluster: they outlive the gateway process (in its state
    topic on the broker), and each path's gateway must start with none of the other path's."""
    _expect(
        admin.call("DELETE", f"/gateway/v2/service-account/{USER}", {"vCluster": vcluster} if vcluster else None),
        "deleting the service account",
        (200, 204, 404),
    )
    if vcluster is not None:
        _expect(admin.call("DELETE", f"/gateway/v2/virtual-cluster/{vcluster}"), "deleting the virtual cluster", (204,))


def _check_clean(admin: AdminHttp) -> None:
    """A fresh gateway has no virtual cluster nor service account yet (a failed clean-up would show)."""
    for kind in ("virtual-cluster", "service-account"):
        listed = _expect(admin.get(f"/gateway/v2/{kind}"), f"listing {kind}")
        if listed:
            raise RuntimeError(f"the gateway starts with resources of a previous run: {listed}")


@contextmanager
def _topic(stack: Stack, path: str, client: dict[str, Any], prefix: str, partitions: int) -> Iterator[str]:
    """A fresh topic, created and deleted by the client with its credentials on its path."""
    direct = stack.bootstrap("direct")
    bootstrap = stack.bootstrap("direct" if path == "direct" else "gateway")
    topic = create_topic(bootstrap, partitions, prefix, client)
    try:
        if path == "vcluster":
            _check_physical(direct, topic)
        yield topic
    finally:
        delete_topic(bootstrap, topic, client)


def _check_physical(direct: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient

    names = set(AdminClient({"bootstrap.servers": direct, "log_level": 4}).list_topics(timeout=10).topics)
    if f"{VCLUSTER}{topic}" not in names or topic in names:
        raise RuntimeError(f"the broker should hold {VCLUSTER}{topic} and not {topic}: {sorted(names)}")


def _request_cost(stack: Stack, path: str, opts: Options, client: dict[str, Any], seconds: float) -> dict[str, float]:
    pids = stack.pids()
    with _topic(stack, path, client, "tenancy-rr", opts.partitions) as topic:
        result: dict[str, Any] = run_worker(
            "latency",
            bootstrap=stack.bootstrap("gateway"),
            topic=topic,
            size=REQUEST_SIZE,
            rate=opts.rate,
            seconds=seconds,
            linger_ms=opts.linger_ms,
            pids=pids,
            client=client,
        )
    requests = result["produce_requests"]
    used = result["client_cpu"] + sum(result["cpu"].values())
    return {
        "gateway CPU/request us": result["cpu"]["gateway"] * US / requests,
        "broker CPU/request us": result["cpu"]["broker"] * US / requests,
        "latency p50 ms": result["p50_ms"],
        "latency p99 ms": result["p99_ms"],
        "achieved rate rec/s": result["achieved_rate"],
        "records per Produce request x": result["records_total"] / requests,
        "other processes' load cores": (result["machine_busy_cpu"] - used) / result["window_s"],
    }


def _throughput(stack: Stack, path: str, opts: Options, client: dict[str, Any], records: int) -> dict[str, float]:
    bootstrap = stack.bootstrap("direct" if path == "direct" else "gateway")
    gateway = stack.pids()["gateway"]
    with _topic(stack, path, client, "tenancy", opts.partitions) as topic:
        cpu0 = cpu_seconds(gateway)
        produced = run_worker(
            "produce",
            bootstrap=bootstrap,
            topic=topic,
            size=opts.size,
            records=records,
            payload=opts.payload,
            client=client,
        )
        cpu1 = cpu_seconds(gateway)
        consumed = run_worker(
            "consume", bootstrap=bootstrap, topic=topic, records=records, partitions=opts.partitions, client=client
        )
        cpu2 = cpu_seconds(gateway)
    row = {
        "produce rec/s": produced["records"] / produced["seconds"],
        "produce MB/s": produced["bytes"] / produced["seconds"] / MB,
        "consume rec/s": consumed["records"] / consumed["seconds"],
        "consume MB/s": consumed["bytes"] / consumed["seconds"] / MB,
    }
    if path != "direct":
        row.update({"gateway CPU, produce s": cpu1 - cpu0, "gateway CPU, consume s": cpu2 - cpu1})
    return row


def _run(
    stack: Stack, path: str, opts: Options, secret: str, records: int, seconds: float, profiler: PhaseProfiler
) -> dict[str, float]:
    """One run on ``path``: its figures by ``"<row> <unit>"`` (gateway rows absent on the direct path)."""
    if path == "direct":
        return _throughput(stack, path, opts, {}, records)
    stack.restart_gateway(_gateway_env(opts, secret))
    assert stack.gateway is not None
    admin = AdminHttp(stack.gateway.env["GATEWAY_HTTP_PORT"])
    vcluster = VCLUSTER if path == "vcluster" else None
    _check_clean(admin)
    try:
        if vcluster is not None:
            _create_vcluster(admin)
        client = _login(admin, vcluster)
        with profiler.record(stack.pids()["gateway"], path):
            row = _request_cost(stack, path, opts, client, seconds)
            row.update(_throughput(stack, path, opts, client, records))
    finally:
        _clean_up(admin, vcluster)
    stack.check_alive()
    return row


def _describe(row: dict[str, float]) -> str:
    text = (
        f"produce {row['produce rec/s']:,.0f} rec/s ({row['produce MB/s']:.1f} MB/s), "
        f"consume {row['consume rec/s']:,.0f} rec/s ({row['consume MB/s']:.1f} MB/s)"
    )
    if "gateway CPU/request us" in row:
        others = row["other processes' load cores"]
        text += (
            f"; at {row['achieved rate rec/s']:,.0f} req/s: gateway CPU/request {row['gateway CPU/request us']:.1f} us,"
            f" p50 {row['latency p50 ms']:.3f} ms, p99 {row['latency p99 ms']:.3f} ms,"
            f" other load {others:.2f} cores"
        )
    return text


def _compare(report: Report, rows: dict[str, dict[str, float]]) -> None:
    passthrough, vcluster = rows["passthrough"], rows["vcluster"]
    for metric, unit, source, how in COMPARED:
        a, b = passthrough[source], vcluster[source]
        if how == "diff":
            report.metric(metric, unit).add("gateway", b - a)
        elif a:
            report.metric(metric, unit).add("gateway", b / a)


@scenario(
    "tenancy",
    "a virtual cluster with ACLs vs the passthrough cluster without (both SASL PLAIN): throughput, CPU per request",
    size=1024,
    records=100_000,
    rate=2000.0,
    seconds=5.0,
    linger_ms=0.0,
    repeats=3,
)
def tenancy(opts: Options, name: str) -> Report:
    paths = _paths()
    secret = base64.b64encode(os.urandom(32)).decode()
    report = Report(
        name,
        {
            "size": opts.size,
            "records": opts.records,
            "rate": opts.rate,
            "seconds": opts.seconds,
            "request size": REQUEST_SIZE,
            "linger_ms": opts.linger_ms,
            "repeats": opts.repeats,
            "paths": ",".join(paths) if paths != PATHS else None,
        },
    )
    for metric, unit in THROUGHPUT + GATEWAY:  # the table's row order
        for mode in MODES:
            report.metric(f"{metric}, {mode}", unit)
    for metric, unit, _, _ in COMPARED:
        report.metric(metric, unit)
    profiler = PhaseProfiler(opts.py_spy, opts.log_dir, "tenancy")
    # py-spy follows each gateway process (PhaseProfiler), not only the first one as stack_for's would.
    with stack_for(replace(opts, py_spy=None), None, None) as stack:
        if opts.warmup:
            for path in paths:
                row = _run(stack, path, opts, secret, max(1000, opts.records // 10), min(2.0, opts.seconds), profiler)
                log(f"  warm-up {path}: " + _describe(row))
            profiler.files.clear()
        rows: dict[str, dict[str, float]] = {}
        for i, path in _order(opts.repeats, paths):
            rows = rows if len(rows) < len(paths) else {}  # a new repeat
            rows[path] = row = _run(stack, path, opts, secret, opts.records, opts.seconds, profiler)
            log(f"  run {i + 1}/{opts.repeats} {path}: " + _describe(row))
            for metric, unit in THROUGHPUT + GATEWAY:
                value = row.get(f"{metric} {unit}")
                if value is None:
                    continue
                for mode in MODES if path == "direct" else (path,):
                    report.metric(f"{metric}, {mode}", unit).add("direct" if path == "direct" else "gateway", value)
            if len(rows) == len(paths) and set(MODES) <= set(rows):  # the repeat's last run
                _compare(report, rows)
    profiler.merge()
    report.metrics = [m for m in report.metrics if m.direct or m.gateway]  # rows no path measured
    report.notes.append(
        "rows ', passthrough' / ', vcluster': gateway column = a client of the passthrough cluster, no ACLs /"
        f" a client of virtual cluster {VCLUSTER!r} with ACLs (REST_API), both SASL PLAIN with a gateway token;"
        " direct column = the direct runs (throughput only); a fresh gateway process per gateway run"
    )
    report.notes.append(
        "'vcluster / passthrough' and 'vcluster - passthrough' rows: within each repeat, medians in the gateway"
        " column (MB/s ratios equal the rec/s ones)"
    )
    report.notes.append(
        f"CPU/request: {REQUEST_SIZE} B records, acks=1, linger.ms {opts.linger_ms:g}, at --rate; the process's"
        " CPU from the first record to the last ack / Produce requests librdkafka sent"
    )
    report.notes.append(
        "topics are created and deleted by the client with its credentials: through the gateway on the gateway"
        f" paths (in the virtual cluster a logical name; the broker holds {VCLUSTER}<topic>)"
    )
    return report
