"""``sasl-throughput``: passthrough throughput of clients that authenticated (SASL PLAIN with a gateway
token) against clients of a PLAINTEXT listener, through the same gateway build, same run.

    python bench/run.py sasl-throughput --size 1024 --records 200000 --repeats 5

Paths, alternating (direct, plaintext, sasl, then direct, sasl, plaintext, ...): ``direct`` (librdkafka -> Tansu),
``plaintext`` (-> Kanal with GATEWAY_SECURITY_PROTOCOL=PLAINTEXT -> Tansu) and ``sasl`` (-> Kanal
with SASL_PLAINTEXT, GATEWAY_MANAGED: the client logs in with a LOCAL service account's name and a
gateway token, then produces and consumes as the other paths do). A listener has one protocol, so
each gateway path runs on a fresh gateway process of the same build. Rows ``, plaintext`` and
``, sasl`` have the gateway mode in the gateway column and the direct runs in the direct column; the
``sasl / plaintext`` rows compare the two modes within each repeat (medians of those): authentication
costs nothing after the handshake when they are 1.
"""

from __future__ import annotations

import base64
import os
from typing import Any

from kanal.embedded.admin_http import AdminHttp
from kanalbench.measure import MB, Options, log, stack_for
from kanalbench.report import Report
from kanalbench.runs import create_topic, delete_topic, run_worker
from kanalbench.scenarios import scenario
from kanalbench.stack import Stack

PATHS = ("direct", "plaintext", "sasl")
MODES = ("plaintext", "sasl")
USER = "bench-app"
ADMIN_USERS = "[{username: admin, password: secret, admin: true}]"
ROWS = (("produce", "rec/s"), ("produce", "MB/s"), ("consume", "rec/s"), ("consume", "MB/s"))


def _gateway_env(opts: Options, path: str, secret: str) -> dict[str, str]:
    if path == "plaintext":
        return dict(opts.env)
    return {
        **opts.env,
        "GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "GATEWAY_USER_POOL_SECRET_KEY": secret,
        "GATEWAY_ADMIN_API_USERS": ADMIN_USERS,
    }


def _login(stack: Stack) -> dict[str, Any]:
    """A LOCAL service account on the SASL gateway, and the client properties that log in as it."""
    assert stack.gateway is not None
    admin = AdminHttp(stack.gateway.env["GATEWAY_HTTP_PORT"])
    account = {"apiVersion": "gateway/v2", "kind": "GatewayServiceAccount", "metadata": {"name": USER}}
    status, answer = admin.put("/gateway/v2/service-account", {**account, "spec": {"type": "LOCAL"}})
    if status != 200:
        raise RuntimeError(f"creating the service account failed: {status} {answer}")
    status, answer = admin.call("POST", "/gateway/v2/token", {"username": USER, "lifeTimeSeconds": 3600})
    if status != 200:
        raise RuntimeError(f"minting a token failed: {status} {answer}")
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": USER,
        "sasl.password": answer["token"],
    }


def _run(stack: Stack, path: str, opts: Options, secret: str, records: int) -> dict[str, float]:
    client: dict[str, Any] = {}
    if path != "direct":
        stack.restart_gateway(_gateway_env(opts, path, secret))
        if path == "sasl":
            client = _login(stack)
    direct = stack.bootstrap("direct")
    bootstrap = stack.bootstrap("direct" if path == "direct" else "gateway")
    topic = create_topic(direct, opts.partitions, "sasl")
    try:
        produced = run_worker(
            "produce", bootstrap=bootstrap, topic=topic, size=opts.size, records=records, client=client
        )
        consumed = run_worker("consume", bootstrap=bootstrap, topic=topic, records=records, client=client)
    finally:
        delete_topic(direct, topic)
    stack.check_alive()
    return {
        "produce rec/s": produced["records"] / produced["seconds"],
        "produce MB/s": produced["bytes"] / produced["seconds"] / MB,
        "consume rec/s": consumed["records"] / consumed["seconds"],
        "consume MB/s": consumed["bytes"] / consumed["seconds"] / MB,
    }


def _order(repeats: int) -> list[tuple[int, str]]:
    """direct, plaintext, sasl, then direct, sasl, plaintext, ...: the two gateway modes take turns
    at running last, as a broker that slows down over a run would favour the earlier one."""
    return [(i, p) for i in range(repeats) for p in (PATHS if i % 2 == 0 else ("direct", "sasl", "plaintext"))]


@scenario(
    "sasl-throughput",
    "produce then consume N records: direct, gateway PLAINTEXT, gateway SASL_PLAINTEXT (PLAIN, gateway token)",
    size=1024,
    records=200_000,
)
def sasl_throughput(opts: Options, name: str) -> Report:
    secret = base64.b64encode(os.urandom(32)).decode()
    report = Report(
        name,
        {"size": opts.size, "records": opts.records, "repeats": opts.repeats, "partitions": opts.partitions},
    )
    for metric, unit in ROWS:  # the table's row order
        for mode in MODES:
            report.metric(f"{metric}, {mode}", unit)
    for metric, _ in ROWS[::2]:
        report.metric(f"{metric}, sasl / plaintext", "x")
    with stack_for(opts, None, None) as stack:
        if opts.warmup:
            for path in PATHS:
                _run(stack, path, opts, secret, max(1000, opts.records // 10))
        rows: dict[str, dict[str, float]] = {}
        for i, path in _order(opts.repeats):
            if path == "direct":
                rows = {}
            rows[path] = row = _run(stack, path, opts, secret, opts.records)
            log(f"  run {i + 1}/{opts.repeats} {path}: " + ", ".join(f"{k} {v:,.1f}" for k, v in row.items()))
            for metric, unit in ROWS:
                for mode in MODES if path == "direct" else (path,):
                    column = "direct" if path == "direct" else "gateway"
                    report.metric(f"{metric}, {mode}", unit).add(column, row[f"{metric} {unit}"])
            if "plaintext" in rows and "sasl" in rows and len(rows) == len(PATHS):
                for metric, unit in ROWS[::2]:
                    ratio = rows["sasl"][f"{metric} {unit}"] / rows["plaintext"][f"{metric} {unit}"]
                    report.metric(f"{metric}, sasl / plaintext", "x").add("gateway", ratio)
    report.notes.append(
        "rows ', plaintext' / ', sasl': gateway column = the gateway with a PLAINTEXT / SASL_PLAINTEXT listener"
        " (PLAIN, gateway token), direct column = the direct runs; 'sasl / plaintext' rows: within each repeat,"
        " medians in the gateway column"
    )
    return report
