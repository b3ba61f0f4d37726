"""The admin API over real HTTP, against gateway processes in front of a real Tansu broker.

A probe plugin, installed for these gateways only (a module plus a ``.dist-info`` with its
``kanal.plugins`` entry point, put on the gateways' PYTHONPATH), contributes an interceptor type whose
effect a Kafka client sees (it rewrites the cluster id in Metadata responses), a resource kind
(``Note``) and a slow route, through the plugin hooks.

Covered: CRUD and errors over HTTP, the interceptor reaching Kafka traffic, persistence across a
restart, two gateway nodes on one broker applying each other's changes, health during a slow call,
the CLI, a real metrics scrape, and a gateway with no users configured.
"""

from __future__ import annotations

import contextlib
import io
import json
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from wire import WireClient, metadata_request

from kanal.cli import main as kanal_main
from kanal.embedded import GatewayProcess, TansuBroker
from kanal.embedded.admin_http import AdminHttp as Http
from kanal.protocol.records import record_walker

pytestmark = pytest.mark.integration

USERS = "[{username: admin, password: secret, admin: true}, {username: viewer, password: look}]"

PROBE = '''
"""A test plugin: an interceptor type, a resource kind and a slow route."""

from dataclasses import replace
from typing import Any, ClassVar

import trio
from quart import request

from kanal.api import (
    ApiKey,
    GatewayServices,
    Interceptor,
    InterceptorConfigError,
    ResourceKind,
    check_envelope,
    envelope,
    hookimpl,
    invalid,
)


class ClusterIdTag(Interceptor):
    """Answers Metadata with the configured cluster id."""

    plugin_name: ClassVar[str] = "cluster-id-tag"
    response_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.METADATA})

    def __init__(self, config: Any, services: GatewayServices) -> None:
        super().__init__(config, services)
        if not isinstance(self.config.get("clusterId"), str):
            raise InterceptorConfigError("clusterId: required, a string")

    @hookimpl
    def kanal_response(self, ctx: Any) -> None:
        ctx.response = replace(ctx.response, cluster_id=self.config["clusterId"])


def _validate(manifest: Any, state: Any) -> dict[str, Any]:
    metadata, spec = check_envelope(manifest, NOTE)
    if not isinstance(spec.get("text"), str):
        raise invalid("spec.text is required")
    return envelope(NOTE, {"name": metadata["name"]}, {"text": spec["text"]})


NOTE = ResourceKind(
    kind="Note", path="note", validate=_validate, columns=(("NAME", "metadata.name"), ("TEXT", "spec.text"))
)


@hookimpl
def kanal_interceptor_types() -> list[type[Interceptor]]:
    return [ClusterIdTag]


@hookimpl
def kanal_admin_resources(services: Any) -> list[ResourceKind]:
    return [NOTE]


@hookimpl
def kanal_admin_routes(admin: Any) -> None:
    @admin.route("/gateway/v2/probe/slow")
    async def slow() -> dict[str, bool]:
        """Sleeps, to show that a slow call blocks nothing else."""
        await trio.sleep(float(request.args.get("seconds", "3")))
        return {"slept": True}
'''


# -- helpers ------------------------------------------------------------------------------------------


def tag_interceptor(name: str, cluster_id: str, priority: int = 100) -> dict[str, Any]:
    return {
        "apiVersion": "gateway/v2",
        "kind": "Interceptor",
        "metadata": {"name": name},
        "spec": {"pluginClass": "cluster-id-tag", "priority": priority, "config": {"clusterId": cluster_id}},
    }


def cluster_id_seen(bootstrap: str) -> str | None:
    client = WireClient(bootstrap)
    try:
        return client.call(metadata_request([])).cluster_id  # type: ignore[no-any-return]
    finally:
        client.close()


def wait_for(predicate: Any, timeout: float) -> float:
    """Seconds until ``predicate()`` held; fails after ``timeout``."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            pytest.fail(f"condition not met within {timeout}s")
        time.sleep(0.02)
    return time.monotonic() - start


@pytest.fixture(scope="module")
def probe_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("probe-plugin")
    (root / "kanal_admin_probe.py").write_text(textwrap.dedent(PROBE))
    info = root / "kanal_admin_probe-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kanal-admin-probe\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text("[kanal.plugins]\nadmin-probe = kanal_admin_probe\n")
    return root


def node_env(broker: TansuBroker, probe: Path, cluster_id: str) -> dict[str, str]:
    return {
        **broker.gateway_settings(),
        "GATEWAY_ADMIN_API_USERS": USERS,
        "GATEWAY_CLUSTER_ID": cluster_id,
        "PYTHONPATH": str(probe),
    }


@contextlib.contextmanager
def running(env: dict[str, str], log: Path) -> Iterator[tuple[GatewayProcess, Http]]:
    process = GatewayProcess(env, log_path=log).start(timeout=30)
    try:
        yield process, Http(env["GATEWAY_HTTP_PORT"])
    finally:
        code = process.stop(timeout=15)
        assert code == 0, f"gateway exited with {code}:\n{process.tail()}"


@pytest.fixture(scope="module")
def node(
    tansu: TansuBroker, probe_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GatewayProcess, Http, str]]:
    cluster_id = f"admin-{uuid.uuid4().hex[:8]}"
    with running(node_env(tansu, probe_path, cluster_id), tmp_path_factory.mktemp("admin") / "a.log") as (gw, http):
        yield gw, http, cluster_id


# -- tests ---------------------------------------------------------------------------------------------


def test_crud_over_http_and_the_interceptor_reaches_kafka_clients(node: tuple[GatewayProcess, Http, str]) -> None:
    gateway, http, _ = node
    assert http.get("/health/ready", user=None) == (200, "READY")
    original = cluster_id_seen(gateway.bootstrap)

    status, answer = http.put("/gateway/v2/interceptor", tag_interceptor("tag", "through-the-api"))
    assert (status, answer["upsertResult"], answer["resource"]["status"]) == (200, "CREATED", {"status": "Ready"})
    assert cluster_id_seen(gateway.bootstrap) == "through-the-api"
    assert http.put("/gateway/v2/interceptor", tag_interceptor("tag", "through-the-api"))[1]["upsertResult"] == (
        "NOT_CHANGED"
    )

    status, error = http.put("/gateway/v2/interceptor", {**tag_interceptor("bad", "x"), "spec": {"pluginClass": "?"}})
    assert status == 400 and set(error) == {"title", "msg", "cause"} and "unknown plugin" in error["msg"]
    assert http.put("/gateway/v2/interceptor", tag_interceptor("x", "y"), user=("viewer", "look"))[0] == 403
    assert http.get("/gateway/v2/interceptor", user=("admin", "wrong"))[0] == 401
    assert http.get("/gateway/v2/interceptor/nope")[0] == 404

    status, chain = http.call("POST", "/gateway/v2/interceptor/resolve", {"username": "anyone"})
    assert [r["metadata"]["name"] for r in chain] == ["tag"]
    status, plugins = http.get("/gateway/v2/plugin", user=("viewer", "look"))
    assert any(p["plugin"] == "cluster-id-tag" and p["pluginId"] == "admin-probe" for p in plugins)

    assert http.call("DELETE", "/gateway/v2/interceptor/tag", {})[0] == 204
    assert cluster_id_seen(gateway.bootstrap) == original
    versions = http.get("/versions", user=None)[1]
    assert versions["gateway"] and versions["recordWalker"] == record_walker()
    assert "/gateway/v2/note/{name}" in http.get("/openapi.json", user=None)[1]["paths"]


def test_health_answers_while_a_slow_call_runs(node: tuple[GatewayProcess, Http, str]) -> None:
    _, http, _ = node
    timings: dict[str, float] = {}

    async def main() -> None:
        async def slow() -> None:
            start = time.monotonic()
            assert await trio.to_thread.run_sync(http.get, "/gateway/v2/probe/slow?seconds=2") == (200, {"slept": True})
            timings["slow"] = time.monotonic() - start

        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow)
            await trio.sleep(0.3)
            start = time.monotonic()
            for path in ("/health/ready", "/health/live", "/gateway/v2/interceptor"):
                assert (await trio.to_thread.run_sync(http.get, path))[0] == 200
            timings["others"] = time.monotonic() - start

    trio.run(main)
    assert timings["slow"] >= 2.0
    assert timings["others"] < 1.0


def test_a_real_scrape_has_the_documented_names_and_labels(node: tuple[GatewayProcess, Http, str]) -> None:
    gateway, http, _ = node
    cluster_id_seen(gateway.bootstrap)  # some Kafka traffic
    http.get("/gateway/v2/interceptor/some-name")
    http.get("/not/a/route")
    status, text = http.get("/metrics", user=None)
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(text)}

    latency = families["gateway_latency_request_response_seconds"]
    assert latency.type == "histogram"
    assert {s.labels["api_key"] for s in latency.samples if s.name.endswith("_bucket")} >= {"Metadata"}
    assert not any("quantile" in s.labels for f in families.values() for s in f.samples)
    for name in ("gateway_requests", "gateway_responses", "gateway_request_bytes", "gateway_response_bytes"):
        assert families[name].type == "counter", name
        assert {"api_key"} <= set(families[name].samples[0].labels), name
    for name in ("gateway_client_connections_active", "gateway_upstream_connections_active"):
        assert families[name].type == "gauge", name
    assert families["gateway_upstream_errors"].type == "counter"

    requests = [s for s in families["gateway_api_request"].samples if s.name == "gateway_api_request_total"]
    assert {tuple(sorted(s.labels)) for s in requests} == {("method", "path", "status")}
    assert any(
        s.labels == {"method": "GET", "path": "/gateway/v2/interceptor/{name}", "status": "404"} for s in requests
    )
    assert not any(s.labels["path"].startswith("/not") for s in requests)
    duration = families["gateway_api_request_duration_seconds"]
    assert duration.type == "histogram"
    assert {s.labels["path"] for s in duration.samples} >= {"/gateway/v2/interceptor/{name}"}
    assert families["gateway_api_requests_in_progress"].type == "gauge"
    for name in ("gateway_lived_event_interceptors_instances", "gateway_lived_event_interceptors_types"):
        assert families[name].type == "gauge"
        assert families[name].samples[0].name == name  # no _total suffix
    assert families["gateway_state_loaded"].samples[0].value == 1


def test_cli_apply_get_delete(node: tuple[GatewayProcess, Http, str], tmp_path: Path) -> None:
    gateway, http, _ = node
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "all.yaml").write_text(
        textwrap.dedent(
            """\
            apiVersion: gateway/v2
            kind: Interceptor
            metadata: {name: cli-tag}
            spec: {pluginClass: cluster-id-tag, priority: 7, config: {clusterId: from-the-cli}}
            ---
            apiVersion: gateway/v2
            kind: Note
            metadata: {name: readme}
            spec: {text: hello}
            """
        )
    )
    connection = ["--url", http.base, "--user", "admin", "--password", "secret"]

    def kanal(*argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = kanal_main([*argv, *connection])
        return code, out.getvalue(), err.getvalue()

    code, out, _ = kanal("apply", "-f", str(manifests), "--dry-run")
    assert code == 0 and "Interceptor/cli-tag: CREATED (dry run)" in out
    assert http.get("/gateway/v2/interceptor/cli-tag")[0] == 404
    code, out, _ = kanal("apply", "-f", str(manifests))
    assert code == 0
    assert "Interceptor/cli-tag: CREATED [Ready]" in out and "Note/readme: CREATED [Ready]" in out
    assert kanal("apply", "-f", str(manifests))[1].count("NOT_CHANGED") == 2
    assert cluster_id_seen(gateway.bootstrap) == "from-the-cli"

    code, out, _ = kanal("get", "interceptors")
    header, *rows = out.splitlines()
    assert header.split() == ["NAME", "PLUGIN", "PRIORITY", "STATUS"]
    assert rows[0].split() == ["cli-tag", "cluster-id-tag", "7", "Ready"]
    code, out, _ = kanal("get", "note", "readme", "-o", "json")
    assert json.loads(out)["spec"] == {"text": "hello"}
    code, out, _ = kanal("get", "Note", "-o", "yaml")
    assert "text: hello" in out

    code, _, err = kanal("apply", "-f", str(manifests / "missing.yaml"))
    assert code == 1 and "no such file" in err
    (tmp_path / "bad.yaml").write_text("apiVersion: gateway/v2\nkind: Note\nmetadata: {name: bad}\nspec: {}\n")
    code, _, err = kanal("apply", "-f", str(tmp_path / "bad.yaml"))
    assert code == 1 and "spec.text is required" in err

    assert kanal("delete", "interceptor", "cli-tag")[1].strip() == "Interceptor/cli-tag: DELETED"
    assert kanal("delete", "-f", str(manifests / "all.yaml"))[0] == 1  # the interceptor is gone already
    assert http.get("/gateway/v2/note/readme")[0] == 404
    code, _, err = kanal("get", "widgets")
    assert code == 1 and "unknown resource kind" in err


def test_two_nodes_apply_each_others_changes(
    node: tuple[GatewayProcess, Http, str], tansu: TansuBroker, probe_path: Path, tmp_path: Path
) -> None:
    first, http_a, cluster_id = node
    with running(node_env(tansu, probe_path, cluster_id), tmp_path / "b.log") as (second, http_b):
        assert http_b.get("/health/ready", user=None) == (200, "READY")
        http_a.put("/gateway/v2/interceptor", tag_interceptor("fleet", "set-on-a"))
        seconds = wait_for(lambda: cluster_id_seen(second.bootstrap) == "set-on-a", timeout=5)
        assert seconds < 1.5, f"node B applied the change after {seconds:.2f}s"
        status, resource = http_b.get("/gateway/v2/interceptor/fleet")
        assert (status, resource["status"]) == (200, {"status": "Ready"})

        assert http_b.call("DELETE", "/gateway/v2/interceptor/fleet")[0] == 204
        wait_for(lambda: http_a.get("/gateway/v2/interceptor/fleet")[0] == 404, timeout=5)
        assert cluster_id_seen(first.bootstrap) != "set-on-a"


def test_a_restart_loses_nothing(tansu: TansuBroker, probe_path: Path, tmp_path: Path) -> None:
    env = node_env(tansu, probe_path, f"restart-{uuid.uuid4().hex[:8]}")
    note = {"apiVersion": "gateway/v2", "kind": "Note", "metadata": {"name": "kept"}, "spec": {"text": "still here"}}
    with running(env, tmp_path / "first.log") as (_, http):
        http.put("/gateway/v2/interceptor", tag_interceptor("persisted", "after-restart"))
        http.put("/gateway/v2/interceptor", tag_interceptor("removed", "gone", priority=1))
        http.put("/gateway/v2/note", note)
        http.call("DELETE", "/gateway/v2/interceptor/removed")
    with running(env, tmp_path / "second.log") as (gateway, http):
        assert cluster_id_seen(gateway.bootstrap) == "after-restart"
        assert [r["metadata"]["name"] for r in http.get("/gateway/v2/interceptor")[1]] == ["persisted"]
        assert http.get("/gateway/v2/note/kept")[1]["spec"] == {"text": "still here"}
        assert http.put("/gateway/v2/note", note)[1]["upsertResult"] == "NOT_CHANGED"


def test_without_users_the_admin_api_is_refused_with_a_hint(gateway: GatewayProcess) -> None:
    port = gateway.env["GATEWAY_HTTP_PORT"]
    http = Http(port)
    status, error = http.get("/gateway/v2/interceptor")
    assert status == 503 and "GATEWAY_ADMIN_API_USERS" in error["msg"]
    assert http.get("/health/ready", user=None) == (200, "READY")
    assert "admin API is not started: no users are configured" in gateway.output


def test_compacted_log_round_trip(tansu: TansuBroker) -> None:
    from kanal.config.upstream import parse_upstream
    from kanal.net.state_log import CompactedLog

    topic = f"_kanal_log-test-{uuid.uuid4().hex[:8]}_resources"
    upstream = parse_upstream({"KAFKA_BOOTSTRAP_SERVERS": tansu.bootstrap}, {})

    async def main() -> None:
        log = CompactedLog(topic, upstream, timeout=5)
        await log.ensure_topic()
        await log.ensure_topic()  # exists already: fine
        assert await log.end_offset() == 0
        assert [await log.append(b"a", b"1"), await log.append(b"b", b"2"), await log.append(b"a", None)] == [0, 1, 2]
        assert await log.end_offset() == 3
        records, next_offset = await log.read(0)
        assert [(r.offset, r.key, r.value) for r in records] == [(0, b"a", b"1"), (1, b"b", b"2"), (2, b"a", None)]
        assert next_offset == 3
        start = time.monotonic()
        assert await log.read(3, max_wait=0.3) == ([], 3)
        assert time.monotonic() - start < 2
        await log.aclose()

    trio.run(main)


def test_a_compacted_log_is_shared_by_tasks(tansu: TansuBroker) -> None:
    """One log used by several tasks at once (the registry proxy heartbeats while it acknowledges
    commands on the same events topic): calls take turns on its one connection."""
    from kanal.config.upstream import parse_upstream
    from kanal.net.state_log import CompactedLog

    topic = f"_kanal_log-test-{uuid.uuid4().hex[:8]}_shared"
    upstream = parse_upstream({"KAFKA_BOOTSTRAP_SERVERS": tansu.bootstrap}, {})

    async def main() -> None:
        log = CompactedLog(topic, upstream, timeout=5)
        await log.ensure_topic()

        async def writer(name: bytes) -> None:
            for i in range(30):
                await log.append(name, b"%d" % i)

        async with trio.open_nursery() as nursery:
            for name in (b"a", b"b", b"c"):
                nursery.start_soon(writer, name)
            nursery.start_soon(log.end_offset)
        records, next_offset = await log.read(0)
        assert next_offset == 90 and sorted(r.key for r in records) == [b"a"] * 30 + [b"b"] * 30 + [b"c"] * 30
        await log.aclose()

    trio.run(main)
