"""The data-quality plugin end to end: a gateway process in front of Tansu, its admin API, real clients.

The plugin is loaded through its ``kanal.plugins`` entry point (a ``.dist-info`` on the gateway's
PYTHONPATH, so the test does not depend on the checkout having been reinstalled). Resources go through
the admin API and ``kanal apply -f``; records are produced through the gateway with confluent-kafka,
kafka-python and aiokafka, and read back from the broker directly.

Covered: block (INVALID_RECORD with the policy and rules in the message, for each client), mark (the
header on the stored record), report-only policies, both multi-policy cases with their counts and
history, the admin API's metrics and violation history, Prometheus metrics, policy status, the rule
test endpoint and CLI, alerts (webhook, audit event, gauge), group permissions, and every 400 of the
spec's Errors table through HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import io
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kanal.cli import main as kanal_main
from kanal.embedded import GatewayProcess, TansuBroker
from kanal.embedded.admin_http import AdminHttp as Http

pytestmark = pytest.mark.integration

USERS = (
    "[{username: admin, password: secret, admin: true}, {username: viewer, password: look},"
    " {username: alice, password: wonder}]"
)
GROUPS = "{team-a: {members: [alice], permissions: [ManageDataQuality]}, team-b: {members: [], permissions: []}}"
MARK_HEADER = "vendor.dataquality.violations"
TIMEOUT = 20.0


# -- helpers ------------------------------------------------------------------------------------------


def cel_rule(name: str, expression: str, message: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"type": "Cel", "displayName": name.title(), "celExpression": expression}
    if message:
        spec["message"] = message
    return {"apiVersion": "v1", "kind": "DataQualityRule", "metadata": {"name": name}, "spec": spec}


def schema_rule(name: str, schema: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "DataQualityRule",
        "metadata": {"name": name},
        "spec": {"type": "JsonSchema", "displayName": name, "schema": schema},
    }


def policy(
    name: str,
    rules: list[str],
    topics: list[str],
    *,
    cluster: str,
    block: bool = False,
    mark: bool = False,
    group: str = "team-a",
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "DataQualityPolicy",
        "metadata": {"name": name, "group": group},
        "spec": {
            "displayName": name,
            "rules": rules,
            "targets": [{"cluster": cluster, "topic": t, "patternType": "LITERAL"} for t in topics],
            "actions": {"block": {"enabled": block}, "mark": {"enabled": mark}},
        },
    }


def wait_for(predicate: Callable[[], Any], timeout: float = TIMEOUT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout}s")
        time.sleep(0.1)


def create_topic(broker: TansuBroker, topic: str, partitions: int = 1) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(TIMEOUT)
    return topic


def consume_direct(broker: TansuBroker, topic: str, count: int, partitions: int = 1) -> list[Any]:
    """Every record of ``topic`` (read from the broker, not through the gateway), which must be exactly
    ``count``. Each partition is read from its beginning up to its high watermark, so every record
    acknowledged before the call is seen and one more than ``count`` fails the test (no fixed "nothing
    more" wait that a late record could slip past); while fewer than ``count`` are there, the reading
    goes on, until ``TIMEOUT``. The high watermarks are those of the consumer's own Fetch responses
    (all sent after the call began): the embedded broker answers ListOffsets for the latest offset
    with the last batch's base offset plus one, short of the records of a batch after its first."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"dq-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    got: list[Any] = []
    next_offsets: dict[int, int] = {}  # the offset after the last record read, by partition

    def read_to_the_end() -> bool:
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)
            if high < 0 or next_offsets.get(p, low) < high:  # no Fetch answered yet, or records left
                return False
        return True

    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline = time.monotonic() + TIMEOUT
        while not (read_to_the_end() and len(got) >= count):
            assert time.monotonic() < deadline, f"read {len(got)} of {count} records of {topic} ({next_offsets})"
            msg = consumer.poll(0.3)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            partition, offset = msg.partition(), msg.offset()
            assert partition is not None and offset is not None
            got.append(msg)
            next_offsets[partition] = offset + 1
        assert len(got) == count, f"{len(got)} records in {topic} ({next_offsets}), expected {count}"
        return got
    finally:
        consumer.close()


def produce_confluent(bootstrap: str, topic: str, values: list[bytes], client_id: str = "dq-test") -> list[Any]:
    """Produces values (one request, one batch); returns the delivery errors (None where delivered)."""
    from confluent_kafka import Producer

    errors: list[Any] = []
    producer = Producer(
        {"bootstrap.servers": bootstrap, "client.id": client_id, "linger.ms": 50, "enable.idempotence": False}
    )
    for value in values:
        producer.produce(topic, value=value, key=b"k", on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(TIMEOUT) == 0
    return errors


def headers_of(message: Any) -> dict[str, bytes]:
    return {k: v for k, v in message.headers() or []}


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dq-plugin")
    info = root / "kanal_dataquality_test-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kanal-dataquality-test\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text("[kanal.plugins]\ndata-quality = kanal_dataquality.plugin\n")
    return root


class Webhook:
    """A local HTTP server recording the alert POSTs it receives."""

    def __init__(self) -> None:
        received: list[Any] = []
        self.received = received

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                received.append(json.loads(self.rfile.read(length)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Stack:
    def __init__(self, broker: TansuBroker, gateway: GatewayProcess, http: Http, cluster: str, hook: Webhook) -> None:
        self.broker = broker
        self.gateway = gateway
        self.http = http
        self.cluster = cluster
        self.hook = hook

    def apply(self, *manifests: dict[str, Any]) -> None:
        paths = {"DataQualityRule": "data-quality-rule", "DataQualityPolicy": "data-quality-policy", "Alert": "alert"}
        for manifest in manifests:
            status, answer = self.http.put(f"/gateway/v2/{paths[manifest['kind']]}", manifest)
            assert status == 200, answer

    def metrics(self, name: str) -> dict[str, Any]:
        status, answer = self.http.get(f"/gateway/v2/data-quality/policies/{name}/metrics?range=30m")
        assert status == 200, answer
        return answer  # type: ignore[no-any-return]

    def violations(self, name: str) -> list[dict[str, Any]]:
        status, answer = self.http.get(f"/gateway/v2/data-quality/policies/{name}/violations?range=30m")
        assert status == 200, answer
        return answer  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def stack(tansu: TansuBroker, plugin_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    cluster = f"dq-{uuid.uuid4().hex[:8]}"
    env = {
        **tansu.gateway_settings(),
        "GATEWAY_ADMIN_API_USERS": USERS,
        "GATEWAY_CLUSTER_ID": cluster,
        "DATA_QUALITY_GROUPS": GROUPS,
        "DATA_QUALITY_COUNTS_FLUSH_INTERVAL": "500ms",
        "DATA_QUALITY_CLUSTERS": json.dumps({"legacy": {"bootstrapServers": tansu.bootstrap}}),
        "PYTHONPATH": str(plugin_path),
    }
    hook = Webhook()
    process = GatewayProcess(env, log_path=tmp_path_factory.mktemp("dq") / "gateway.log").start(timeout=30)
    try:
        yield Stack(tansu, process, Http(env["GATEWAY_HTTP_PORT"]), cluster, hook)
    finally:
        code = process.stop(timeout=15)
        hook.close()
        assert code == 0, f"gateway exited with {code}:\n{process.tail()}"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


GOOD = json.dumps({"amount": 10, "currency": "EUR"}).encode()
NEGATIVE = json.dumps({"amount": -5, "currency": "EUR"}).encode()
DOLLARS = json.dumps({"amount": 3, "currency": "USD"}).encode()


# -- tests ----------------------------------------------------------------------------------------------


def test_block_rejects_the_batch_for_every_client(stack: Stack) -> None:
    topic = create_topic(stack.broker, unique("dq-block"))
    name = unique("block")
    stack.apply(
        cel_rule(f"{name}-positive", "value.amount > 0"),
        policy(name, [f"{name}-positive"], [topic], cluster=stack.cluster, block=True),
    )
    status, current = stack.http.get(f"/gateway/v2/data-quality-policy/{name}")
    assert status == 200 and current["status"] == {"status": "Ready"}

    # confluent-kafka: the whole batch fails with INVALID_RECORD, a valid one goes through
    from confluent_kafka import KafkaError

    errors = produce_confluent(stack.gateway.bootstrap, topic, [GOOD, NEGATIVE, GOOD])
    assert [e.code() if e else None for e in errors] == [KafkaError.INVALID_RECORD] * 3
    assert produce_confluent(stack.gateway.bootstrap, topic, [GOOD, GOOD]) == [None, None]

    # kafka-python
    from kafka import KafkaProducer
    from kafka.errors import InvalidRecordError

    producer = KafkaProducer(bootstrap_servers=stack.gateway.bootstrap, linger_ms=20, acks="all", retries=0)
    try:
        futures = [producer.send(topic, value=v) for v in (GOOD, NEGATIVE)]
        producer.flush(TIMEOUT)
        for future in futures:
            with pytest.raises(InvalidRecordError):
                future.get(TIMEOUT)
    finally:
        producer.close(timeout=TIMEOUT)

    # aiokafka (idempotence off: Tansu refuses its InitProducerId)
    async def aio() -> None:
        from aiokafka import AIOKafkaProducer
        from aiokafka.errors import KafkaError as AioKafkaError

        aio_producer = AIOKafkaProducer(
            bootstrap_servers=stack.gateway.bootstrap, enable_idempotence=False, acks="all", linger_ms=20
        )
        await aio_producer.start()
        try:
            batch = aio_producer.create_batch()
            batch.append(key=None, value=NEGATIVE, timestamp=None)
            future = await aio_producer.send_batch(batch, topic, partition=0)
            # aiokafka 0.14 has no class for error 87: it raises UnknownError, not retried
            with pytest.raises(AioKafkaError) as raised:
                await asyncio.wait_for(future, TIMEOUT)
            assert type(raised.value).__name__ in ("InvalidRecordError", "UnknownError"), raised.value
        finally:
            await aio_producer.stop()

    asyncio.run(aio())

    # only the two valid records of the second confluent batch reached the broker
    assert [m.value() for m in consume_direct(stack.broker, topic, 2)] == [GOOD, GOOD]

    # the history names policy, topic, rule and client; counts come within a flush interval
    entries = wait_for(lambda: stack.violations(name))
    entry = entries[-1]
    assert entry["policy"] == name and entry["topic"] == topic and entry["partition"] == 0
    assert entry["rules"] == [f"{name}-positive"] and entry["message"] == f"{name}-positive did not pass"
    assert entry["action"] == "BLOCKED" and entry["clientId"] == "dq-test"
    # three blocked batches (confluent, kafka-python, aiokafka): one evaluation and one violation each
    assert wait_for(lambda: stack.metrics(name)["violations"] == 3 or None)
    assert stack.metrics(name)["evaluated"] == 3 + 2  # plus the two records of the valid batch


def test_block_message_names_policy_and_rules(stack: Stack) -> None:
    """The Produce response's error_message (seen with kafka-python's protocol objects)."""
    topic = create_topic(stack.broker, unique("dq-message"))
    name = unique("msg")
    stack.apply(
        cel_rule(f"{name}-eur", "value.currency == 'EUR'", message="only euros"),
        policy(name, [f"{name}-eur"], [topic], cluster=stack.cluster, block=True),
    )
    from kafka import KafkaProducer
    from kafka.errors import InvalidRecordError

    producer = KafkaProducer(bootstrap_servers=stack.gateway.bootstrap, acks="all", retries=0)
    try:
        future = producer.send(topic, value=DOLLARS)
        producer.flush(TIMEOUT)
        with pytest.raises(InvalidRecordError) as raised:
            future.get(TIMEOUT)
    finally:
        producer.close(timeout=TIMEOUT)
    text = str(raised.value)
    assert f"'{name}'" in text and f"{name}-eur" in text and "only euros" in text, text
    # the decision is an audit event too, with the client's address as host:port
    assert stack.gateway.wait_for_output(f"DATA_QUALITY BLOCKED topic={topic} partition=0 client=127.0.0.1:")


def test_mark_adds_the_header(stack: Stack) -> None:
    topic = create_topic(stack.broker, unique("dq-mark"))
    name = unique("mark")
    stack.apply(
        cel_rule(f"{name}-positive", "value.amount > 0"),
        cel_rule(f"{name}-eur", "value.currency == 'EUR'"),
        policy(name, [f"{name}-positive", f"{name}-eur"], [topic], cluster=stack.cluster, mark=True),
    )
    assert produce_confluent(stack.gateway.bootstrap, topic, [GOOD, NEGATIVE, DOLLARS]) == [None] * 3
    received = consume_direct(stack.broker, topic, 3)
    assert [m.value() for m in received] == [GOOD, NEGATIVE, DOLLARS]
    assert MARK_HEADER not in headers_of(received[0])
    assert json.loads(headers_of(received[1])[MARK_HEADER]) == {name: [f"{name}-positive"]}
    assert json.loads(headers_of(received[2])[MARK_HEADER]) == {name: [f"{name}-eur"]}
    assert wait_for(lambda: stack.metrics(name)["violations"] == 2 or None)
    assert stack.metrics(name)["evaluated"] == 3
    assert {e["action"] for e in stack.violations(name)} == {"MARKED"}


def test_large_batches_are_checked_on_two_cores(stack: Stack) -> None:
    topic = create_topic(stack.broker, unique("dq-large"))
    name = unique("large")
    stack.apply(
        cel_rule(f"{name}-positive", "value.amount > 0"),
        policy(name, [f"{name}-positive"], [topic], cluster=stack.cluster, mark=True),
    )
    values = [json.dumps({"amount": 10, "pad": "x" * 200, "i": i}).encode() for i in range(2000)]
    bad = [3, 1990]  # one in the helper process's part of the batch, one in the gateway's
    for i in bad:
        values[i] = json.dumps({"amount": -i, "pad": "x" * 200, "i": i}).encode()
    assert sum(map(len, values)) > 256 * 1024  # one produce batch, large enough to split
    # The first large batch starts the helper process (in the background: that batch stays in the gateway).
    assert produce_confluent(stack.gateway.bootstrap, topic, values[:1] * len(values)) == [None] * len(values)
    assert wait_for(lambda: "kanal-data-quality-helper: helper process" in stack.gateway.tail(500))
    assert produce_confluent(stack.gateway.bootstrap, topic, values) == [None] * len(values)
    received = consume_direct(stack.broker, topic, 2 * len(values))[len(values) :]
    assert [m.value() for m in received] == values
    assert [i for i, m in enumerate(received) if MARK_HEADER in headers_of(m)] == bad
    assert wait_for(lambda: stack.metrics(name)["violations"] == 2 or None)
    assert stack.metrics(name)["evaluated"] == 2 * len(values)

    # The same batch to a topic no policy targets: forwarded as it arrives, never decoded.
    other = create_topic(stack.broker, unique("dq-untargeted"))
    streamed = streamed_produce_requests(stack)
    assert produce_confluent(stack.gateway.bootstrap, other, values) == [None] * len(values)
    assert streamed_produce_requests(stack) > streamed
    received = consume_direct(stack.broker, other, len(values))
    assert [m.value() for m in received] == values and not any(MARK_HEADER in headers_of(m) for m in received)


def streamed_produce_requests(stack: Stack) -> float:
    text = stack.http.get("/metrics", user=None)[1]
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "gateway_streamed_requests_total" and s.labels.get("api_key") == "Produce"
    )


def test_several_policies_without_a_blocker_all_count(stack: Stack) -> None:
    """Spec case 1: no policy blocks: every policy evaluates and counts, each violated one reports."""
    topic = create_topic(stack.broker, unique("dq-multi"))
    a, b, c = unique("multi-a"), unique("multi-b"), unique("multi-c")
    stack.apply(
        cel_rule(f"{a}-positive", "value.amount > 0"),
        cel_rule(f"{a}-eur", "value.currency == 'EUR'"),
        policy(a, [f"{a}-positive"], [topic], cluster=stack.cluster, mark=True),
        policy(b, [f"{a}-positive", f"{a}-eur"], [topic], cluster=stack.cluster, mark=True),
        policy(c, [f"{a}-eur"], [topic], cluster=stack.cluster),  # report only
    )
    assert produce_confluent(stack.gateway.bootstrap, topic, [GOOD, NEGATIVE, DOLLARS]) == [None] * 3
    received = consume_direct(stack.broker, topic, 3)
    assert json.loads(headers_of(received[1])[MARK_HEADER]) == {a: [f"{a}-positive"], b: [f"{a}-positive"]}
    assert json.loads(headers_of(received[2])[MARK_HEADER]) == {b: [f"{a}-eur"]}  # c reports, it does not mark
    wait_for(lambda: stack.metrics(c)["evaluated"] == 3 or None)
    assert [(stack.metrics(p)["evaluated"], stack.metrics(p)["violations"]) for p in (a, b, c)] == [
        (3, 1),
        (3, 2),
        (3, 1),
    ]
    assert [len(stack.violations(p)) for p in (a, b, c)] == [1, 2, 1]
    assert {e["action"] for e in stack.violations(c)} == {"REPORTED"}


def test_several_policies_with_blockers_only_the_first_counts(stack: Stack) -> None:
    """Spec case 2: the first blocking policy (blocking ones first, by name) counts and reports; the
    others, blocking or not, see nothing of the batch."""
    topic = create_topic(stack.broker, unique("dq-blockers"))
    base = unique("blk")
    first, second, watcher = f"{base}-1", f"{base}-2", f"{base}-0-watch"  # the watcher sorts first by name
    stack.apply(
        cel_rule(f"{base}-positive", "value.amount > 0"),
        policy(first, [f"{base}-positive"], [topic], cluster=stack.cluster, block=True, mark=True),
        policy(second, [f"{base}-positive"], [topic], cluster=stack.cluster, block=True),
        policy(watcher, [f"{base}-positive"], [topic], cluster=stack.cluster, mark=True),
    )
    from confluent_kafka import KafkaError

    errors = produce_confluent(stack.gateway.bootstrap, topic, [GOOD, NEGATIVE])
    assert [e.code() for e in errors] == [KafkaError.INVALID_RECORD] * 2
    assert produce_confluent(stack.gateway.bootstrap, topic, [GOOD]) == [None]
    received = consume_direct(stack.broker, topic, 1)
    assert MARK_HEADER not in headers_of(received[0])  # block and mark: only block applies
    wait_for(lambda: stack.metrics(first)["violations"] == 1 or None)
    wait_for(lambda: stack.metrics(watcher)["evaluated"] == 1 or None)
    assert (stack.metrics(first)["evaluated"], stack.metrics(first)["violations"]) == (1 + 1, 1)
    assert (stack.metrics(second)["evaluated"], stack.metrics(second)["violations"]) == (1, 0)
    assert (stack.metrics(watcher)["evaluated"], stack.metrics(watcher)["violations"]) == (1, 0)
    assert len(stack.violations(first)) == 1 and stack.violations(second) == stack.violations(watcher) == []


def test_errors_table(stack: Stack) -> None:
    """Every row of the spec's Errors table that the API answers, with a 400 saying why."""
    name = unique("err")
    topic = unique("dq-errors")
    stack.apply(cel_rule(f"{name}-ok", "value.amount > 0"))

    def refused(path: str, manifest: dict[str, Any], why: str) -> None:
        status, answer = stack.http.put(f"/gateway/v2/{path}", manifest)
        assert status == 400, answer
        assert why in answer["msg"], answer["msg"]

    ok = policy(name, [f"{name}-ok"], [topic], cluster=stack.cluster)
    refused("data-quality-policy", {**ok, "spec": {**ok["spec"], "rules": []}}, "at least one rule")
    refused("data-quality-policy", {**ok, "spec": {**ok["spec"], "targets": []}}, "at least one target")
    refused("data-quality-policy", {**ok, "spec": {**ok["spec"], "rules": ["nope"]}}, "unknown rule 'nope'")
    mixed = [
        {"cluster": stack.cluster, "topic": topic, "patternType": "LITERAL"},
        {"cluster": "legacy", "topic": topic, "patternType": "LITERAL"},
    ]
    refused("data-quality-policy", {**ok, "spec": {**ok["spec"], "targets": mixed}}, "cannot mix")
    observed = policy(name, [f"{name}-ok"], [topic], cluster="legacy", block=True)
    refused("data-quality-policy", observed, "actions need a gateway")
    refused("data-quality-policy", policy(name, [f"{name}-ok"], [topic], cluster="elsewhere"), "unknown cluster")
    refused("data-quality-rule", cel_rule(f"{name}-bad", "value.amount >"), "invalid CEL expression")
    refused("data-quality-rule", schema_rule(f"{name}-bad", {"type": "nonsense"}), "invalid JSON schema")
    refused("data-quality-rule", {**cel_rule(f"{name}-v", "true"), "apiVersion": "gateway/v2"}, "apiVersion must be v1")
    assert stack.http.get(f"/gateway/v2/data-quality-policy/{name}")[0] == 404  # nothing was stored

    # rule test: bad CEL syntax and a wrong data format are evaluation errors
    test = "/gateway/v2/data-quality/test-rule"
    status, answer = stack.http.call(
        "POST", test, {"rule": {"type": "Cel", "celExpression": "value.a >"}, "value": "{}"}
    )
    assert (status, answer["result"]) == (200, "evaluationError") and "syntax error" in answer["message"]
    body = {"rule": {"type": "JsonSchema", "schema": {"type": "object"}}, "value": "not json"}
    status, answer = stack.http.call("POST", test, body)
    assert answer["result"] == "evaluationError" and "wrong data format" in answer["message"]
    # no custom message: "<RULE_NAME> did not pass"
    status, answer = stack.http.call("POST", test, {"rule": f"{name}-ok", "value": '{"amount": -1}'})
    assert answer == {"rule": f"{name}-ok", "result": "failed", "message": f"{name}-ok did not pass"}
    assert stack.http.call("POST", test, {"rule": f"{name}-ok", "value": '{"amount": 1}'})[1]["result"] == "passed"
    # numbers are generic after JSON conversion: an integral 3.0 is not a CEL int
    body = {"rule": {"type": "Cel", "celExpression": "type(value.n) == int"}, "value": '{"n": 3.0}'}
    assert stack.http.call("POST", test, body)[1]["result"] == "failed"
    body = {"rule": {"type": "Cel", "celExpression": "value.n > 2 && value.n < 4"}, "value": '{"n": 3.0}'}
    assert stack.http.call("POST", test, body)[1]["result"] == "passed"


def test_deployment_problem_is_a_failed_status(stack: Stack) -> None:
    """A policy whose rule was deleted reports Failed (and keeps enforcing its other rules)."""
    topic = unique("dq-failed")
    name = unique("fail")
    stack.apply(
        cel_rule(f"{name}-a", "value.amount > 0"),
        cel_rule(f"{name}-b", "value.currency == 'EUR'"),
        policy(name, [f"{name}-a", f"{name}-b"], [topic], cluster=stack.cluster),
    )
    assert stack.http.call("DELETE", f"/gateway/v2/data-quality-rule/{name}-b")[0] == 204
    stack.apply(policy(f"{name}-other", [f"{name}-a"], [topic], cluster=stack.cluster))  # policies re-applied
    _status, current = stack.http.get(f"/gateway/v2/data-quality-policy/{name}")
    assert current["status"]["status"] == "Failed" and f"{name}-b" in current["status"]["message"]


def test_rule_test_cli_and_apply_cli(stack: Stack, tmp_path: Path) -> None:
    name = unique("cli")
    manifest = tmp_path / "dq.yaml"
    manifest.write_text(
        "\n---\n".join(
            json.dumps(m)
            for m in (
                cel_rule(f"{name}-hdr", "headers['x-source'] == 'web' && value.amount > 0", message="web orders only"),
                policy(name, [f"{name}-hdr"], [unique("dq-cli")], cluster=stack.cluster),
            )
        )
    )
    base = ["--url", stack.http.base, "--user", "admin", "--password", "secret"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert kanal_main(["apply", "-f", str(manifest), *base]) == 0
    assert f"DataQualityPolicy/{name}: CREATED [Ready]" in out.getvalue()

    def test_rule(*args: str) -> tuple[int, str]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = kanal_main(["test-rule", *args, *base])
        return code, out.getvalue().strip()

    value = '{"amount": 5}'
    assert test_rule("--rule", f"{name}-hdr", "--value", value, "--header", "x-source=web") == (0, "passed")
    assert test_rule("--rule", f"{name}-hdr", "--value", value, "--header", "x-source=app") == (
        2,
        "failed: web orders only",
    )
    code, text = test_rule("--rule", f"{name}-hdr", "--value", value)
    assert code == 3 and text.startswith("evaluation error:") and "x-source" in text
    assert test_rule("--cel", "key == 'k1'", "--key", "k1", "--value", "{}") == (0, "passed")


def test_metrics_endpoints_and_prometheus(stack: Stack) -> None:
    topic = create_topic(stack.broker, unique("dq-prom"))
    name = unique("prom")
    stack.apply(
        schema_rule(f"{name}-schema", {"type": "object", "required": ["amount"]}),
        policy(name, [f"{name}-schema"], [topic], cluster=stack.cluster),
    )
    bad = json.dumps({"currency": "EUR"}).encode()
    assert produce_confluent(stack.gateway.bootstrap, topic, [GOOD, bad, bad]) == [None] * 3
    status, text = stack.http.get("/metrics", user=None)
    samples = {
        (s.name, s.labels.get("policy")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("gateway_data_quality_messages_evaluated_total", name)] == 3
    assert samples[("gateway_data_quality_violations_total", name)] == 2
    for range_name in ("30m", "1h", "1d", "7d"):
        status, answer = stack.http.get(f"/gateway/v2/data-quality/policies/{name}/metrics?range={range_name}")
        assert status == 200 and answer["range"] == range_name and answer["graph"]
    wait_for(lambda: stack.metrics(name)["violations"] == 2 or None)
    status, listing = stack.http.get("/gateway/v2/data-quality/metrics?range=1d")
    assert {"policy": name, "range": "1d", "evaluated": 3, "violations": 2} in listing
    entry = stack.violations(name)[0]
    assert entry["details"][0]["reason"].startswith("$: ")  # the schema's reason
    assert stack.http.get(f"/gateway/v2/data-quality/policies/{name}/metrics?range=2h")[0] == 400
    assert stack.http.get("/gateway/v2/data-quality/policies/nope/metrics")[0] == 404


def test_alert_fires_once_then_rearms(stack: Stack) -> None:
    topic = create_topic(stack.broker, unique("dq-alert"))
    name = unique("alert")
    window = 3
    stack.apply(
        cel_rule(f"{name}-positive", "value.amount > 0"),
        policy(name, [f"{name}-positive"], [topic], cluster=stack.cluster),
        {
            "apiVersion": "v3",
            "kind": "Alert",
            "metadata": {"name": name, "group": "team-a"},
            "spec": {
                "type": "DataQualityPolicyAlert",
                "policyName": name,
                "triggerAfter": 3,
                "withinInSeconds": window,
                "destination": {"type": "Webhook", "url": stack.hook.url},
            },
        },
    )

    def alert_state() -> dict[str, Any]:
        status, alerts = stack.http.get("/gateway/v2/data-quality/alerts")
        assert status == 200, alerts
        return next(a for a in alerts if a["name"] == name)

    assert produce_confluent(stack.gateway.bootstrap, topic, [NEGATIVE, NEGATIVE]) == [None] * 2
    # the alert has counted both violations (it fires, if at all, as it counts them) ...
    wait_for(lambda: alert_state()["violationsInWindow"] == 2)
    assert alert_state()["timesFired"] == 0
    assert not [h for h in stack.hook.received if h["alert"] == name]  # 2 < 3
    assert produce_confluent(stack.gateway.bootstrap, topic, [NEGATIVE, NEGATIVE]) == [None] * 2
    fired = wait_for(lambda: [h for h in stack.hook.received if h["alert"] == name])
    assert fired[0]["policyName"] == name and fired[0]["violations"] >= 3 and fired[0]["triggerAfter"] == 3

    def gauge() -> float:
        text = stack.http.get("/metrics", user=None)[1]
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "gateway_data_quality_alert_firing" and s.labels.get("alert") == name:
                    return float(s.value)
        return -1.0

    assert gauge() == 1.0
    assert "ALERT_FIRED" in stack.gateway.output and name in stack.gateway.output  # the audit event
    # firing: more violations within the window do not fire again
    assert produce_confluent(stack.gateway.bootstrap, topic, [NEGATIVE] * 3) == [None] * 3
    # the counts come through the history topic after the violations, so the alert has seen all 7
    wait_for(lambda: stack.metrics(name)["violations"] == 2 + 2 + 3 or None)
    assert alert_state()["timesFired"] == 1
    assert len([h for h in stack.hook.received if h["alert"] == name]) == 1
    wait_for(lambda: gauge() == 0.0, timeout=window + 3)  # re-armed after the window
    assert produce_confluent(stack.gateway.bootstrap, topic, [NEGATIVE] * 3) == [None] * 3
    wait_for(lambda: len([h for h in stack.hook.received if h["alert"] == name]) == 2)
    status, alerts = stack.http.get("/gateway/v2/data-quality/alerts")
    assert next(a for a in alerts if a["name"] == name)["timesFired"] == 2
    # an alert on an unknown policy is refused
    status, answer = stack.http.put(
        "/gateway/v2/alert",
        {
            "apiVersion": "v3",
            "kind": "Alert",
            "metadata": {"name": unique("orphan")},
            "spec": {"type": "DataQualityPolicyAlert", "policyName": "nope", "triggerAfter": 1, "withinInSeconds": 1},
        },
    )
    assert status == 400 and "unknown policy" in answer["msg"]


def test_group_permissions(stack: Stack) -> None:
    name = unique("perm")
    topic = unique("dq-perm")
    rule = cel_rule(f"{name}-r", "true")
    mine = policy(name, [f"{name}-r"], [topic], cluster=stack.cluster, group="team-a")
    theirs = policy(f"{name}-b", [f"{name}-r"], [topic], cluster=stack.cluster, group="team-b")
    alice, viewer = ("alice", "wonder"), ("viewer", "look")
    base = "/gateway/v2/data-quality"
    # the generic routes stay admin-only
    assert stack.http.put("/gateway/v2/data-quality-rule", rule, user=alice)[0] == 403
    # the plugin's routes let a ManageDataQuality member manage rules and their group's policies
    assert stack.http.put(f"{base}/data-quality-rule", rule, user=alice)[0] == 200
    assert stack.http.put(f"{base}/data-quality-policy", mine, user=alice)[0] == 200
    status, answer = stack.http.put(f"{base}/data-quality-policy", theirs, user=alice)
    assert status == 403 and "team-b" in answer["msg"]
    assert stack.http.put(f"{base}/data-quality-rule", rule, user=viewer)[0] == 403
    assert stack.http.put(f"{base}/data-quality-policy", theirs)[0] == 200  # an admin may
    # alice may no longer change a rule that team-b's policy uses
    status, answer = stack.http.put(f"{base}/data-quality-rule", cel_rule(f"{name}-r", "false"), user=alice)
    assert status == 403 and f"{name}-b" in answer["msg"]
    assert stack.http.call("DELETE", f"{base}/data-quality-policy/{name}-b", user=alice)[0] == 403
    assert stack.http.call("DELETE", f"{base}/data-quality-policy/{name}", user=alice)[0] == 204


def test_cluster_without_gateway_is_observed(stack: Stack) -> None:
    """A policy on a cluster without a gateway (here: the same broker, declared as cluster "legacy") is
    evaluated by consuming its topics after the records are written: counts and history, no action."""
    topic = create_topic(stack.broker, unique("dq-observed"), partitions=2)
    name = unique("observe")
    stack.apply(
        cel_rule(f"{name}-positive", "value.amount > 0"),
        policy(name, [f"{name}-positive"], [topic], cluster="legacy"),
    )
    wait_for(lambda: f"{topic}-1" in stack.http.get("/gateway/v2/data-quality/observer")[1].get("legacy", {}))
    # written directly to the broker: nothing can block or mark them
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": stack.broker.bootstrap, "linger.ms": 10})
    for i, value in enumerate([GOOD, NEGATIVE, NEGATIVE, GOOD]):
        producer.produce(topic, value=value, partition=i % 2)
    assert producer.flush(TIMEOUT) == 0
    wait_for(lambda: stack.metrics(name)["evaluated"] == 4 or None)
    assert stack.metrics(name)["violations"] == 2
    entries = stack.violations(name)
    assert len(entries) == 2 and {e["action"] for e in entries} == {"OBSERVED"}
    assert {e["cluster"] for e in entries} == {"legacy"} and {e["partition"] for e in entries} == {0, 1}
    assert all(MARK_HEADER not in headers_of(m) for m in consume_direct(stack.broker, topic, 4, partitions=2))
