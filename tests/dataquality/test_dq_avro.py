"""EnforceAvro and Avro payloads, against the test schema registry (kanal_registry_proxy.testing).

Through a gateway process: schema ids in a payload prefix and in ``__value_schema_id`` headers, unknown
ids, a JSON-schema id, Avro values converted to JSON for CEL, and an unreachable registry (a violation
with that reason, never a pass). GUID headers are checked against a stub registry that serves
``/schemas/guids/{guid}`` (the test registry, like Karapace, has no GUIDs).
"""

from __future__ import annotations

import http.server
import io
import json
import struct
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import fastavro
import pytest
import trio
from kanal_dataquality.avro import SchemaRegistry
from kanal_dataquality.evaluate import evaluate, schema_refs
from kanal_dataquality.policies import build_plan, compile_policy
from kanal_dataquality.rules import compile_rule, enforce_avro
from test_dq_gateway import Http, cel_rule, consume_direct, create_topic, headers_of, unique, wait_for

from kanal.api import Record
from kanal.embedded import GatewayProcess, TansuBroker

pytestmark = pytest.mark.integration

MARK = "vendor.dataquality.violations"
ORDER = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "amount", "type": "double"},
        {"name": "currency", "type": "string"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}


def avro_body(value: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(ORDER), value)
    return out.getvalue()


def register(url: str, subject: str, schema: Any, schema_type: str = "AVRO") -> int:
    body = json.dumps({"schema": json.dumps(schema), "schemaType": schema_type}).encode()
    request = urllib.request.Request(f"{url}/subjects/{subject}/versions", data=body, method="POST")
    request.add_header("Content-Type", "application/vnd.schemaregistry.v1+json")
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(json.loads(response.read())["id"])


@pytest.fixture(scope="module")
def registry() -> Iterator[Any]:
    testing = pytest.importorskip("kanal_registry_proxy.testing")
    server = testing.TestRegistry().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def avro_gateway(
    tansu: TansuBroker, registry: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GatewayProcess, Http, str]]:
    root = tmp_path_factory.mktemp("dq-avro-plugin")
    info = root / "kanal_dataquality_test-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kanal-dataquality-test\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text("[kanal.plugins]\ndata-quality = kanal_dataquality.plugin\n")
    cluster = f"dq-avro-{uuid.uuid4().hex[:8]}"
    env = {
        **tansu.gateway_settings(),
        "GATEWAY_ADMIN_API_USERS": "[{username: admin, password: secret, admin: true}]",
        "GATEWAY_CLUSTER_ID": cluster,
        "DATA_QUALITY_SCHEMA_REGISTRY_URL": registry.url,
        "DATA_QUALITY_SCHEMA_REGISTRY_TIMEOUT": "1s",
        "DATA_QUALITY_SCHEMA_REGISTRY_NEGATIVE_TTL": "1s",
        "PYTHONPATH": str(root),
    }
    process = GatewayProcess(env, log_path=root / "gateway.log").start(timeout=30)
    try:
        yield process, Http(env["GATEWAY_HTTP_PORT"]), cluster
    finally:
        code = process.stop(timeout=15)
        assert code == 0, process.tail()


def produce(bootstrap: str, topic: str, items: list[tuple[bytes, list[tuple[str, bytes]]]]) -> None:
    from confluent_kafka import Producer

    errors: list[Any] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "enable.idempotence": False})
    for value, headers in items:
        producer.produce(topic, value=value, headers=headers, on_delivery=lambda err, _m: errors.append(err))
    assert producer.flush(20) == 0
    assert errors == [None] * len(items), errors


def test_enforce_avro_and_avro_values_through_the_gateway(
    avro_gateway: tuple[GatewayProcess, Http, str], registry: Any, tansu: TansuBroker
) -> None:
    gateway, http, cluster = avro_gateway
    avro_id = register(registry.url, unique("orders-value"), ORDER)
    json_id = register(registry.url, unique("other-value"), {"type": "object"}, "JSON")
    topic = create_topic(tansu, unique("dq-avro"))
    name = unique("avro")
    for manifest in (
        cel_rule(f"{name}-positive", "value.amount > 0 && value.ts > 0"),
        {
            "apiVersion": "v1",
            "kind": "DataQualityPolicy",
            "metadata": {"name": name, "group": "g"},
            "spec": {
                "displayName": name,
                "rules": ["EnforceAvro", f"{name}-positive"],
                "targets": [{"cluster": cluster, "topic": topic}],
                "actions": {"mark": {"enabled": True}},
            },
        },
    ):
        path = "data-quality-rule" if manifest["kind"] == "DataQualityRule" else "data-quality-policy"
        status, answer = http.put(f"/gateway/v2/{path}", manifest)
        assert status == 200, answer

    prefix = struct.pack(">bI", 0, avro_id)
    good = avro_body({"amount": 5.0, "currency": "EUR", "ts": 1_700_000_000_000})
    negative = avro_body({"amount": -1.0, "currency": "EUR", "ts": 1})
    items = [
        (prefix + good, []),  # 0: prefix id, passes both rules
        (prefix + negative, []),  # 1: the Avro value converted to JSON fails the CEL rule
        (good, [("__value_schema_id", struct.pack(">bI", 0, avro_id))]),  # 2: header id, passes
        (b'{"amount": 5, "ts": 1}', []),  # 3: no schema id
        (struct.pack(">bI", 0, 999_999) + good, []),  # 4: unknown id
        (struct.pack(">bI", 0, json_id) + b'{"amount": 5, "ts": 1}', []),  # 5: a JSON schema, not Avro
        (good, [("__value_schema_id", b"\x01" + uuid.uuid4().bytes)]),  # 6: a GUID this registry does not know
    ]
    produce(gateway.bootstrap, topic, items)
    received = consume_direct(tansu, topic, len(items))
    marks = [json.loads(headers_of(m)[MARK]).get(name) if MARK in headers_of(m) else None for m in received]
    assert marks == [
        None,
        [f"{name}-positive"],
        None,
        ["EnforceAvro"],  # the JSON value itself passes the CEL rule
        ["EnforceAvro", f"{name}-positive"],  # an Avro body that cannot be decoded: CEL cannot read it
        ["EnforceAvro"],
        ["EnforceAvro", f"{name}-positive"],
    ]
    entries = wait_for(
        lambda: (
            (e := http.get(f"/gateway/v2/data-quality/policies/{name}/violations?range=30m")[1]) and len(e) == 5 and e
        )
    )
    reasons = {d.get("reason", "") for e in entries for d in e["details"] if d["rule"] == "EnforceAvro"}
    assert any("no schema id" in r for r in reasons)
    assert any("999999 is not in the schema registry" in r for r in reasons)
    assert any(f"schema id {json_id} is a JSON schema, not AVRO" in r for r in reasons)

    # the registry goes away: ids not cached are violations with that reason, never passes
    registry.stop()
    try:
        produce(gateway.bootstrap, topic, [(struct.pack(">bI", 0, avro_id + 1000) + good, [])])
        last = consume_direct(tansu, topic, len(items) + 1)[-1]
        assert json.loads(headers_of(last)[MARK])[name][0] == "EnforceAvro"
        entry = wait_for(
            lambda: next(
                (
                    e
                    for e in http.get(f"/gateway/v2/data-quality/policies/{name}/violations?range=30m")[1]
                    if any("unreachable" in d.get("reason", "") for d in e["details"])
                ),
                None,
            )
        )
        assert entry["rules"][0] == "EnforceAvro"
    finally:
        registry.stop()


class StubRegistry:
    """Serves one Avro schema by id and by GUID, counting calls."""

    def __init__(self, schema_id: int, guid: str) -> None:
        calls: list[str] = []
        self.calls = calls
        document = json.dumps({"schema": json.dumps(ORDER)}).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                calls.append(self.path)
                if self.path in (f"/schemas/ids/{schema_id}", f"/schemas/guids/{guid}"):
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(document)))
                    self.end_headers()
                    self.wfile.write(document)
                else:
                    body = b'{"error_code": 40403, "message": "Schema not found"}'
                    self.send_response(404)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_guid_headers_cache_and_negative_cache() -> None:
    guid = str(uuid.uuid4())
    stub = StubRegistry(7, guid)
    try:
        clock = [0.0]
        registry = SchemaRegistry(stub.url, negative_ttl=5.0, clock=lambda: clock[0])
        rules = {
            "EnforceAvro": enforce_avro(),
            "pos": compile_rule("pos", {"type": "Cel", "celExpression": "value.amount > 0"}),
        }
        policy = compile_policy(
            {
                "metadata": {"name": "p", "group": "g"},
                "spec": {"rules": ["EnforceAvro", "pos"], "targets": [{"cluster": "gateway", "topic": "t"}]},
            },
            rules,
            frozenset(),
        )
        plan = build_plan([policy])
        good = avro_body({"amount": 1.0, "currency": "EUR", "ts": 5})
        records = [
            Record(value=good, headers=[("__value_schema_id", b"\x01" + uuid.UUID(guid).bytes)]),  # 17-byte GUID form
            Record(value=good, headers=[("__value_schema_id", uuid.UUID(guid).bytes)]),  # bare 16-byte GUID
            Record(value=good, headers=[("__value_schema_id", guid.encode())]),  # GUID as text
            Record(value=b"\x00\x00\x00\x00\x07" + good),  # prefix id
            Record(value=b"\x00\x00\x00\x00\x08" + good),  # unknown id
        ]
        refs = schema_refs(plan, records, False)
        trio.run(registry.resolve, {r[0][0] for r in refs})
        result = evaluate(plan, records, registry, refs)
        assert [(v.index, v.rules) for v in result.violations] == [(4, (0, 1))]
        assert sorted(stub.calls) == sorted([f"/schemas/guids/{guid}", "/schemas/ids/7", "/schemas/ids/8"])
        # cached: no new calls; the unknown id is asked again only after the negative TTL
        trio.run(registry.resolve, registry.missing({guid, 7, 8}))
        assert len(stub.calls) == 3
        clock[0] = 6.0
        trio.run(registry.resolve, registry.missing({guid, 7, 8}))
        assert stub.calls[-1] == "/schemas/ids/8" and len(stub.calls) == 4
    finally:
        stub.close()


def test_unreachable_registry_is_a_violation() -> None:
    registry = SchemaRegistry("http://127.0.0.1:1", timeout=1.0)
    plan = build_plan(
        [
            compile_policy(
                {
                    "metadata": {"name": "p"},
                    "spec": {"rules": ["EnforceAvro"], "targets": [{"cluster": "g", "topic": "t"}]},
                },
                {"EnforceAvro": enforce_avro()},
                frozenset(),
            )
        ]
    )
    records = [Record(value=b"\x00\x00\x00\x00\x01" + b"body")]
    refs = schema_refs(plan, records, False)
    started = time.monotonic()
    trio.run(registry.resolve, {1})
    assert time.monotonic() - started < 5
    result = evaluate(plan, records, registry, refs)
    assert result.violations and "schema registry unreachable" in (result.violations[0].outcomes[0].error or "")
