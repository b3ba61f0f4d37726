"""Backtesting policies and shadow mode, end to end: a gateway process with the data-quality plugin in
front of Tansu, its admin API, ``kanal dq backtest``, and real producers.

Backtests read a topic whose records the test wrote directly to the broker with known timestamps (two
partitions: ten and six records, a few of which break the policy's rules), so counts, offsets and
samples are exact. "Nothing changed" is shown by the policy's counts, history and Prometheus series
after a backtest: a record produced through the gateway afterwards is the only thing they count (the
test waits for it to appear, so the counts have been flushed since the backtest ran).
"""

from __future__ import annotations

import contextlib
import io
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kanal_dataquality.runtime import SHADOW_STATUS
from prometheus_client.parser import text_string_to_metric_families
from test_dq_gateway import (
    Http,
    cel_rule,
    consume_direct,
    create_topic,
    headers_of,
    policy,
    produce_confluent,
    schema_rule,
    unique,
    wait_for,
)

from kanal.cli import main as kanal_main
from kanal.embedded import GatewayProcess, TansuBroker

pytestmark = pytest.mark.integration

USERS = "[{username: admin, password: secret, admin: true}, {username: viewer, password: look}]"
VIEWER = ("viewer", "look")
BACKTEST = "/gateway/v2/data-quality/backtest"
MARK_HEADER = "vendor.dataquality.violations"
BASE_MS = 1_700_000_000_000  # record i of each partition has the timestamp BASE_MS + i seconds


def order(amount: float, currency: str | None = "EUR", i: int = 0) -> bytes:
    value: dict[str, Any] = {"id": i, "amount": amount}
    if currency is not None:
        value["currency"] = currency
    return json.dumps(value).encode()


# Partition 0: ten records; 2 is negative, 5 in dollars, 7 has no currency. Partition 1: six records;
# 1 is negative and in dollars.
PARTITION_0 = [order(10, i=i) for i in range(10)]
PARTITION_0[2] = order(-5, i=2)
PARTITION_0[5] = order(3, "USD", i=5)
PARTITION_0[7] = order(4, None, i=7)
PARTITION_1 = [order(20, i=100 + i) for i in range(6)]
PARTITION_1[1] = order(-1, "USD", i=101)


class Stack:
    def __init__(self, broker: TansuBroker, gateway: GatewayProcess, http: Http, cluster: str) -> None:
        self.broker = broker
        self.gateway = gateway
        self.http = http
        self.cluster = cluster

    def apply(self, *manifests: dict[str, Any]) -> None:
        paths = {"DataQualityRule": "data-quality-rule", "DataQualityPolicy": "data-quality-policy"}
        for manifest in manifests:
            status, answer = self.http.put(f"/gateway/v2/{paths[manifest['kind']]}", manifest)
            assert status == 200, answer

    def backtest(self, body: dict[str, Any], *, wait: bool = True, user: Any = ("admin", "secret")) -> Any:
        status, answer = self.http.call("POST", BACKTEST + ("?wait=true" if wait else ""), body, user=user)
        assert status == (200 if wait else 202), (status, answer)
        return answer

    def metrics(self, name: str) -> dict[str, Any]:
        status, answer = self.http.get(f"/gateway/v2/data-quality/policies/{name}/metrics?range=30m")
        assert status == 200, answer
        return answer  # type: ignore[no-any-return]

    def violations(self, name: str) -> list[dict[str, Any]]:
        status, answer = self.http.get(f"/gateway/v2/data-quality/policies/{name}/violations?range=30m")
        assert status == 200, answer
        return answer  # type: ignore[no-any-return]

    def prometheus(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = self.http.get("/metrics", user=None)[1]
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }


@pytest.fixture(scope="module")
def stack(tansu: TansuBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("dq-backtest-plugin")
    info = root / "kanal_dataquality_test-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kanal-dataquality-test\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text("[kanal.plugins]\ndata-quality = kanal_dataquality.plugin\n")
    cluster = f"dq-bt-{uuid.uuid4().hex[:8]}"
    env = {
        **tansu.gateway_settings(),
        "GATEWAY_ADMIN_API_USERS": USERS,
        "GATEWAY_CLUSTER_ID": cluster,
        "DATA_QUALITY_COUNTS_FLUSH_INTERVAL": "500ms",
        "PYTHONPATH": str(root),
    }
    process = GatewayProcess(env, log_path=root / "gateway.log").start(timeout=30)
    try:
        yield Stack(tansu, process, Http(env["GATEWAY_HTTP_PORT"]), cluster)
    finally:
        code = process.stop(timeout=15)
        assert code == 0, f"gateway exited with {code}:\n{process.tail()}"


@pytest.fixture(scope="module")
def orders(stack: Stack) -> str:
    """A two-partition topic holding PARTITION_0 and PARTITION_1, written to the broker directly."""
    from confluent_kafka import Producer

    topic = create_topic(stack.broker, unique("bt-orders"), partitions=2)
    producer = Producer({"bootstrap.servers": stack.broker.bootstrap, "linger.ms": 20, "enable.idempotence": False})
    for partition, values in ((0, PARTITION_0), (1, PARTITION_1)):
        for i, value in enumerate(values):
            producer.produce(
                topic, value=value, key=f"k{i}".encode(), partition=partition, timestamp=BASE_MS + i * 1000
            )
    assert producer.flush(20) == 0
    consume_direct(stack.broker, topic, len(PARTITION_0) + len(PARTITION_1), partitions=2)  # all stored
    return topic


def rules(name: str) -> list[dict[str, Any]]:
    """Three rules: a positive amount, euros, and an order's shape (a JSON schema)."""
    return [
        cel_rule(f"{name}-positive", "value.amount > 0"),
        cel_rule(f"{name}-eur", "value.currency == 'EUR'", message="only euros"),
        schema_rule(f"{name}-shape", {"type": "object", "required": ["id", "amount", "currency"]}),
    ]


def stored_policy(stack: Stack, *topics: str, **actions: bool) -> str:
    name = unique("bt")
    names = [f"{name}-{r}" for r in ("positive", "eur", "shape")]
    stack.apply(*rules(name), policy(name, names, list(topics), cluster=stack.cluster, **actions))
    return name


# -- backtests ------------------------------------------------------------------------------------------


def test_backtest_of_a_saved_policy_counts_exactly_and_changes_nothing(stack: Stack, orders: str) -> None:
    probe = create_topic(stack.broker, unique("bt-probe"))
    name = stored_policy(stack, orders, probe, block=True)
    job = stack.backtest({"policy": name, "topic": orders, "range": {"offsets": {"0": {}, "1": {}}}})
    assert job["state"] == "done" and job["policy"] == name and not job["draft"] and job["targeted"]
    report = job["report"]
    assert report["evaluated"] == 16 and report["violations"] == 4, json.dumps(job["progress"])
    assert report["rules"] == [
        {"rule": f"{name}-positive", "violations": 2},
        {"rule": f"{name}-eur", "violations": 3},
        {"rule": f"{name}-shape", "violations": 1},
    ]
    assert report["stoppedOn"] is None and report["complete"] is True and report["elapsedSeconds"] > 0
    samples = {(s["partition"], s["offset"]): s for s in report["samples"]}
    assert sorted(samples) == [(0, 2), (0, 5), (0, 7), (1, 1)]
    negative = samples[(0, 2)]
    assert negative["timestamp"] == BASE_MS + 2000 and negative["key"] == "k2"
    assert json.loads(negative["value"]) == {"id": 2, "amount": -5, "currency": "EUR"}
    assert negative["rules"] == [f"{name}-positive"] and negative["message"] == f"{name}-positive did not pass"
    assert samples[(0, 5)]["rules"] == [f"{name}-eur"] and samples[(0, 5)]["message"] == "only euros"
    missing = samples[(0, 7)]
    assert missing["rules"] == [f"{name}-eur", f"{name}-shape"]
    assert [d["rule"] for d in missing["details"]] == [f"{name}-eur", f"{name}-shape"]
    assert "currency" in missing["details"][0]["reason"] and "currency" in missing["details"][1]["reason"]
    assert samples[(1, 1)]["rules"] == [f"{name}-positive", f"{name}-eur"]
    assert job["progress"]["partitions"] == [
        {"partition": 0, "start": 0, "end": 10, "position": 10, "evaluated": 10, "done": True},
        {"partition": 1, "start": 0, "end": 6, "position": 6, "evaluated": 6, "done": True},
    ]
    # the job stays readable, also in the list
    status, again = stack.http.get(f"{BACKTEST}/{job['id']}")
    assert status == 200 and again["report"] == report
    assert any(j["id"] == job["id"] and j["state"] == "done" for j in stack.http.get(BACKTEST)[1])

    # Nothing changed: one good record produced through the gateway afterwards (to the policy's other
    # topic: the backtested one stays as it is for the other tests) is all the policy counted.
    assert produce_confluent(stack.gateway.bootstrap, probe, [order(1)]) == [None]
    wait_for(lambda: stack.metrics(name)["evaluated"] == 1 or None)
    assert stack.metrics(name)["violations"] == 0 and stack.violations(name) == []
    samples_now = stack.prometheus()
    labels = (("policy", name),)
    assert samples_now[("gateway_data_quality_messages_evaluated_total", labels)] == 1
    assert samples_now[("gateway_data_quality_violations_total", labels)] == 0
    assert samples_now[("gateway_data_quality_blocked_batches_total", labels)] == 0


def test_backtest_of_a_draft_policy(stack: Stack, orders: str) -> None:
    name = unique("draft")
    stack.apply(*rules(name))
    draft = policy(name, [f"{name}-shape"], [unique("elsewhere")], cluster=stack.cluster, block=True)
    job = stack.backtest({"policy": draft, "topic": orders, "range": {"latest": 100}})
    assert job["draft"] is True and job["policy"] == name and job["targeted"] is False
    report = job["report"]
    assert (report["evaluated"], report["violations"]) == (16, 1)
    assert report["rules"] == [{"rule": f"{name}-shape", "violations": 1}]
    assert [(s["partition"], s["offset"]) for s in report["samples"]] == [(0, 7)]
    assert report["samples"][0]["details"][0]["reason"].startswith("$: ")  # the schema's own reason
    assert stack.http.get(f"/gateway/v2/data-quality-policy/{name}")[0] == 404  # a draft is not stored


def test_an_invalid_draft_is_refused_as_storing_it_would_be(stack: Stack, orders: str) -> None:
    name = unique("bad")
    stack.apply(*rules(name))
    good = policy(name, [f"{name}-positive"], [orders], cluster=stack.cluster)
    for spec, why in (
        ({"rules": ["nope"]}, "unknown rule 'nope'"),
        ({"targets": []}, "at least one target"),
        ({"actions": {"block": {"enabled": "yes"}}}, "spec.actions.block.enabled must be true or false"),
    ):
        draft = {**good, "spec": {**good["spec"], **spec}}
        stored_status, stored = stack.http.put("/gateway/v2/data-quality-policy", draft)
        status, answer = stack.http.call("POST", BACKTEST + "?wait=true", {"policy": draft, "topic": orders})
        assert (stored_status, status) == (400, 400), answer
        assert why in answer["msg"] and answer["msg"] == stored["msg"]
    # and the request's own problems
    for body, why in (
        ({"policy": name + "-nope", "topic": orders}, "does not exist"),
        ({"policy": good, "topic": unique("no-such-topic")}, "does not exist on the cluster"),
        ({"topic": orders}, "policy is required"),
        ({"policy": draft, "topic": orders, "range": {"latest": 5, "from": 1}}, "exactly one of"),
        ({"policy": draft, "topic": orders, "maxRecords": 0}, "maxRecords must be between 1 and"),
        ({"policy": draft, "topic": orders, "maxSeconds": 9999}, "maxSeconds"),
        ({"policy": good, "topic": orders, "range": {"offsets": {"7": {}}}}, "has no partition 7"),
    ):
        status, answer = stack.http.call("POST", BACKTEST, body)
        assert status in (400, 404) and why in answer["msg"], (body, answer)


def test_offset_and_latest_ranges(stack: Stack, orders: str) -> None:
    name = stored_policy(stack, orders)
    job = stack.backtest({"policy": name, "topic": orders, "range": {"offsets": {"0": {"start": 2, "end": 6}}}})
    report = job["report"]
    assert (report["evaluated"], report["violations"]) == (4, 2)  # offsets 2 to 5 of partition 0
    assert [(s["partition"], s["offset"]) for s in report["samples"]] == [(0, 2), (0, 5)]
    assert [p["partition"] for p in job["progress"]["partitions"]] == [0]

    job = stack.backtest({"policy": name, "topic": orders, "range": {"latest": 3}})
    report = job["report"]
    assert report["evaluated"] == 6 and report["violations"] == 1  # 7, 8, 9 of partition 0; 3, 4, 5 of 1
    assert [(s["partition"], s["offset"]) for s in report["samples"]] == [(0, 7)]
    assert [(p["start"], p["end"]) for p in job["progress"]["partitions"]] == [(7, 10), (3, 6)]

    job = stack.backtest(
        {"policy": name, "topic": orders, "partitions": [1], "range": {"offsets": {"1": {"start": 1}}}}
    )
    assert (job["report"]["evaluated"], job["report"]["violations"]) == (5, 1)


def test_time_range(stack: Stack, orders: str) -> None:
    """From the first record at or after ``from`` to the first at or after ``to`` (exclusive)."""
    name = stored_policy(stack, orders)
    body = {"policy": name, "topic": orders, "range": {"from": BASE_MS + 2000, "to": BASE_MS + 6000}}
    report = stack.backtest(body)["report"]
    assert report["evaluated"] == 8  # seconds 2 to 5 of both partitions
    assert [(s["partition"], s["offset"]) for s in report["samples"]] == [(0, 2), (0, 5)]
    iso = {"from": "2023-11-14T22:13:22Z", "to": "2023-11-14T22:13:25.500Z"}  # BASE_MS is 22:13:20 UTC
    report = stack.backtest({"policy": name, "topic": orders, "range": iso})["report"]
    assert report["evaluated"] == 8 and report["violations"] == 2  # seconds 2 to 5 again
    report = stack.backtest({"policy": name, "topic": orders, "range": {"from": BASE_MS + 8000}})["report"]
    assert report["evaluated"] == 2 + 0 and report["violations"] == 0  # 8 and 9 of partition 0 only


def test_max_records_stops_early_and_says_so(stack: Stack, orders: str) -> None:
    name = stored_policy(stack, orders)
    job = stack.backtest({"policy": name, "topic": orders, "range": {"offsets": {"0": {}}}, "maxRecords": 5})
    report = job["report"]
    assert job["state"] == "done" and report["stoppedOn"] == "maxRecords" and report["complete"] is False
    assert (report["evaluated"], report["violations"]) == (5, 1)  # offsets 0 to 4: the negative one
    assert job["progress"]["partitions"][0]["position"] == 5
    job = stack.backtest({"policy": name, "topic": orders, "range": {"offsets": {"0": {}}}, "samples": 1})
    assert job["report"]["violations"] == 3 and len(job["report"]["samples"]) == 1


def test_cancel(stack: Stack) -> None:
    """A backtest of 300,000 records is cancelled while it reads: it stops, and says how far it got."""
    from confluent_kafka import Producer

    topic = create_topic(stack.broker, unique("bt-large"))
    producer = Producer(
        {
            "bootstrap.servers": stack.broker.bootstrap,
            "linger.ms": 20,
            "enable.idempotence": False,
            "batch.size": 1 << 20,
        }
    )
    total = 300_000
    value = order(1) + b" " * 150
    for _ in range(total):
        while True:
            try:
                producer.produce(topic, value=value)
                break
            except BufferError:
                producer.poll(0.01)
    assert producer.flush(60) == 0
    name = stored_policy(stack, topic)
    job = stack.backtest(
        {"policy": name, "topic": topic, "range": {"offsets": {"0": {}}}, "maxRecords": total, "maxSeconds": 600},
        wait=False,
    )
    assert job["state"] == "running" and job["report"] is None
    wait_for(lambda: stack.http.get(f"{BACKTEST}/{job['id']}")[1]["progress"]["recordsRead"] > 0)
    status, cancelled = stack.http.call("DELETE", f"{BACKTEST}/{job['id']}")
    assert status == 200 and cancelled["state"] == "cancelled", cancelled
    report = cancelled["report"]
    assert 0 < report["evaluated"] < total and report["complete"] is False
    assert stack.http.call("DELETE", f"{BACKTEST}/{job['id']}")[0] == 204  # forgotten
    assert stack.http.get(f"{BACKTEST}/{job['id']}")[0] == 404


def test_read_only_users_are_refused(stack: Stack, orders: str) -> None:
    name = stored_policy(stack, orders)
    job = stack.backtest({"policy": name, "topic": orders})
    assert stack.http.call("POST", BACKTEST, {"policy": name, "topic": orders}, user=VIEWER)[0] == 403
    assert stack.http.get(f"{BACKTEST}/{job['id']}", user=VIEWER)[0] == 403
    assert stack.http.get(BACKTEST, user=VIEWER)[0] == 403
    assert stack.http.call("DELETE", f"{BACKTEST}/{job['id']}", user=VIEWER)[0] == 403
    assert stack.http.call("POST", BACKTEST, {"policy": name, "topic": orders}, user=None)[0] == 401


def test_cli_backtest(stack: Stack, orders: str, tmp_path: Path) -> None:
    name = stored_policy(stack, orders)
    base = ["--url", stack.http.base, "--user", "admin", "--password", "secret"]

    def run(*args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = kanal_main(["dq", "backtest", *args, *base])
        return code, out.getvalue(), err.getvalue()

    code, out, err = run("--policy", name, "--topic", orders, "--offsets", "0:2-6")
    assert code == 2, out
    assert err.startswith("backtest ") and " records read" in err  # the progress, while it ran
    lines = out.splitlines()
    assert lines[0].endswith(f"policy {name} on topic {orders} (done)")
    assert "  evaluated: 4 records in " in out and "  violations: 2" in lines
    assert f"    {name}-positive: 1" in lines and f"    {name}-eur: 1" in lines and f"    {name}-shape: 0" in lines
    assert f"    partition 0 offset 2: {name}-positive did not pass" in lines
    assert "    partition 0 offset 5: only euros" in lines

    code, out, err = run("--policy", name, "--topic", orders, "--latest", "2", "--partition", "1", "-q")
    assert code == 0 and "  violations: 0" in out.splitlines() and err == ""

    code, out, _ = run("--policy", name, "--topic", orders, "--offsets", "0:", "--max-records", "3", "-o", "json")
    job = json.loads(out)
    assert code == 2 and job["report"]["stoppedOn"] == "maxRecords" and job["report"]["evaluated"] == 3

    draft = tmp_path / "draft.yaml"
    draft.write_text(json.dumps(policy(unique("cli-draft"), [f"{name}-eur"], [orders], cluster=stack.cluster)))
    code, out, _ = run("-f", str(draft), "--topic", orders, "--from", str(BASE_MS + 5000), "--to", str(BASE_MS + 8000))
    assert code == 2 and "draft policy" in out.splitlines()[0]
    assert "  evaluated: 4 records in " in out and "  violations: 2" in out.splitlines()  # 5, 6, 7 | 5

    code, _, err = run("--topic", orders)
    assert code == 1 and "exactly one of --policy" in err
    code, _, err = run("--policy", name + "-nope", "--topic", orders)
    assert code == 1 and "HTTP 404" in err and "does not exist" in err


# -- shadow mode ----------------------------------------------------------------------------------------


def test_shadow_mode_reports_what_block_would_have_rejected(stack: Stack) -> None:
    topic = create_topic(stack.broker, unique("bt-shadow"))
    name = unique("shadow")
    manifest = policy(
        name,
        [f"{name}-{r}" for r in ("positive", "eur", "shape")],
        [topic],
        cluster=stack.cluster,
        block=True,
        mark=True,
    )
    manifest["spec"]["actions"]["shadow"] = {"enabled": True}
    stack.apply(*rules(name), manifest)
    status, stored = stack.http.get(f"/gateway/v2/data-quality-policy/{name}")
    assert status == 200 and stored["spec"]["actions"]["shadow"] == {"enabled": True}
    assert stored["status"] == {"status": "Ready", "message": SHADOW_STATUS}

    # Three produce batches, as block would have judged them: rejected, accepted, rejected.
    batches = [
        [order(1), order(-1), order(2)],  # one negative record
        [order(3), order(4)],
        [order(5, "USD"), order(6, None)],  # both break rules
    ]
    for values in batches:
        assert produce_confluent(stack.gateway.bootstrap, topic, values) == [None] * len(values)  # nothing blocked
    received = consume_direct(stack.broker, topic, 7)
    assert [m.value() for m in received] == [v for values in batches for v in values]
    assert not any(MARK_HEADER in headers_of(m) for m in received)  # nothing marked

    shadow = wait_for(
        lambda: (stack.metrics(name).get("shadow") or {}).get("wouldHaveBlocked") == 2 and stack.metrics(name)
    )
    assert shadow["shadow"] == {
        "enabled": True,
        "wouldHaveBlocked": 2,
        "wouldHaveBlockedRecords": 5,
        "violationsByRule": {f"{name}-eur": 2, f"{name}-positive": 1, f"{name}-shape": 1},
    }
    assert (shadow["evaluated"], shadow["violations"]) == (7, 3)
    assert shadow["status"] == {
        "status": "Ready",
        "message": "shadow mode: would have blocked 2 batches (5 records) in 30m",
    }
    entries = stack.violations(name)
    assert len(entries) == 3 and {(e["action"], e["shadow"]) for e in entries} == {("WOULD_BLOCK", True)}
    listing = stack.http.get("/gateway/v2/data-quality/metrics?range=30m")[1]
    assert next(p for p in listing if p["policy"] == name)["wouldHaveBlocked"] == 2

    samples = stack.prometheus()
    assert samples[("gateway_data_quality_shadow_blocked_batches_total", (("policy", name),))] == 2
    assert samples[("gateway_data_quality_shadow_blocked_records_total", (("policy", name),))] == 5
    by_rule = {
        labels[1][1]: value
        for (metric, labels), value in samples.items()
        if metric == "gateway_data_quality_shadow_violations_total" and labels[0] == ("policy", name)
    }
    assert by_rule == {f"{name}-positive": 1, f"{name}-eur": 2, f"{name}-shape": 1}
    assert samples[("gateway_data_quality_blocked_batches_total", (("policy", name),))] == 0
    assert samples[("gateway_data_quality_marked_records_total", (("policy", name),))] == 0

    # Shadow off: block applies again.
    manifest["spec"]["actions"]["shadow"] = {"enabled": False}
    stack.apply(manifest)
    from confluent_kafka import KafkaError

    errors = produce_confluent(stack.gateway.bootstrap, topic, [order(-9)])
    assert [e.code() if e else None for e in errors] == [KafkaError.INVALID_RECORD]
