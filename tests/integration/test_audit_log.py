"""The audit log in Kafka, with gateway processes (``kanal run``) in front of a real Tansu broker.

A gateway with SASL PLAIN (gateway tokens) and the admin API: an admin creates a service account and
mints its token, a client logs in with it, another is refused. Each of these is an event in the topic
``_kanal_<cluster>_auditlogs`` (read here with confluent-kafka, straight from the broker), with the
client's ``host:port``, and nothing secret; ``GET /gateway/v2/audit`` filters them; a restarted
gateway still finds them.
"""

from __future__ import annotations

import base64
import datetime
import re
import secrets
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

from kanal.embedded import GatewayProcess, TansuBroker
from kanal.embedded.admin_http import AdminHttp

pytestmark = pytest.mark.integration

ADMIN_PASSWORD = secrets.token_hex(12)
ADMIN = ("admin", ADMIN_PASSWORD)
VIEWER = ("viewer", "look")
USERS = f"[{{username: admin, password: {ADMIN_PASSWORD}, admin: true}}, {{username: viewer, password: look}}]"
KEY = base64.b64encode(secrets.token_bytes(32)).decode()
WRONG_PASSWORD = "not-the-token-" + secrets.token_hex(8)
RETENTION_MS = "3600000"


def gateway_env(tansu: TansuBroker, cluster_id: str) -> dict[str, str]:
    return {
        **tansu.gateway_settings(),
        "GATEWAY_CLUSTER_ID": cluster_id,
        "GATEWAY_ADMIN_API_USERS": USERS,
        "GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "GATEWAY_USER_POOL_SECRET_KEY": KEY,
        "GATEWAY_AUDIT_LOG_RETENTION_MS": RETENTION_MS,
    }


def wait_for(condition: Callable[[], Any], timeout: float = 20.0) -> Any:
    """``condition()``'s first truthy answer; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        answer = condition()
        if answer:
            return answer
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout}s")
        time.sleep(0.05)


def producer(gateway: GatewayProcess, username: str, password: str, errors: list[KafkaError]) -> Producer:
    return Producer(
        {
            "bootstrap.servers": gateway.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": username,
            "sasl.password": password,
            "message.timeout.ms": 10000,
            "error_cb": errors.append,
        }
    )


def refused_login(gateway: GatewayProcess) -> None:
    """A client logs in with a wrong password, until it reports the refusal; then it is gone (no
    more attempts)."""
    errors: list[KafkaError] = []
    bad = producer(gateway, "orders-app", WRONG_PASSWORD, errors)

    def was_refused() -> bool:
        bad.poll(0.2)
        return any(e.code() == KafkaError._AUTHENTICATION for e in errors)

    wait_for(was_refused)


class TopicReader:
    """Partition 0 of the audit log topic, read from the broker with confluent-kafka."""

    def __init__(self, tansu: TansuBroker, topic: str) -> None:
        self.consumer = Consumer({"bootstrap.servers": tansu.bootstrap, "group.id": f"audit-{uuid.uuid4().hex}"})
        self.consumer.assign([TopicPartition(topic, 0, 0)])
        self.raw: list[bytes] = []

    def events(self) -> list[dict[str, Any]]:
        while (message := self.consumer.poll(0.2)) is not None:
            value = message.value()
            if not message.error() and value is not None:
                self.raw.append(value)
        return [orjson.loads(value) for value in self.raw]

    def close(self) -> None:
        self.consumer.close()


@dataclass
class Story:
    """What the module's gateway went through, and what it wrote."""

    gateway: GatewayProcess
    http: AdminHttp
    env: dict[str, str]
    topic: str
    token: str
    events: list[dict[str, Any]]
    raw: list[bytes]


@pytest.fixture(scope="module")
def story(tansu: TansuBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    cluster_id = f"audit-{uuid.uuid4().hex[:8]}"
    env = gateway_env(tansu, cluster_id)
    gateway = GatewayProcess(env, log_path=tmp_path_factory.mktemp("audit") / "gateway.log").start(timeout=30)
    http = AdminHttp(env["GATEWAY_HTTP_PORT"])
    reader = TopicReader(tansu, f"_kanal_{cluster_id}_auditlogs")
    try:
        account = {"apiVersion": "gateway/v2", "kind": "GatewayServiceAccount"}
        status, _ = http.put(
            "/gateway/v2/service-account",
            {**account, "metadata": {"name": "orders-app"}, "spec": {"type": "LOCAL"}},
            user=ADMIN,
        )
        assert status == 200
        status, body = http.call(
            "POST", "/gateway/v2/token", {"username": "orders-app", "lifeTimeSeconds": 600}, user=ADMIN
        )
        assert status == 200
        token = body["token"]

        errors: list[KafkaError] = []
        good = producer(gateway, "orders-app", token, errors)
        delivered: list[KafkaError | None] = []
        good.produce("audit-orders", b"v", on_delivery=lambda err, _msg: delivered.append(err))
        good.flush(15)
        assert delivered == [None], errors

        refused_login(gateway)

        def written() -> list[dict[str, Any]] | None:
            events = reader.events()
            data = [e["eventData"] for e in events]
            if "SUCCESS" in data and any(isinstance(d, str) and d != "SUCCESS" for d in data) and len(data) >= 4:
                return events
            return None

        events = wait_for(written)
        yield Story(gateway, http, env, f"_kanal_{cluster_id}_auditlogs", token, events, reader.raw)
    finally:
        reader.close()
        code = gateway.stop(timeout=15)
    assert code == 0, f"gateway exited with {code}:\n{gateway.tail()}"


def test_logins_and_admin_changes_are_events_in_the_topic_with_the_clients_host_and_port(story: Story) -> None:
    port_start = int(story.env["GATEWAY_PORT_START"])
    for event in story.events:
        assert set(event) == {
            "id",
            "source",
            "type",
            "authenticationPrincipal",
            "userName",
            "connection",
            "specVersion",
            "time",
            "eventData",
        }
        assert uuid.UUID(event["id"]) and event["specVersion"] == "0.1.0"
        assert event["source"] == f"kanal://127.0.0.1:{port_start}"
        assert datetime.datetime.fromisoformat(event["time"]).tzinfo == datetime.UTC
        assert event["authenticationPrincipal"] == "passthrough"
        assert re.fullmatch(r"127\.0\.0\.1:\d+", event["connection"]["remoteAddress"]), event

    logins = [e for e in story.events if e["type"] == "AUTHENTICATION"]
    successes = [e for e in logins if e["eventData"] == "SUCCESS"]  # one per connection (bootstrap, broker)
    assert successes
    for success in successes:
        assert success["userName"] == "orders-app"
        assert success["connection"]["localAddress"] in {f"127.0.0.1:{port_start + i}" for i in range(3)}
        # The address the gateway's own log names for that login: the client's host:port.
        assert f"client {success['connection']['remoteAddress']} authenticated as orders-app" in story.gateway.output
    failures = [e for e in logins if e["eventData"] != "SUCCESS"]
    # A refused client has no principal: the event names the user it claimed to be.
    assert failures and all(e["userName"] == "orders-app" and e["eventData"] for e in failures)

    admin = [e for e in story.events if e["type"] == "ADMIN_API_CALL"]
    assert [(e["eventData"]["action"], e["eventData"]["resourceName"]) for e in admin] == [
        ("UPSERT", "orders-app"),
        ("MINT_TOKEN", "orders-app"),
    ]
    assert all(e["userName"] == "admin" for e in admin)
    assert {e["connection"]["localAddress"] for e in admin} == {f"127.0.0.1:{story.env['GATEWAY_HTTP_PORT']}"}


def test_nothing_secret_is_in_any_event(story: Story) -> None:
    everything = b"\n".join(story.raw)
    for secret in (story.token, WRONG_PASSWORD, ADMIN_PASSWORD, KEY):
        assert secret.encode() not in everything
    assert story.token not in story.gateway.output and WRONG_PASSWORD not in story.gateway.output


def test_the_gateway_creates_the_topic_with_the_delete_policy_and_the_retention(
    story: Story, tansu: TansuBroker
) -> None:
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, story.topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=15)
    assert configs["cleanup.policy"].value == "delete"
    assert configs["retention.ms"].value == RETENTION_MS


def get(story: Story, query: str = "") -> list[dict[str, Any]]:
    status, body = story.http.get("/gateway/v2/audit" + query, user=VIEWER)
    assert status == 200, body
    assert isinstance(body, list)
    return body


def test_the_route_serves_the_events_newest_first_and_filters_them(story: Story) -> None:
    everything = get(story)
    assert {e["id"] for e in story.events} <= {e["id"] for e in everything}
    times = [datetime.datetime.fromisoformat(e["time"]) for e in everything]
    assert times == sorted(times, reverse=True)
    assert len(get(story, "?limit=1")) == 1

    logins = get(story, "?type=AUTHENTICATION&principal=orders-app")
    assert logins and all(e["type"] == "AUTHENTICATION" and e["userName"] == "orders-app" for e in logins)
    assert "SUCCESS" in [e["eventData"] for e in logins]
    admin = get(story, "?type=admin_api_call")
    assert [e["eventData"]["action"] for e in admin] == ["MINT_TOKEN", "UPSERT"]
    assert get(story, "?type=ADMIN_API_CALL&limit=1") == admin[:1]

    minted = admin[0]
    at_ms = int(datetime.datetime.fromisoformat(minted["time"]).timestamp() * 1000)
    since = get(story, f"?type=ADMIN_API_CALL&from={minted['time']}")
    assert [e["id"] for e in since] == [minted["id"]]
    before = get(story, f"?type=ADMIN_API_CALL&to={at_ms - 1}")
    assert [e["eventData"]["action"] for e in before] == ["UPSERT"]


def test_a_bad_filter_is_refused_naming_it(story: Story) -> None:
    status, body = story.http.get("/gateway/v2/audit?from=last-week", user=VIEWER)
    assert status == 400 and body["msg"].startswith("from: ")
    status, body = story.http.get("/gateway/v2/audit?user=orders-app", user=VIEWER)
    assert status == 400 and body["msg"].startswith("user: unknown filter")


def test_a_restarted_gateway_finds_the_events_of_its_earlier_run(tansu: TansuBroker, tmp_path: Path) -> None:
    env = gateway_env(tansu, f"audit-restart-{uuid.uuid4().hex[:8]}")
    http = AdminHttp(env["GATEWAY_HTTP_PORT"])
    first = GatewayProcess(env, log_path=tmp_path / "first.log").start(timeout=30)
    try:
        manifest = {
            "apiVersion": "gateway/v2",
            "kind": "GatewayServiceAccount",
            "metadata": {"name": "before-restart"},
            "spec": {"type": "LOCAL"},
        }
        assert http.put("/gateway/v2/service-account", manifest, user=ADMIN)[0] == 200
        status, (change,) = http.get("/gateway/v2/audit?type=ADMIN_API_CALL", user=ADMIN)
        assert status == 200 and change["eventData"]["resourceName"] == "before-restart"
    finally:
        assert first.stop(timeout=15) == 0, first.tail()

    second = GatewayProcess(env, log_path=tmp_path / "second.log").start(timeout=30)
    try:

        def read_back() -> list[dict[str, Any]]:
            status, found = http.get("/gateway/v2/audit?type=ADMIN_API_CALL", user=ADMIN)
            return found if status == 200 else []

        assert [e["id"] for e in wait_for(read_back)] == [change["id"]]
    finally:
        assert second.stop(timeout=15) == 0, second.tail()
