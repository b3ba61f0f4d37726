"""Group scopes through a real gateway process in front of a real Tansu broker, with real clients
logging in with gateway tokens (SASL PLAIN): ``kanal apply`` of service accounts, a GatewayGroup and
interceptors of one name at several scopes; each client's records show which of them applied; a
group edit reaches connections already open; ``POST /gateway/v2/interceptor/resolve`` answers the
chain each principal's connection gets.

The interceptors are the header-injection plugin's: each writes the header ``x-scope`` naming its
scope, read back from the broker directly. The manifests are the ones the security documentation
shows ("Groups and scopes").
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from kanal.cli import main as kanal_main
from kanal.embedded import GatewayProcess, TansuBroker
from kanal.embedded.admin_http import AdminHttp as Http

pytestmark = pytest.mark.integration

USERS = "[{username: admin, password: secret, admin: true}]"

ACCOUNTS = """\
apiVersion: gateway/v2
kind: GatewayServiceAccount
metadata: {name: alice, vCluster: tenant-a}
spec: {type: LOCAL}
---
apiVersion: gateway/v2
kind: GatewayServiceAccount
metadata: {name: bob, vCluster: tenant-a}
spec: {type: LOCAL}
---
apiVersion: gateway/v2
kind: GatewayServiceAccount
metadata: {name: carol, vCluster: tenant-a}
spec: {type: LOCAL}
---
apiVersion: gateway/v2
kind: GatewayServiceAccount
metadata: {name: dave}
spec: {type: LOCAL}
"""

GROUP = """\
apiVersion: gateway/v2
kind: GatewayGroup
metadata:
  name: payments
spec:
  members:
    - {name: alice, vCluster: tenant-a}
    - {name: bob, vCluster: tenant-a}
  externalGroups: [payments-team]
"""

INTERCEPTORS = """\
apiVersion: gateway/v2
kind: Interceptor
metadata:
  name: mark
  scope: {vCluster: null, group: null, username: null}   # every client, every virtual cluster
spec:
  pluginClass: header-injection
  priority: 100
  config: {headers: {x-scope: global}}
---
apiVersion: gateway/v2
kind: Interceptor
metadata:
  name: mark
  scope: {vCluster: tenant-a}
spec:
  pluginClass: header-injection
  priority: 100
  config: {headers: {x-scope: vcluster}}
---
apiVersion: gateway/v2
kind: Interceptor
metadata:
  name: mark
  scope: {vCluster: tenant-a, group: payments}
spec:
  pluginClass: header-injection
  priority: 100
  config: {headers: {x-scope: group}}
---
apiVersion: gateway/v2
kind: Interceptor
metadata:
  name: mark
  scope: {vCluster: tenant-a, username: bob}
spec:
  pluginClass: header-injection
  priority: 100
  config: {headers: {x-scope: user}}
"""

#: The group after an edit: alice leaves, carol joins.
EDITED_GROUP = GROUP.replace("{name: alice, vCluster: tenant-a}", "{name: carol, vCluster: tenant-a}")

PRINCIPALS = {"alice": "tenant-a", "bob": "tenant-a", "carol": "tenant-a", "dave": None}


@pytest.fixture(scope="module")
def node(tansu: TansuBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, Http]]:
    env = {
        **tansu.gateway_settings(),
        "GATEWAY_ADMIN_API_USERS": USERS,
        "GATEWAY_CLUSTER_ID": f"groups-{uuid.uuid4().hex[:8]}",
        "GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "GATEWAY_USER_POOL_SECRET_KEY": base64.b64encode(os.urandom(32)).decode(),
    }
    process = GatewayProcess(env, log_path=tmp_path_factory.mktemp("groups") / "gateway.log").start(timeout=30)
    try:
        yield process, Http(env["GATEWAY_HTTP_PORT"])
    finally:
        code = process.stop(timeout=15)
        assert code == 0, f"gateway exited with {code}:\n{process.tail()}"


def kanal(http: Http, *args: str) -> str:
    """Runs ``kanal <args>`` against the gateway's admin API; its standard output."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = kanal_main([*args, "--url", http.base, "--user", "admin", "--password", "secret"])
    assert code == 0, err.getvalue()
    return out.getvalue()


def apply(http: Http, tmp_path: Path, text: str) -> str:
    manifest = tmp_path / f"{uuid.uuid4().hex}.yaml"
    manifest.write_text(text)
    return kanal(http, "apply", "-f", str(manifest))


def producer(gateway: GatewayProcess, http: Http, username: str) -> Producer:
    vcluster = PRINCIPALS[username]
    body = {"username": username, "lifeTimeSeconds": 600, **({"vCluster": vcluster} if vcluster else {})}
    status, answer = http.call("POST", "/gateway/v2/token", body)
    assert status == 200, answer
    return Producer(
        {
            "bootstrap.servers": gateway.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": username,
            "sasl.password": answer["token"],
            "message.timeout.ms": 15000,
        }
    )


def scope_seen(client: Producer, tansu: TansuBroker, topic: str, username: str) -> str | None:
    """Produces one record through the gateway; the ``x-scope`` header the broker stored with it
    (a client in a virtual cluster writes to the topic under the virtual cluster's prefix)."""
    delivered: list[tuple[KafkaError | None, Message]] = []
    client.produce(topic, b"v", partition=0, on_delivery=lambda err, msg: delivered.append((err, msg)))
    client.flush(20)
    assert delivered and delivered[0][0] is None, delivered
    offset = delivered[0][1].offset()
    assert offset is not None
    consumer = Consumer({"bootstrap.servers": tansu.bootstrap, "group.id": f"read-{uuid.uuid4().hex}"})
    try:
        consumer.assign([TopicPartition((PRINCIPALS[username] or "") + topic, 0, offset)])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error() and message.offset() == offset:
                headers = dict(message.headers() or [])
                value = headers.get("x-scope")
                return value.decode() if isinstance(value, bytes) else value
    finally:
        consumer.close()
    raise AssertionError(f"record {offset} of {topic} not read back")


def resolved_scope(http: Http, username: str) -> str:
    """The x-scope the resolver says ``username``'s chain writes."""
    vcluster = PRINCIPALS[username]
    status, chain = http.call(
        "POST",
        "/gateway/v2/interceptor/resolve",
        {"username": username, **({"vCluster": vcluster} if vcluster else {})},
    )
    assert status == 200, chain
    marks = [entry for entry in chain if entry["metadata"]["name"] == "mark"]
    assert len(marks) == 1, chain  # the most specific scope replaces the others
    return str(marks[0]["spec"]["config"]["headers"]["x-scope"])


def test_group_scopes_apply_to_members_user_scopes_win_and_edits_reach_open_connections(
    node: tuple[GatewayProcess, Http], tansu: TansuBroker, tmp_path: Path
) -> None:
    gateway, http = node
    apply(http, tmp_path, ACCOUNTS)
    assert "GatewayGroup/payments: CREATED [Ready]" in apply(http, tmp_path, GROUP)
    applied = apply(http, tmp_path, INTERCEPTORS)
    assert applied.count("CREATED [Ready]") == 4, applied
    status, stored = http.get("/gateway/v2/interceptor?name=mark")
    assert status == 200
    assert sorted(str(m["metadata"]["scope"]) for m in stored) == sorted(
        str(scope)
        for scope in (
            {"vCluster": "*"},  # null: every virtual cluster
            {"vCluster": "tenant-a"},
            {"vCluster": "tenant-a", "group": "payments"},
            {"vCluster": "tenant-a", "username": "bob"},
        )
    )

    listed = kanal(http, "get", "groups")
    assert listed.splitlines()[0].split() == ["NAME", "MEMBERS", "EXTERNAL", "GROUPS", "STATUS"]
    assert "payments" in listed and '"alice"' in listed and "payments-team" in listed

    topic = f"group-scopes-{uuid.uuid4().hex[:8]}"
    clients = {name: producer(gateway, http, name) for name in PRINCIPALS}
    expected = {
        "alice": "group",  # a member of payments, in tenant-a
        "bob": "user",  # a member too, but his own scope wins
        "carol": "vcluster",  # in tenant-a, not a member
        "dave": "global",  # in no virtual cluster: only the scope for every virtual cluster
    }
    assert {name: scope_seen(client, tansu, topic, name) for name, client in clients.items()} == expected
    assert {name: resolved_scope(http, name) for name in PRINCIPALS} == expected

    # The group changes: alice leaves, carol joins; their open connections follow without reconnecting.
    logins = gateway.output.count("authenticated as")
    apply(http, tmp_path, EDITED_GROUP)
    after = {**expected, "alice": "vcluster", "carol": "group"}
    deadline = time.monotonic() + 30
    seen = {name: scope_seen(client, tansu, topic, name) for name, client in clients.items()}
    while seen != after and time.monotonic() < deadline:
        seen = {name: scope_seen(client, tansu, topic, name) for name, client in clients.items()}
    assert seen == after
    assert {name: resolved_scope(http, name) for name in PRINCIPALS} == after
    assert gateway.output.count("authenticated as") == logins  # no client logged in again
