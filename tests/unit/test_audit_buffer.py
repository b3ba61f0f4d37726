"""The audit log with in-memory topics: buffering, batches, dropping when the cluster is away, reading
back, and its emitters (logins, admin API changes, plugins) and its route, GET /gateway/v2/audit."""

from __future__ import annotations

import base64
import logging
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, ClassVar, cast

import orjson
import pytest
import trio
import trio.testing
from admin_harness import serve_admin
from kanal_dataquality.interceptor import DataQualityInterceptor
from kio.schema.create_topics.v7 import request as create_topics_v7
from kio.schema.types import TopicName
from kio.static.primitive import i16, i32

from kanal.admin.app import AdminApi
from kanal.admin.service import build_admin
from kanal.admin.store import MemoryLog
from kanal.api import (
    ApiKey,
    Connection,
    ErrorCode,
    GatewayServices,
    Interceptor,
    LogRecord,
    PartitionError,
    Record,
    RecordsContext,
    RecordSet,
    Reject,
    RequestContext,
    RequestResult,
    encode_batch,
    hookimpl,
)
from kanal.api.errors import LogError
from kanal.api.interceptor import validate_config
from kanal.audit import AuditLog, AuditQuery, audit_log_topic
from kanal.audit.events import iso_time, make_event
from kanal.config.settings import build_settings
from kanal.gateway import Gateway
from kanal.metrics import GatewayMetrics
from kanal.pipeline.registry import PluginRegistry
from kanal.protocol.messages import decode_request, encode_request
from kanal.testing import FakeServices, Harness, MemoryStateLog

USERS = "[{username: admin, password: s3cr3t-admin, admin: true}, {username: viewer, password: look}]"
ADMIN = {"Authorization": "Basic " + base64.b64encode(b"admin:s3cr3t-admin").decode()}
VIEWER = {"Authorization": "Basic " + base64.b64encode(b"viewer:look").decode()}
CLIENT = Connection(id=7, client_address="::1:53422", listener_address="127.0.0.1:6969", node_id=111)


class FlakyLog(MemoryStateLog):
    """A topic whose cluster can be away (``down``): every call fails then."""

    def __init__(self, topic: str = "audit") -> None:
        super().__init__(topic)
        self.down = False
        self.batches: list[int] = []
        self.read_to = 0  # the offset after the last record read

    async def ensure_topic(self) -> None:
        if self.down:
            raise LogError("cannot reach the backing cluster: connection refused")
        await super().ensure_topic()

    async def append_many(self, items: Sequence[tuple[bytes, bytes | None]]) -> int:
        if self.down:
            raise LogError("cannot reach the backing cluster: connection refused")
        self.batches.append(len(items))
        return await super().append_many(items)

    async def read(self, offset: int, max_wait: float = 0.5) -> tuple[list[LogRecord], int]:
        records, next_offset = await super().read(offset, max_wait)
        self.read_to = next_offset
        return records, next_offset


def audit_log(topic: MemoryStateLog, **kw: Any) -> tuple[AuditLog, GatewayMetrics]:
    metrics = GatewayMetrics()
    return AuditLog("audit", "kanal://gw-1:6969", metrics, topic, topic, **kw), metrics


def login(log: AuditLog, user: str | None = "orders-app", failure: str | None = None) -> None:
    log.authentication(Connection(1, "10.0.0.9:5000", "127.0.0.1:6969", 111, principal=user), failure)


def sample(metrics: GatewayMetrics, name: str) -> float:
    return metrics.registry.get_sample_value(name) or 0.0


async def wait_until(condition: Callable[[], bool]) -> None:
    while not condition():
        await trio.sleep(0.01)


def written(topic: MemoryStateLog) -> list[dict[str, Any]]:
    return [orjson.loads(r.value) for r in topic.records if r.value is not None]


def test_events_are_written_in_batches_keyed_by_their_id() -> None:
    topic = FlakyLog()
    log, metrics = audit_log(topic)

    async def main() -> None:
        for i in range(1200):
            login(log, f"user-{i}")
        async with trio.open_nursery() as nursery:
            await nursery.start(log.run)
            await wait_until(lambda: len(topic.records) == 1200)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert topic.created
    assert topic.batches == [500, 500, 200]
    assert [e["userName"] for e in written(topic)] == [f"user-{i}" for i in range(1200)]
    assert all(r.key == orjson.loads(r.value or b"")["id"].encode() for r in topic.records)
    assert sample(metrics, "gateway_audit_events_written_total") == 1200
    assert sample(metrics, "gateway_audit_events_pending") == 0


def test_when_the_cluster_is_away_the_oldest_events_are_dropped_counted_and_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kanal.audit")
    topic = FlakyLog()
    topic.down = True
    log, metrics = audit_log(topic, buffer_size=5)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(log.run)
            for i in range(8):
                login(log, f"user-{i}")  # returns at once: a login never waits for the audit log
            assert log.pending == 5
            await wait_until(lambda: "cannot write audit" in caplog.text)
            topic.down = False
            await wait_until(lambda: len(topic.records) == 5)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert [e["userName"] for e in written(topic)] == [f"user-{i}" for i in range(3, 8)]
    assert sample(metrics, "gateway_audit_events_dropped_total") == 3
    assert caplog.text.count("dropping the oldest") == 1  # one warning, not one per event
    assert "writing to audit again" in caplog.text
    # This node still answers for what it dropped: the index has every event it made.
    assert len(log.query(AuditQuery(limit=100))) == 8


def test_events_of_other_nodes_and_earlier_runs_are_read_back() -> None:
    topic = FlakyLog()
    earlier = make_event(
        "ADMIN_API_CALL",
        source="kanal://gw-2:6969",
        user="admin",
        vcluster=None,
        local_address="10.0.0.2:8888",
        remote_address="10.0.0.3:40000",
        event_data={"action": "UPSERT"},
        time=iso_time(1_700_000_000),
    )

    async def main() -> None:
        await topic.append_many([(b"not-an-event", b"{}"), (earlier["id"].encode(), orjson.dumps(earlier))])
        log, _ = audit_log(topic)
        login(log)
        log.follow_topic()
        async with trio.open_nursery() as nursery:
            await nursery.start(log.run)
            await log.loaded.wait()
            assert [e["type"] for e in log.query(AuditQuery())] == ["AUTHENTICATION", "ADMIN_API_CALL"]
            late = {**earlier, "id": "from-gw-2", "time": "2030-01-01T00:00:00Z"}
            await topic.append(b"from-gw-2", orjson.dumps(late))
            await wait_until(lambda: log.query(AuditQuery(limit=1))[0]["id"] == "from-gw-2")
            await wait_until(lambda: topic.read_to == 4)  # this node's login, written once and read back
            assert len(log.query(AuditQuery())) == 3  # indexed once
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_only_the_end_of_a_long_topic_is_read_back() -> None:
    topic = FlakyLog()

    async def main() -> None:
        for i in range(30):
            made = make_event(
                "AUTHENTICATION",
                source="s",
                user=f"user-{i}",
                vcluster=None,
                local_address=None,
                remote_address=None,
                event_data="SUCCESS",
                time=iso_time(1_700_000_000 + i),
            )
            await topic.append(made["id"].encode(), orjson.dumps(made))
        log, _ = audit_log(topic, read_back=10)
        log.follow_topic()
        async with trio.open_nursery() as nursery:
            await nursery.start(log.run)
            await log.loaded.wait()
            nursery.cancel_scope.cancel()
        assert [e["userName"] for e in log.query(AuditQuery())] == [f"user-{i}" for i in range(29, 19, -1)]

    trio.run(main)


def test_the_topic_is_not_touched_before_an_event_or_the_route_needs_it() -> None:
    """A gateway without logins, admin API or plugin decisions (a conformance replay) talks to its
    cluster exactly as before."""
    topic = FlakyLog()
    log, _ = audit_log(topic)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(log.run)
            await trio.testing.wait_all_tasks_blocked()
            assert not topic.created and topic.read_to == 0
            login(log)
            await wait_until(lambda: len(topic.records) == 1)
            await trio.testing.wait_all_tasks_blocked()
            assert topic.read_to == 0  # written, not followed
            log.follow_topic()
            await wait_until(lambda: topic.read_to == 1)
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_events_still_waiting_are_written_at_shutdown() -> None:
    topic = FlakyLog()
    log, _ = audit_log(topic)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(log.run)
            login(log, "last-one")
            nursery.cancel_scope.cancel()  # the gateway stops before the write loop runs

    trio.run(main)
    assert [e["userName"] for e in written(topic)] == ["last-one"]
    assert topic.closed


def gateway(**env: str) -> Gateway:
    settings = build_settings(
        {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "GATEWAY_ADMIN_API_USERS": USERS, "GATEWAY_CLUSTER_ID": "eu", **env}
    )
    return Gateway(settings, PluginRegistry())


def test_the_gateway_audits_every_login_with_the_clients_address() -> None:
    gw = gateway(GATEWAY_ADVERTISED_HOST="gw-1.example", GATEWAY_PORT_START="7000")
    assert gw.audit_log.topic == "_kanal_eu_auditlogs" and gw.audit_log.run in gw.services
    info = Connection(3, "::1:53422", "127.0.0.1:7000", 111)
    gw.authentication_outcome(info, "PLAIN", "invalid credentials")
    gw.authentication_outcome(info, "PLAIN", "invalid credentials", "intruder")
    info.principal, info.vcluster = "orders-app", "tenant-a"
    gw.authentication_outcome(info, "PLAIN", None)
    success, claimed, failure = gw.audit_log.query(AuditQuery())
    assert failure["eventData"] == "invalid credentials" and failure["userName"] is None
    assert claimed["userName"] == "intruder"  # the name a refused client claimed
    assert failure["authenticationPrincipal"] == "passthrough"
    assert success["eventData"] == "SUCCESS" and success["userName"] == "orders-app"
    assert success["authenticationPrincipal"] == "tenant-a"
    assert success["connection"] == {"localAddress": "127.0.0.1:7000", "remoteAddress": "[::1]:53422"}
    assert success["source"] == "kanal://gw-1.example:7000"


def test_the_topic_is_named_by_the_settings_and_the_feature_flag_turns_the_log_off() -> None:
    assert audit_log_topic(gateway(GATEWAY_AUDIT_LOG_TOPIC="audit").settings) == "audit"
    off = gateway(GATEWAY_FEATURE_FLAGS_AUDIT="false")
    assert not off.audit_log.enabled and off.audit_log.run not in off.services
    off.authentication_outcome(CLIENT, "PLAIN", None)
    assert off.audit_log.query(AuditQuery()) == [] and off.audit_log.pending == 0


def test_plugins_audit_their_decisions_through_their_services() -> None:
    gw = gateway()
    services = gw.services_for("my-policy")
    services.audit("SAFEGUARD", CLIENT, {"decision": "BLOCK", "topic": "orders"})
    services.audit("SAFEGUARD", None, "a decision about no client")
    alone, about_client = gw.audit_log.query(AuditQuery(types=frozenset({"SAFEGUARD"})))
    assert about_client["eventData"] == {"decision": "BLOCK", "topic": "orders"}
    assert about_client["connection"]["remoteAddress"] == "[::1]:53422"
    assert alone["connection"] == {"localAddress": None, "remoteAddress": None}


def test_a_data_quality_block_is_an_audit_event() -> None:
    services = FakeServices(cluster_id="gateway")
    rule = {
        "apiVersion": "v1",
        "kind": "DataQualityRule",
        "metadata": {"name": "positive"},
        "spec": {"type": "Cel", "displayName": "positive", "celExpression": "value.amount > 0"},
    }
    policy = {
        "apiVersion": "v1",
        "kind": "DataQualityPolicy",
        "metadata": {"name": "p", "group": "g"},
        "spec": {
            "displayName": "p",
            "rules": ["positive"],
            "targets": [{"cluster": "gateway", "topic": "orders"}],
            "actions": {"block": {"enabled": True}},
        },
    }
    config = validate_config(DataQualityInterceptor, {"rules": [rule], "policies": [policy]})
    interceptor = DataQualityInterceptor(config, cast(GatewayServices, services))
    data = encode_batch([Record(value=orjson.dumps({"amount": -1}), key=b"k")], base_timestamp=1)
    ctx = RecordsContext(CLIENT, 0, 9, "client-1", "orders", 0, RecordSet.parse(data))
    assert isinstance(interceptor.kanal_produce_records(ctx), PartitionError)
    ((event_type, connection, event_data),) = services.audited
    assert (event_type, connection) == ("DATA_QUALITY", CLIENT)
    assert event_data["action"] == "BLOCKED" and event_data["topic"] == "orders"
    assert "'p' blocked the batch" in event_data["reason"]


class ReservedNames(Interceptor):
    """Refuses to create topics whose name starts with an underscore, and audits each refusal (the
    plugin guide's example of ``services.audit``, word for word but for this line)."""

    plugin_name: ClassVar[str] = "reserved-names"
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.CREATE_TOPICS})

    @hookimpl
    def kanal_request(self, ctx: RequestContext) -> RequestResult:
        reserved = [t.name for t in ctx.request.topics if t.name.startswith("_")]
        if not reserved:
            return None
        self.services.audit("SAFEGUARD", ctx.connection, {"decision": "BLOCK", "topics": reserved})
        return Reject(ErrorCode.policy_violation, f"reserved topic names: {', '.join(reserved)}")


def create_topics(*names: str) -> Any:
    request = create_topics_v7.CreateTopicsRequest(
        topics=tuple(
            create_topics_v7.CreatableTopic(
                name=TopicName(name), num_partitions=i32(1), replication_factor=i16(1), assignments=(), configs=()
            )
            for name in names
        ),
        validate_only=False,
    )
    return decode_request(encode_request(request, 7, "audit-test"))[1]


def test_the_guides_example_audits_its_refusals() -> None:
    services = FakeServices()
    harness = Harness(services=services)
    harness.add(ReservedNames)
    refused = trio.run(partial(harness.request, create_topics("orders", "_private"), upstream=lambda request: None))
    assert refused.forwarded is None
    assert services.audited == [("SAFEGUARD", harness.connection, {"decision": "BLOCK", "topics": ["_private"]})]
    allowed = trio.run(partial(harness.request, create_topics("orders"), upstream=lambda request: "created"))
    assert allowed.response == "created" and len(services.audited) == 1


# -- the admin API ---------------------------------------------------------------------------------

Client = Any


def run_admin(body: Callable[[AdminApi, Client], Awaitable[None]], **env: str) -> None:
    api = build_admin(gateway(**env), writer=MemoryLog())
    serve_admin(api, body)


def account(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "gateway/v2",
        "kind": "GatewayServiceAccount",
        "metadata": {"name": name, "vCluster": "tenant-a"},
        "spec": {"type": "LOCAL"},
    }


def test_admin_changes_and_refused_admin_logins_are_audited_and_served_to_read_only_users() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        assert (await client.put("/gateway/v2/service-account", json=account("orders-app"), headers=ADMIN)).status_code
        assert (await client.get("/gateway/v2/audit", headers={"Authorization": "Basic eDp5"})).status_code == 401
        response = await client.get("/gateway/v2/audit?type=ADMIN_API_CALL", headers=VIEWER)
        assert response.status_code == 200
        (change,) = await response.get_json()
        assert change["userName"] == "admin" and change["authenticationPrincipal"] == "tenant-a"
        assert change["eventData"] == {
            "action": "UPSERT",
            "kind": "GatewayServiceAccount",
            "resourceName": "orders-app",
            "scope": {"vCluster": "tenant-a"},
            "result": "CREATED",
            "method": "PUT",
            "path": "/gateway/v2/service-account",
        }
        assert set(change["connection"]) == {"localAddress", "remoteAddress"}  # host:port over HTTP
        (refused,) = await (await client.get("/gateway/v2/audit?type=AUTHENTICATION", headers=VIEWER)).get_json()
        assert refused["eventData"] == "admin API: invalid credentials" and refused["userName"] is None
        everything = orjson.dumps(await (await client.get("/gateway/v2/audit", headers=VIEWER)).get_json())
        assert b"s3cr3t-admin" not in everything and b"eDp5" not in everything

    run_admin(body)


def test_a_minted_token_is_audited_and_never_written() -> None:
    key = base64.b64encode(b"k" * 32).decode()

    async def body(api: AdminApi, client: Client) -> None:
        await client.put("/gateway/v2/service-account", json=account("orders-app"), headers=ADMIN)
        minted = await client.post(
            "/gateway/v2/token",
            json={"username": "orders-app", "vCluster": "tenant-a", "lifeTimeSeconds": 600},
            headers=ADMIN,
        )
        token = (await minted.get_json())["token"]
        assert api.audit_log is not None
        events = api.audit_log.query(AuditQuery())
        (event,) = [e for e in events if e["eventData"]["action"] == "MINT_TOKEN"]
        assert event["eventData"]["lifeTimeSeconds"] == 600 and event["userName"] == "admin"
        assert token.encode() not in orjson.dumps(events) and key.encode() not in orjson.dumps(events)

    run_admin(body, GATEWAY_USER_POOL_SECRET_KEY=key)


@pytest.mark.parametrize(
    ("query", "named"),
    [("?since=1", "since"), ("?from=yesterday", "from"), ("?limit=0", "limit"), ("?from=2&to=1", "from")],
)
def test_a_bad_filter_is_a_400_naming_it(query: str, named: str) -> None:
    async def body(api: AdminApi, client: Client) -> None:
        response = await client.get("/gateway/v2/audit" + query, headers=VIEWER)
        assert response.status_code == 400
        assert (await response.get_json())["msg"].startswith(f"{named}: ")

    run_admin(body)


def test_without_the_audit_log_the_route_says_it_is_off() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        response = await client.get("/gateway/v2/audit", headers=VIEWER)
        assert response.status_code == 404
        assert "GATEWAY_FEATURE_FLAGS_AUDIT=false" in (await response.get_json())["msg"]

    run_admin(body, GATEWAY_FEATURE_FLAGS_AUDIT="false")


def test_the_openapi_document_describes_the_route_and_its_filters() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        document = await (await client.get("/openapi.json")).get_json()
        operation = document["paths"]["/gateway/v2/audit"]["get"]
        assert [p["name"] for p in operation["parameters"]] == ["type", "principal", "from", "to", "limit"]
        assert "403" not in operation["responses"]  # read-only users may call it
        events = operation["responses"]["200"]["content"]["application/json"]["schema"]
        assert {"id", "type", "userName", "connection", "eventData"} <= set(events["items"]["properties"])

    run_admin(body)
