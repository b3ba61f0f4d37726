"""The data-quality engine without a network: manifests, plans, the record loop, actions, history, alerts,
and the plugin's wiring (its runtime in ``services.shared``, the interceptor it installs).

Record sets are built with the gateway's own codec (``encode_batch``), hooks are called the way the
core calls them (the config validated first), and what would be forwarded is parsed back. Services are
a small stub here (``kanal.testing`` had no ``FakeServices`` yet when this was written).
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any, cast

import orjson
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from kanal_dataquality.actions import MARK_HEADER
from kanal_dataquality.alerts import Alerts
from kanal_dataquality.avro import header_ref, prefix_ref, to_json
from kanal_dataquality.batches import scan_batches
from kanal_dataquality.evaluate import decode_key, decode_value, evaluate
from kanal_dataquality.history import History, Reporter
from kanal_dataquality.interceptor import DataQualityInterceptor
from kanal_dataquality.metrics import DataQualityMetrics
from kanal_dataquality.policies import build_plan, compile_policy, order_policies
from kanal_dataquality.resources import Checks, canonical_alert, canonical_policy, canonical_rule, resource_kinds
from kanal_dataquality.runtime import RUNTIME, Runtime
from kanal_dataquality.settings import Settings, load_settings

from kanal.api import (
    GZIP,
    LZ4,
    NONE,
    SNAPPY,
    ZSTD,
    Connection,
    GatewayServices,
    InterceptorConfigError,
    InterceptorSpec,
    PartitionError,
    Record,
    RecordsContext,
    RecordSet,
    ResourceError,
    encode_batch,
)
from kanal.api.interceptor import validate_config
from kanal.testing import FakeServices

CONNECTION = Connection(id=1, client_address="10.0.0.1:5000", listener_address="127.0.0.1:9092", node_id=111)


def rule(name: str, expression: str, message: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"type": "Cel", "displayName": name, "celExpression": expression}
    if message:
        spec["message"] = message
    return {"apiVersion": "v1", "kind": "DataQualityRule", "metadata": {"name": name}, "spec": spec}


def schema(name: str, document: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "DataQualityRule",
        "metadata": {"name": name},
        "spec": {"type": "JsonSchema", "displayName": name, "schema": document},
    }


def policy(
    name: str, rules: list[str], *, block: bool = False, mark: bool = False, topic: str = "orders"
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "DataQualityPolicy",
        "metadata": {"name": name, "group": "g"},
        "spec": {
            "displayName": name,
            "rules": rules,
            "targets": [{"cluster": "gateway", "topic": topic}],
            "actions": {"block": {"enabled": block}, "mark": {"enabled": mark}},
        },
    }


RULES = [
    rule("positive", "value.amount > 0"),
    rule("euro", "value.currency == 'EUR'", message="only euros"),
    rule("web", "headers['x-source'] == 'web'"),
    rule("keyed", "key.startsWith('order-')"),
    schema("shape", {"type": "object", "required": ["amount", "currency"]}),
]


def fake_services(env: Mapping[str, str] | None = None, cluster_id: str = "gateway") -> FakeServices:
    """The gateway as the plugin sees it, without a network (kanal.testing)."""
    return FakeServices(settings=env, cluster_id=cluster_id)


def make_interceptor(config: dict[str, Any], services: FakeServices | None = None) -> DataQualityInterceptor:
    """As the core makes one: the config validated against the type's, then the constructor."""
    validated = validate_config(DataQualityInterceptor, config)
    return DataQualityInterceptor(validated, cast(GatewayServices, services or fake_services()))


def interceptor(*policies: dict[str, Any]) -> DataQualityInterceptor:
    return make_interceptor({"rules": RULES, "policies": list(policies)})


def produce(
    ic: DataQualityInterceptor, values: list[Any], *, topic: str = "orders", codec: int = NONE, **kw: Any
) -> tuple[Any, list[Record]]:
    records = [
        Record(
            offset_delta=i,
            key=kw.get("key", b"order-1"),
            value=v if isinstance(v, bytes | type(None)) else orjson.dumps(v),
            headers=list(kw.get("headers", [("x-source", b"web")])),
        )
        for i, v in enumerate(values)
    ]
    data = encode_batch(records, base_timestamp=1_700_000_000_000, compression=codec)
    ctx = RecordsContext(CONNECTION, 0, 9, "client-1", topic, 0, RecordSet.parse(data))
    result = ic.kanal_produce_records(ctx)
    forwarded = RecordSet.parse(ctx.records.to_bytes())
    return result, [r for _, r in forwarded]


GOOD = {"amount": 5, "currency": "EUR"}
NEGATIVE = {"amount": -1, "currency": "EUR"}
DOLLARS = {"amount": 2, "currency": "USD"}


# -- manifests ---------------------------------------------------------------------------------------


class State:
    def __init__(self, **kinds: list[dict[str, Any]]) -> None:
        self.kinds = kinds

    def resources(self, kind: str) -> list[dict[str, Any]]:
        return self.kinds.get(kind, [])


KINDS = {k.kind: k for k in resource_kinds(lambda: Checks("gateway", frozenset({"legacy"})), lambda *a: None)}
STATE = State(DataQualityRule=[canonical_rule(r, KINDS["DataQualityRule"]) for r in RULES])
CHECKS = Checks("gateway", frozenset({"legacy"}))


def refused(make: Any, why: str) -> None:
    with pytest.raises(ResourceError) as raised:
        make()
    assert raised.value.status == 400 and why in raised.value.msg, raised.value.msg


def test_rule_manifests() -> None:
    kind = KINDS["DataQualityRule"]
    canonical = canonical_rule(
        {**rule("r", "value.a > 1"), "spec": {**rule("r", "x")["spec"], "type": "CEL", "celExpression": "value.a > 1"}},
        kind,
    )
    assert canonical["apiVersion"] == "v1" and canonical["spec"]["type"] == "Cel"
    assert canonical_rule({**schema("s", '{"type": "object"}')}, kind)["spec"]["schema"] == {"type": "object"}
    refused(lambda: canonical_rule(rule("bad", "value.a >"), kind), "invalid CEL expression")
    refused(lambda: canonical_rule(schema("bad", {"type": 3}), kind), "invalid JSON schema")
    refused(lambda: canonical_rule(schema("bad", "{not json"), kind), "invalid JSON schema")
    refused(lambda: canonical_rule({**rule("r", "true"), "apiVersion": "gateway/v2"}, kind), "apiVersion must be v1")
    refused(lambda: canonical_rule(rule("EnforceAvro", "true"), kind), "built-in")
    no_name = rule("r", "true")
    del no_name["spec"]["displayName"]
    refused(lambda: canonical_rule(no_name, kind), "displayName is required")
    refused(
        lambda: canonical_rule({**rule("r", "true"), "spec": {"type": "Sql", "displayName": "x"}}, kind),
        "Cel or JsonSchema",
    )


def test_policy_manifests() -> None:
    kind = KINDS["DataQualityPolicy"]
    ok = policy("p", ["positive"])

    def spec(**changes: Any) -> dict[str, Any]:
        return {**ok, "spec": {**ok["spec"], **changes}}

    canonical = canonical_policy(spec(targets=[{"cluster": "gateway", "topic": "orders-*"}]), kind, STATE, CHECKS)
    assert canonical["spec"]["targets"] == [{"cluster": "gateway", "topic": "orders-", "patternType": "PREFIXED"}]
    assert canonical["spec"]["actions"] == {
        "block": {"enabled": False},
        "mark": {"enabled": False},
        "report": {"enabled": True},
    }
    refused(lambda: canonical_policy(spec(rules=[]), kind, STATE, CHECKS), "at least one rule")
    refused(lambda: canonical_policy(spec(targets=[]), kind, STATE, CHECKS), "at least one target")
    refused(lambda: canonical_policy(spec(rules=["nope"]), kind, STATE, CHECKS), "unknown rule 'nope'")
    refused(lambda: canonical_policy(spec(rules=["EnforceAvro"]), kind, STATE, CHECKS), "needs a schema registry")
    mixed = [{"cluster": "gateway", "topic": "a"}, {"cluster": "legacy", "topic": "b"}]
    refused(lambda: canonical_policy(spec(targets=mixed), kind, STATE, CHECKS), "cannot mix")
    observed = spec(targets=[{"cluster": "legacy", "topic": "b"}], actions={"mark": {"enabled": True}})
    refused(lambda: canonical_policy(observed, kind, STATE, CHECKS), "actions need a gateway")
    assert canonical_policy(spec(targets=[{"cluster": "legacy", "topic": "b"}]), kind, STATE, CHECKS)
    refused(
        lambda: canonical_policy(spec(targets=[{"cluster": "x", "topic": "b"}]), kind, STATE, CHECKS), "unknown cluster"
    )
    refused(
        lambda: canonical_policy(spec(targets=[{"cluster": "gateway", "topic": "a*b"}]), kind, STATE, CHECKS),
        "only at the end",
    )
    no_group = {**ok, "metadata": {"name": "p"}}
    refused(lambda: canonical_policy(no_group, kind, STATE, CHECKS), "metadata.group is required")
    with_avro = Checks("gateway", registry_configured=True)
    assert canonical_policy(spec(rules=["EnforceAvro"]), kind, STATE, with_avro)["spec"]["rules"] == ["EnforceAvro"]


def test_alert_manifests() -> None:
    kind = KINDS["Alert"]
    state = State(DataQualityPolicy=[policy("p", ["positive"])])
    alert = {
        "apiVersion": "v3",
        "kind": "Alert",
        "metadata": {"name": "a", "group": "g"},
        "spec": {"type": "DataQualityPolicyAlert", "policyName": "p", "triggerAfter": 5, "withinInSeconds": 60},
    }
    assert canonical_alert(alert, kind, state)["spec"]["triggerAfter"] == 5
    refused(lambda: canonical_alert({**alert, "apiVersion": "v1"}, kind, state), "apiVersion must be v3")
    refused(
        lambda: canonical_alert({**alert, "spec": {**alert["spec"], "policyName": "x"}}, kind, state), "unknown policy"
    )
    refused(
        lambda: canonical_alert({**alert, "spec": {**alert["spec"], "triggerAfter": 0}}, kind, state),
        "positive integer",
    )
    hook = {**alert, "spec": {**alert["spec"], "destination": {"type": "Webhook", "url": "ftp://x"}}}
    refused(lambda: canonical_alert(hook, kind, state), "http(s) URL")


def test_settings() -> None:
    settings = load_settings(
        {
            "SCHEMA_REGISTRY_URL": "http://registry:8081/",
            "DATA_QUALITY_CLUSTERS": "{legacy: {bootstrapServers: 'a:9092'}}",
            "DATA_QUALITY_GROUPS": "{team: {members: [alice], permissions: [ManageDataQuality]}}",
            "DATA_QUALITY_COUNTS_FLUSH_INTERVAL": "5s",
        }
    )
    assert settings.registry_url == "http://registry:8081" and settings.flush_interval == 5.0
    assert settings.clusters["legacy"].bootstrap_servers == "a:9092"
    from kanal.api.errors import ConfigError

    with pytest.raises(ConfigError, match="DATA_QUALITY_COUNTS_FLUSH_INTERVAL"):
        load_settings({"DATA_QUALITY_COUNTS_FLUSH_INTERVAL": "2m"})
    with pytest.raises(ConfigError, match="DATA_QUALITY_GROUPS"):
        load_settings({"DATA_QUALITY_GROUPS": "{team: {permissions: [Everything]}}"})


# -- actions -----------------------------------------------------------------------------------------


def test_mark_block_and_report() -> None:
    result, records = produce(interceptor(policy("p", ["positive", "euro"], mark=True)), [GOOD, NEGATIVE, DOLLARS])
    assert result is None
    assert [dict(r.headers).get(MARK_HEADER) for r in records] == [
        None,
        b'{"p":["positive"]}',
        b'{"p":["euro"]}',
    ]
    # untouched when every record passes: the very bytes
    ic = interceptor(policy("p", ["positive"], mark=True))
    data = encode_batch([Record(value=orjson.dumps(GOOD), key=b"k")], base_timestamp=1)
    ctx = RecordsContext(CONNECTION, 0, 9, "c", "orders", 0, RecordSet.parse(data))
    assert ic.kanal_produce_records(ctx) is None and not ctx.records.changed()

    blocked, _ = produce(interceptor(policy("p", ["positive", "euro"], block=True, mark=True)), [GOOD, DOLLARS])
    assert isinstance(blocked, PartitionError) and blocked.error_code == 87
    assert (
        "'p'" in (blocked.message or "")
        and "euro" in (blocked.message or "")
        and "only euros" in (blocked.message or "")
    )
    # another topic: not evaluated, not decoded
    result, records = produce(interceptor(policy("p", ["positive"], block=True)), [NEGATIVE], topic="other")
    assert result is None


def test_mark_replaces_an_existing_header() -> None:
    headers = [("x-source", b"web"), (MARK_HEADER, b'{"old":["x"]}')]
    _, records = produce(interceptor(policy("p", ["positive"], mark=True)), [NEGATIVE], headers=headers)
    assert [h for h in records[0].headers if h[0] == MARK_HEADER] == [(MARK_HEADER, b'{"p":["positive"]}')]


def test_multi_policy_order_and_counts() -> None:
    """No blocker: all count. A blocker: only the first blocking policy (blockers first, by name) counts."""
    ic = interceptor(policy("b", ["positive"], mark=True), policy("a", ["euro"], mark=True), policy("c", ["shape"]))
    produce(ic, [GOOD, NEGATIVE, DOLLARS])
    runtime = ic._runtime
    assert runtime is not None
    counts = {p: runtime.history.counts(p, 3600, 60) for p in "abc"}
    assert {p: (c["evaluated"], c["violations"]) for p, c in counts.items()} == {"a": (3, 1), "b": (3, 1), "c": (3, 0)}

    ic = interceptor(
        policy("z-block", ["positive"], block=True),
        policy("y-block", ["euro"], block=True),
        policy("a-watch", ["positive", "euro"], mark=True),
    )
    assert [p.name for p in ic._resolve() and ic._engine.policies] == ["y-block", "z-block", "a-watch"]  # type: ignore[union-attr]
    result, _ = produce(ic, [GOOD, DOLLARS, NEGATIVE])
    assert isinstance(result, PartitionError) and "'y-block'" in (result.message or "")
    runtime = ic._runtime
    assert runtime is not None
    got = {
        p: (runtime.history.counts(p, 3600, 60)["evaluated"], len(runtime.history.violations(p, 3600)))
        for p in ("y-block", "z-block", "a-watch")
    }
    assert got == {"y-block": (1, 1), "z-block": (0, 0), "a-watch": (0, 0)}


def test_order_policies() -> None:
    compiled = [
        compile_policy(policy(n, [], block=b), {}, frozenset())
        for n, b in (("c", False), ("b", True), ("a", False), ("d", True))
    ]
    assert [p.name for p in order_policies(compiled)] == ["b", "d", "a", "c"]


# -- decoding and the scanner --------------------------------------------------------------------------


def test_decoding() -> None:
    assert decode_value(b'{"a": 1}') == {"a": 1} and decode_value(b"42") == 42 and decode_value(None) is None
    assert decode_value(b"plain text") == "plain text" and decode_value(b"\xff\xfe") == b"\xff\xfe"
    assert decode_key(b"42") == "42" and decode_key(b"order-1") == "order-1" and decode_key(b'{"id": 1}') == {"id": 1}
    assert prefix_ref(b"\x00\x00\x00\x01\x02rest") == 258 and prefix_ref(b"{}") is None
    guid = "5b0e7a52-4c8f-4c5f-9a52-63a5f1f1c8a0"
    import uuid

    raw = uuid.UUID(guid).bytes
    assert header_ref(b"\x01" + raw) == guid and header_ref(raw) == guid and header_ref(guid.encode()) == guid
    assert header_ref(b"\x00\x00\x00\x00\x07") == 7 and header_ref(b"\x00\x00\x00\x07") == 7 and header_ref(b"7") == 7
    assert to_json({"b": b"\x00\xff", "l": [b"a"]}) == {"b": "\x00\xff", "l": ["a"]}


def test_headers_keys_and_non_json_values() -> None:
    ic = interceptor(policy("p", ["web", "keyed"], mark=True))
    _, records = produce(ic, [GOOD], headers=[("x-source", b"app")], key=b"order-7")
    assert json.loads(dict(records[0].headers)[MARK_HEADER]) == {"p": ["web"]}
    _, records = produce(ic, [GOOD], headers=[("x-source", b"web")], key=None)
    assert json.loads(dict(records[0].headers)[MARK_HEADER]) == {"p": ["keyed"]}  # null key: an error, a violation
    _, records = produce(interceptor(policy("p", ["shape"], mark=True)), [b"not json", None])
    assert all(MARK_HEADER in dict(r.headers) for r in records)


CODECS = [NONE, GZIP, SNAPPY, LZ4, ZSTD]


@pytest.mark.parametrize("codec", CODECS)
def test_scanner_matches_the_codec(codec: int) -> None:
    """The generated scanner reads what the gateway's codec reads: every codec, long and odd records."""
    rnd = random.Random(codec)
    values: list[bytes | None] = []
    for i in range(300):
        kind = i % 5
        if kind == 0:
            values.append(
                orjson.dumps(
                    {
                        "amount": rnd.randint(-5, 5),
                        "currency": rnd.choice(["EUR", "USD"]),
                        "pad": "x" * rnd.randint(0, 9000),
                    }
                )
            )
        elif kind == 1:
            values.append(None)
        elif kind == 2:
            values.append(bytes(rnd.getrandbits(8) for _ in range(rnd.randint(0, 70))))
        else:
            values.append(orjson.dumps({"amount": rnd.randint(-2, 2), "currency": "EUR"}))
    records = [
        Record(
            offset_delta=i,
            timestamp_delta=rnd.choice([0, 5, 100, 70_000, 10**9]),
            key=rnd.choice([None, b"", b"order-" + str(i).encode(), b"k" * 200]),
            value=v,
            headers=rnd.choice([[], [("x-source", b"web")], [("x-source", None), ("h" * 100, b"v" * 300)]]),
        )
        for i, v in enumerate(values)
    ]
    data = encode_batch(records, base_timestamp=1_700_000_000_000, compression=codec)
    for names in (["positive"], ["positive", "euro", "shape"], ["web", "keyed", "positive"]):
        for actions in ({"mark": True}, {"block": True}):
            plan_policy = compile_policy(
                canonical_policy(policy("p", names, **actions), KINDS["DataQualityPolicy"], STATE, CHECKS),
                Runtime(Settings()).compile_rules(STATE.resources("DataQualityRule")),
                frozenset(),
            )
            plan = build_plan([plan_policy])
            scanned = scan_batches(plan, RecordSet.parse(data).batches)
            reference = evaluate(plan, RecordSet.parse(data).batches[0].records())
            assert scanned.evaluated == reference.evaluated
            simple = lambda r: None if r is None else (r.index, r.rules, tuple(o.passed for o in r.outcomes))  # noqa: E731
            assert simple(scanned.blocked) == simple(reference.blocked)
            assert [simple(v) for v in scanned.violations] == [simple(v) for v in reference.violations]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.binary(max_size=300)),
            st.one_of(st.none(), st.binary(max_size=40)),
            st.lists(st.tuples(st.text(max_size=10), st.one_of(st.none(), st.binary(max_size=30))), max_size=3),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_scanner_on_arbitrary_records(
    items: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
) -> None:
    records = [Record(offset_delta=i, key=k, value=v, headers=h) for i, (v, k, h) in enumerate(items)]
    data = encode_batch(records, base_timestamp=1)
    rules = Runtime(Settings()).compile_rules(STATE.resources("DataQualityRule"))
    plan = build_plan([compile_policy(policy("p", ["web", "keyed", "shape"], mark=True), rules, frozenset())])
    scanned = scan_batches(plan, RecordSet.parse(data).batches)
    reference = evaluate(plan, RecordSet.parse(data).batches[0].records())
    assert [(v.index, v.rules) for v in scanned.violations] == [(v.index, v.rules) for v in reference.violations]


# -- history, reporting, alerts ----------------------------------------------------------------------------


def test_history_counts_and_rate_limit() -> None:
    now = [1_800_000_000_000]
    history = History("n1", clock=lambda: now[0])
    reporter = Reporter(history, max_per_second=2, clock=lambda: now[0])
    for _ in range(5):
        reporter.report({"time": now[0], "policy": "p", "topic": "t", "partition": 0, "rules": ["r"], "message": "m"})
    reporter.count("p", 10, 5)
    assert len(history.violations("p", 1800)) == 2  # at once, before publishing
    reporter.flush_local()
    assert history.counts("p", 1800, 60)["evaluated"] == 10 and history.counts("p", 1800, 60)["violations"] == 5
    now[0] += 2 * 3600 * 1000
    assert history.counts("p", 1800, 60)["evaluated"] == 0 and history.counts("p", 86400, 3600)["evaluated"] == 10
    assert history.violations("p", 1800) == [] and len(history.violations("p", 86400)) == 2


def test_alert_window() -> None:
    fired: list[Any] = []
    alerts = Alerts(DataQualityMetrics(), "me", "gateway", fired.append)
    alerts.configure(
        [
            {
                "metadata": {"name": "a"},
                "spec": {"policyName": "p", "triggerAfter": 3, "withinInSeconds": 10},
            }
        ]
    )
    alerts.on_violation("p", 0, 1, "me")
    alerts.on_violation("p", 11_000, 1, "me")  # the first one left the window
    alerts.on_violation("p", 12_000, 1, "other")
    assert fired == []
    alerts.on_violation("p", 13_000, 1, "me")
    assert len(fired) == 1 and fired[0].deliver and fired[0].violations == 3
    alerts.on_violation("p", 14_000, 5, "me")  # firing: ignored until the window passed
    assert len(fired) == 1
    alerts.tick(23_000)
    alerts.on_violation("p", 23_500, 3, "other")  # re-armed; crossed by another node's report
    assert len(fired) == 2 and not fired[1].deliver


def test_reporter_detached_runtime_sees_counts() -> None:
    ic = interceptor(policy("p", ["positive"]))
    produce(ic, [NEGATIVE] * 3)
    runtime = ic._runtime
    assert runtime is not None
    entries = runtime.history.violations("p", 60)
    assert (
        len(entries) == 3 and entries[0]["message"] == "positive did not pass" and entries[0]["clientId"] == "client-1"
    )


def test_test_rule_outcomes() -> None:
    from kanal_dataquality.testrule import compile_for_test, run_test

    def run(spec: dict[str, Any], **sample: Any) -> dict[str, Any]:
        answer: dict[str, Any] = trio.run(run_test, compile_for_test(spec), sample, None)
        return answer

    cel = {"type": "Cel", "celExpression": "value.amount > 0 && headers['x-source'] == 'web'"}
    assert run(cel, value='{"amount": 1}', headers={"x-source": "web"})["result"] == "passed"
    assert run(cel, value='{"amount": 0}', headers={"x-source": "web"})["result"] == "failed"
    assert run(cel, value='{"amount": 1}')["result"] == "evaluationError"
    assert run({"type": "JsonSchema", "schema": {"type": "object"}}, value="[1")["result"] == "evaluationError"
    assert run({"type": "Cel", "celExpression": "key == 'k'"}, key="k", value="{}")["result"] == "passed"


def test_every_setting_and_metric_is_documented() -> None:
    from pathlib import Path

    from kanal_dataquality.settings import VARIABLES

    text = (Path(__file__).resolve().parents[2] / "docs" / "data-quality.md").read_text()
    assert not [name for name, _default, _meaning in VARIABLES if f"`{name}`" not in text]
    metrics = DataQualityMetrics()
    names = {m.name for m in metrics.registry.collect()}
    documented = {n for n in names if f"`{n}" in text}
    assert documented == names, names - documented


def test_cli_local(capsys: pytest.CaptureFixture[str]) -> None:
    from kanal.cli import main

    assert main(["test-rule", "--local", "--cel", "value.a > 1", "--value", '{"a": 2}']) == 0
    assert main(["test-rule", "--local", "--cel", "value.a > 1", "--value", '{"a": 0}']) == 2
    assert main(["test-rule", "--local", "--cel", "value.a >", "--value", "{}"]) == 3
    assert main(["test-rule", "--local", "--rule", "stored", "--value", "{}"]) == 1
    out = capsys.readouterr()
    assert out.out.splitlines()[:2] == ["passed", "failed: test-rule did not pass"]
    assert "evaluation error: invalid CEL expression" in out.out and "--local tests inline rules only" in out.err


# -- the plugin's wiring -----------------------------------------------------------------------------------


def test_the_plugin_builds_one_runtime_per_gateway_from_its_settings() -> None:
    from kanal_dataquality import plugin

    from kanal.api import ConfigError

    services = fake_services(
        {"DATA_QUALITY_PRIORITY": "7", "SCHEMA_REGISTRY_URL": "http://registry:8081/", "GATEWAY_X": "1"}, "gw"
    )
    gateway = cast(GatewayServices, services)
    assert [k.kind for k in plugin.kanal_admin_resources(gateway)] == ["DataQualityRule", "DataQualityPolicy", "Alert"]
    runtime = services.shared[RUNTIME]
    assert runtime.settings.priority == 7 and runtime.settings.registry_url == "http://registry:8081"
    assert runtime.gateway_cluster == "gw"
    assert len(plugin.kanal_gateway_services(gateway)) == 1 and services.shared[RUNTIME] is runtime
    other = fake_services()
    plugin.kanal_admin_resources(cast(GatewayServices, other))
    assert other.shared[RUNTIME] is not runtime and other.shared[RUNTIME].settings.priority == 100
    with pytest.raises(ConfigError, match="DATA_QUALITY_PRIORITY"):
        plugin.kanal_admin_resources(cast(GatewayServices, fake_services({"DATA_QUALITY_PRIORITY": "first"})))


def test_a_policy_installs_the_interceptor_and_its_deletion_removes_it() -> None:
    from kanal_dataquality import plugin

    services = fake_services({"DATA_QUALITY_PRIORITY": "42"})
    kinds = {k.kind: k for k in plugin.kanal_admin_resources(cast(GatewayServices, services))}
    runtime: Runtime = services.shared[RUNTIME]
    rules = STATE.resources("DataQualityRule")
    blocking = canonical_policy(policy("p", ["positive"], block=True), KINDS["DataQualityPolicy"], STATE, CHECKS)
    kinds["DataQualityRule"].apply(rules, State(DataQualityRule=rules))
    assert services.installed == []  # rules alone: nothing to enforce, Produce is not even decoded
    statuses = kinds["DataQualityPolicy"].apply([blocking], State(DataQualityRule=rules, DataQualityPolicy=[blocking]))
    assert statuses is not None and statuses[("p",)].state == "Ready"
    assert services.installed == [
        [InterceptorSpec(name="data-quality", plugin="data-quality", priority=42, config={"managed": True})]
    ]
    managed = make_interceptor(dict(services.installed[-1][0].config), services)
    result, _ = produce(managed, [GOOD, NEGATIVE])
    assert isinstance(result, PartitionError) and "'p'" in (result.message or "")
    assert managed._runtime is runtime and len(runtime.history.violations("p", 60)) == 1
    assert not managed.wants_produce_records("other")
    kinds["DataQualityPolicy"].apply([], State(DataQualityRule=rules))
    assert services.installed[-1] == []


def test_interceptor_config_errors_name_the_field() -> None:
    def refused(config: dict[str, Any], why: str) -> None:
        with pytest.raises(InterceptorConfigError) as raised:
            make_interceptor(config)
        assert str(raised.value).startswith(why), str(raised.value)

    one = [policy("p", ["positive"])]
    refused({"rules": RULES, "policies": one, "colour": "red"}, "colour: unknown key")
    refused({"rules": RULES}, "policies: expected a non-empty list")
    refused({"rules": RULES, "policies": []}, "policies: expected a non-empty list")
    refused({"rules": "positive", "policies": one}, "rules: Expected `array`")
    refused({"clusterId": "", "rules": RULES, "policies": one}, "clusterId:")
    refused({"rules": [rule("bad", "value.a >")], "policies": one}, "rules[0]: rule 'bad': invalid CEL expression")
    refused({"managed": True, "policies": one}, "rules, policies: not with managed")


def test_aclose_closes_what_the_interceptor_holds_not_the_shared_runtime() -> None:
    from kanal_dataquality import plugin

    alone = interceptor(policy("p", ["positive"]))
    own = alone._resolve()
    assert own.helper is not None and own.helper.usable
    trio.run(alone.aclose)
    assert own.helper is None  # its helper process is closed

    services = fake_services()
    plugin.kanal_admin_resources(cast(GatewayServices, services))
    shared = services.shared[RUNTIME]
    hosted = make_interceptor({"rules": RULES, "policies": [policy("p", ["positive"])]}, services)
    produce(hosted, [NEGATIVE])
    assert hosted._runtime is shared and shared.inline_policies  # reports to the plugin's runtime
    assert len(shared.history.violations("p", 60)) == 1
    trio.run(hosted.aclose)
    assert shared.helper is not None and shared.helper.usable


def test_test_rule_command_asks_the_admin_api_through_the_cli_context(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from kanal_dataquality import plugin

    from kanal.api import CliContext, CliError

    calls: list[tuple[Any, ...]] = []

    class Client:
        def call(self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None) -> Any:
            calls.append((method, path, body))
            if body["rule"] == "missing":
                raise CliError("DataQualityRule 'missing' does not exist")
            return {"rule": body["rule"], "result": "failed", "message": "too small", "reason": "$.a"}

    class Cli:
        def admin_client(self, url: str | None, user: str | None, password: str | None) -> Client:
            calls.append((url, user, password))
            return Client()

    parser = argparse.ArgumentParser(prog="kanal")
    plugin.kanal_cli_commands(parser.add_subparsers(dest="command"), cast(CliContext, Cli()))

    def run(*argv: str) -> int:
        args = parser.parse_args(argv)
        code: int = args.func(args)
        return code

    assert run("test-rule", "--rule", "positive", "--value", '{"a": 0}', "--url", "http://gw:1", "--user", "u") == 2
    assert calls == [
        ("http://gw:1", "u", None),  # unset: the context falls back to KANAL_URL, KANAL_USER, KANAL_PASSWORD
        ("POST", "/gateway/v2/data-quality/test-rule", {"rule": "positive", "value": '{"a": 0}'}),
    ]
    assert run("test-rule", "--rule", "missing", "--value", "{}") == 1
    out = capsys.readouterr()
    assert out.out == "failed: too small ($.a)\n"
    assert "kanal: DataQualityRule 'missing' does not exist" in out.err
