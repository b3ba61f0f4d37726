"""The admin API app with an in-memory state log: routes, auth, errors, plugin hooks, metrics, shutdown.

Each test runs the real Quart app (quart-trio test client) and the real resource store following an
in-memory log inside one ``trio.run``; the HTTP server and the Kafka log are covered by the
integration tests.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from kanal.admin.app import AdminApi
from kanal.admin.audit import host_port
from kanal.admin.service import build_admin
from kanal.admin.store import MemoryLog
from kanal.api import GatewayServices
from kanal.api.hookspecs import hookimpl
from kanal.api.interceptor import Interceptor, InterceptorConfigError, InterceptorSpec, Scope
from kanal.api.resources import Key, ResourceKind, StateView, Status, check_envelope, envelope, invalid
from kanal.config.settings import build_settings
from kanal.gateway import Gateway
from kanal.net.state_log import LogError
from kanal.pipeline.registry import PluginRegistry

USERS = "[{username: admin, password: secret, admin: true}, {username: viewer, password: look}]"
ADMIN = {"Authorization": "Basic " + base64.b64encode(b"admin:secret").decode()}
VIEWER = {"Authorization": "Basic " + base64.b64encode(b"viewer:look").decode()}
CORE_KINDS = {
    "Interceptor",
    "GatewayServiceAccount",
    "GatewayScramCredential",
    "GatewayGroup",
    "VirtualCluster",
    "AliasTopic",
}
WRONG = {"Authorization": "Basic " + base64.b64encode(b"admin:nope").decode()}


class Tagger(Interceptor):
    """Tags things; ``config.tag`` is required."""

    plugin_name: ClassVar[str] = "tagger"
    description: ClassVar[str] = "Adds a tag."
    config_schema: ClassVar[dict[str, Any]] = {"type": "object", "required": ["tag"]}

    def __init__(self, config: Any, services: GatewayServices) -> None:
        super().__init__(config, services)
        if not isinstance(self.config.get("tag"), str):
            raise InterceptorConfigError("tag: required, a string")


def _greeting_validate(manifest: Any, state: StateView) -> dict[str, Any]:
    metadata, spec = check_envelope(manifest, GREETING)
    text = spec.get("text")
    if not isinstance(text, str):
        raise invalid("spec.text is required, a string")
    return envelope(GREETING, {"name": metadata["name"]}, {"text": text})


applied: list[list[str]] = []


def _greeting_apply(resources: Sequence[dict[str, Any]], state: StateView) -> dict[Key, Status]:
    applied.append([r["metadata"]["name"] for r in resources])
    return {
        GREETING.key_of(r["metadata"]): Status("Failed", "shouting") for r in resources if r["spec"]["text"].isupper()
    }


GREETING = ResourceKind(
    kind="Greeting",
    path="greeting",
    validate=_greeting_validate,
    apply=_greeting_apply,
    description="A test kind.",
    columns=(("NAME", "metadata.name"), ("TEXT", "spec.text")),
)


class TestPlugin:
    @hookimpl
    def kanal_interceptor_types(self) -> list[type[Interceptor]]:
        return [Tagger]

    @hookimpl
    def kanal_admin_resources(self, services: GatewayServices) -> list[ResourceKind]:
        return [GREETING]

    @hookimpl
    def kanal_admin_routes(self, admin: AdminApi) -> None:
        @admin.route("/gateway/v2/greeting-count")
        async def greeting_count() -> dict[str, int]:
            """How many greetings are stored."""
            return {"count": admin.store.count("Greeting")}

        @admin.route("/gateway/v2/greeting-reset", methods=["POST"])
        async def greeting_reset() -> dict[str, bool]:
            """An admin-only action."""
            return {"reset": True}


Client = Any
Body = Callable[[AdminApi, Client], Awaitable[None]]


def run_admin(
    body: Body,
    *,
    env: dict[str, str] | None = None,
    static: Sequence[InterceptorSpec] = (),
    log: MemoryLog | None = None,
    load: bool = True,
) -> AdminApi:
    registry = PluginRegistry()
    registry.register(TestPlugin(), "test-plugin")
    settings = build_settings(
        {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "GATEWAY_ADMIN_API_USERS": USERS, **(env or {})}
    )
    gateway = Gateway(settings, registry)
    gateway.pipeline.configure(static)
    api = build_admin(gateway, writer=log or MemoryLog())

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            if load:
                await nursery.start(api.store.run)
            async with api.app.test_app() as app:
                await body(api, app.test_client())
            nursery.cancel_scope.cancel()

    trio.run(main)
    return api


def interceptor(name: str, tag: str = "a", priority: int = 100, **scope: str) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if scope:
        metadata["scope"] = scope
    return {
        "apiVersion": "gateway/v2",
        "kind": "Interceptor",
        "metadata": metadata,
        "spec": {"pluginClass": "tagger", "priority": priority, "config": {"tag": tag}},
    }


async def put(client: Client, path: str, body: Any, headers: dict[str, str] = ADMIN, **query: str) -> Any:
    return await client.put(path, json=body, headers=headers, query_string=query or None)


# -- authentication ------------------------------------------------------------------------------


def test_credentials_are_required_and_read_only_users_cannot_change_anything() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        response = await client.get("/gateway/v2/interceptor")
        assert response.status_code == 401
        assert response.headers["WWW-Authenticate"].startswith("Basic")
        assert set(await response.get_json()) == {"title", "msg", "cause"}
        assert (await client.get("/gateway/v2/interceptor", headers=WRONG)).status_code == 401
        assert (await client.get("/gateway/v2/interceptor", headers=VIEWER)).status_code == 200
        denied = await put(client, "/gateway/v2/interceptor", interceptor("a"), VIEWER)
        assert denied.status_code == 403
        assert "read-only" in (await denied.get_json())["msg"]
        resolved = await client.post("/gateway/v2/interceptor/resolve", json={}, headers=VIEWER)
        assert resolved.status_code == 200  # a read-only POST
        assert (await client.post("/gateway/v2/greeting-reset", headers=VIEWER)).status_code == 403
        assert (await client.post("/gateway/v2/greeting-reset", headers=ADMIN)).status_code == 200
        for public in ("/health/live", "/health/ready", "/versions", "/metrics", "/openapi.json"):
            assert (await client.get(public)).status_code == 200, public

    run_admin(body)


def test_without_users_the_api_refuses_and_says_how_to_configure_it() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        response = await client.get("/gateway/v2/interceptor", headers=ADMIN)
        assert response.status_code == 503
        assert "GATEWAY_ADMIN_API_USERS" in (await response.get_json())["msg"]
        assert (await client.get("/health/ready")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200

    run_admin(body, env={"GATEWAY_ADMIN_API_USERS": ""})


# -- interceptors --------------------------------------------------------------------------------


def test_put_creates_updates_and_reports_not_changed() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        first = await put(client, "/gateway/v2/interceptor", interceptor("tag", "a"))
        assert first.status_code == 200
        answer = await first.get_json()
        assert answer["upsertResult"] == "CREATED"
        assert answer["resource"]["status"] == {"status": "Ready"}
        assert answer["resource"]["spec"] == {"pluginClass": "tagger", "priority": 100, "config": {"tag": "a"}}
        assert [s.name for s in api.gateway.pipeline.specs()] == ["tag"]
        again = await (await put(client, "/gateway/v2/interceptor", interceptor("tag", "a"))).get_json()
        assert again["upsertResult"] == "NOT_CHANGED"
        changed = await (await put(client, "/gateway/v2/interceptor", interceptor("tag", "b"))).get_json()
        assert changed["upsertResult"] == "UPDATED"
        assert api.gateway.pipeline.specs()[0].config == {"tag": "b"}
        listed = await (await client.get("/gateway/v2/interceptor", headers=VIEWER)).get_json()
        assert [r["spec"]["config"]["tag"] for r in listed] == ["b"]
        one = await (await client.get("/gateway/v2/interceptor/tag", headers=VIEWER)).get_json()
        assert one["metadata"] == {"name": "tag"}

    run_admin(body)


def test_dry_mode_validates_without_storing() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        dry = await put(client, "/gateway/v2/interceptor", interceptor("tag"), dryMode="true")
        assert (await dry.get_json())["upsertResult"] == "CREATED"
        assert api.store.count("Interceptor") == 0
        assert api.gateway.pipeline.specs() == []
        bad = await put(
            client, "/gateway/v2/interceptor", {**interceptor("tag"), "spec": {"pluginClass": "tagger"}}, dryMode="true"
        )
        assert bad.status_code == 400
        assert "tag: required" in (await bad.get_json())["msg"]

    run_admin(body)


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ({"kind": "Interceptor", "metadata": {"name": "x"}, "spec": {"pluginClass": "missing"}}, "unknown plugin"),
        ({"kind": "Interceptor", "metadata": {"name": "x"}, "spec": {"pluginClass": "tagger"}}, "tag: required"),
        ({"kind": "Interceptor", "metadata": {}, "spec": {}}, "metadata.name is required"),
        ({"kind": "TopicView", "metadata": {"name": "x"}, "spec": {}}, "kind must be Interceptor"),
        ({"kind": "Interceptor", "apiVersion": "v9", "metadata": {"name": "x"}, "spec": {}}, "apiVersion"),
        (
            {"kind": "Interceptor", "metadata": {"name": "x", "scope": {"group": "g", "username": "u"}}, "spec": {}},
            "cannot both be set",
        ),
        (
            {"kind": "Interceptor", "metadata": {"name": "x"}, "spec": {"pluginClass": "tagger", "priority": "1"}},
            "priority must be an integer",
        ),
        (
            {
                "kind": "Interceptor",
                "metadata": {"name": "x"},
                "spec": {"pluginClass": "tagger", "config": {"tag": "${KANAL_TEST_UNSET}"}},
            },
            "config.tag: environment variable KANAL_TEST_UNSET is not set",
        ),
        ([1, 2], "JSON object"),
    ],
)
def test_invalid_resources_answer_400_with_title_msg_cause(manifest: Any, message: str) -> None:
    async def body(api: AdminApi, client: Client) -> None:
        response = await put(client, "/gateway/v2/interceptor", manifest)
        assert response.status_code == 400
        error = await response.get_json()
        assert set(error) == {"title", "msg", "cause"}
        assert message in error["msg"]
        assert api.store.count("Interceptor") == 0

    run_admin(body)


def test_a_body_that_is_not_json_is_a_400() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        response = await client.put("/gateway/v2/interceptor", data=b"{nope", headers=ADMIN)
        assert response.status_code == 400

    run_admin(body)


def test_scoped_interceptors_delete_by_scope_body_and_resolve_in_order() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        await put(client, "/gateway/v2/interceptor", interceptor("tag", "global", priority=10))
        await put(client, "/gateway/v2/interceptor", interceptor("tag", "alice", priority=10, username="alice"))
        await put(client, "/gateway/v2/interceptor", interceptor("first", "x", priority=1, vCluster="vc"))
        listed = await (await client.get("/gateway/v2/interceptor", headers=ADMIN)).get_json()
        assert len(listed) == 3
        only_alice = await (await client.get("/gateway/v2/interceptor?username=alice", headers=ADMIN)).get_json()
        assert [r["spec"]["config"]["tag"] for r in only_alice] == ["alice"]
        global_ones = await (await client.get("/gateway/v2/interceptor?global=true", headers=ADMIN)).get_json()
        assert [r["spec"]["config"]["tag"] for r in global_ones] == ["global"]

        async def chain(who: dict[str, Any]) -> list[tuple[str, str]]:
            answer = await client.post("/gateway/v2/interceptor/resolve", json=who, headers=ADMIN)
            return [(r["metadata"]["name"], r["spec"]["config"]["tag"]) for r in await answer.get_json()]

        # Scopes without vCluster are for clients in no virtual cluster (notes 1.4): alice of vc gets
        # only the vc interceptor, alice of the passthrough cluster her own "tag".
        assert await chain({"username": "alice", "vCluster": "vc"}) == [("first", "x")]
        assert await chain({"username": "alice"}) == [("tag", "alice")]
        assert await chain({"username": "bob", "groups": ["g"]}) == [("tag", "global")]
        bad = await client.post("/gateway/v2/interceptor/resolve", json={"groups": "g"}, headers=ADMIN)
        assert bad.status_code == 400

        gone = await client.delete("/gateway/v2/interceptor/tag", json={"username": "alice"}, headers=ADMIN)
        assert gone.status_code == 204
        assert await chain({"username": "alice"}) == [("tag", "global")]
        again = await client.delete("/gateway/v2/interceptor/tag", json={"username": "alice"}, headers=ADMIN)
        assert again.status_code == 404
        scoped = await client.delete("/gateway/v2/interceptor/first", json={"scope": {"vCluster": "vc"}}, headers=ADMIN)
        assert scoped.status_code == 204
        assert (await client.get("/gateway/v2/interceptor/tag", headers=ADMIN)).status_code == 200
        assert (await client.get("/gateway/v2/interceptor/tag?username=alice", headers=ADMIN)).status_code == 404

    run_admin(body)


def test_config_file_interceptors_are_listed_read_only_and_conflicts_are_409() -> None:
    static = [InterceptorSpec("from-file", "tagger", 5, Scope(vcluster="passthrough"), {"tag": "file"})]

    async def body(api: AdminApi, client: Client) -> None:
        listed = await (await client.get("/gateway/v2/interceptor", headers=ADMIN)).get_json()
        assert listed[0]["metadata"]["name"] == "from-file"
        assert listed[0]["status"]["message"] == "from the config file"
        conflict = await put(client, "/gateway/v2/interceptor", interceptor("from-file"))
        assert conflict.status_code == 409
        await put(client, "/gateway/v2/interceptor", interceptor("from-api", priority=1))
        assert [s.name for s in api.gateway.pipeline.specs()] == ["from-file", "from-api"]
        resolved = await client.post("/gateway/v2/interceptor/resolve", json={}, headers=ADMIN)
        assert [r["metadata"]["name"] for r in await resolved.get_json()] == ["from-api", "from-file"]

    run_admin(body, static=static)


def test_plugin_catalogue_lists_types_with_schema_and_docs() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        plugins = await (await client.get("/gateway/v2/plugin", headers=VIEWER)).get_json()
        (tagger,) = [p for p in plugins if p["plugin"] == "tagger"]
        assert tagger["pluginId"] == "test-plugin"
        assert tagger["description"] == "Adds a tag."
        assert tagger["configSchema"] == {"type": "object", "required": ["tag"]}
        assert "config.tag" in tagger["readme"]

    run_admin(body)


# -- plugin kinds and routes -----------------------------------------------------------------------


def test_a_plugin_kind_gets_routes_persistence_and_status() -> None:
    applied.clear()

    async def body(api: AdminApi, client: Client) -> None:
        kinds = await (await client.get("/gateway/v2/resource-kinds", headers=VIEWER)).get_json()
        assert {k["kind"] for k in kinds} == {*CORE_KINDS, "Greeting"}
        hello = {"apiVersion": "gateway/v2", "kind": "Greeting", "metadata": {"name": "hi"}, "spec": {"text": "hello"}}
        created = await (await put(client, "/gateway/v2/greeting", hello)).get_json()
        assert created == {"resource": {**hello, "status": {"status": "Ready"}}, "upsertResult": "CREATED"}
        loud = {**hello, "metadata": {"name": "loud"}, "spec": {"text": "HELLO"}}
        shouted = await (await put(client, "/gateway/v2/greeting", loud)).get_json()
        assert shouted["resource"]["status"] == {"status": "Failed", "message": "shouting"}
        count = await (await client.get("/gateway/v2/greeting-count", headers=VIEWER)).get_json()
        assert count == {"count": 2}
        assert (await client.delete("/gateway/v2/greeting/hi", headers=ADMIN)).status_code == 204
        missing = await client.get("/gateway/v2/greeting/hi", headers=ADMIN)
        assert missing.status_code == 404
        bad = await put(client, "/gateway/v2/greeting", {**hello, "spec": {}})
        assert (await bad.get_json())["msg"] == "spec.text is required, a string"

    run_admin(body)
    assert applied == [[], ["hi"], ["hi", "loud"], ["loud"]]


# -- persistence: several stores on one log ----------------------------------------------------------


def test_a_new_store_on_the_same_log_loads_everything() -> None:
    log = MemoryLog()

    async def write(api: AdminApi, client: Client) -> None:
        await put(client, "/gateway/v2/interceptor", interceptor("kept", "1"))
        await put(client, "/gateway/v2/interceptor", interceptor("dropped", "2"))
        await client.delete("/gateway/v2/interceptor/dropped", headers=ADMIN)

    run_admin(write, log=log)

    async def read(api: AdminApi, client: Client) -> None:
        assert [s.name for s in api.gateway.pipeline.specs()] == ["kept"]
        listed = await (await client.get("/gateway/v2/interceptor", headers=ADMIN)).get_json()
        assert [r["metadata"]["name"] for r in listed] == ["kept"]

    run_admin(read, log=log)


def test_readiness_waits_for_the_state_and_shutdown_answers_503() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        not_ready = await client.get("/health/ready")
        assert not_ready.status_code == 503
        assert await not_ready.get_data() == b"NOTREADY"
        async with trio.open_nursery() as nursery:
            await nursery.start(api.store.run)
            ready = await client.get("/health/ready")
            assert (ready.status_code, await ready.get_data()) == (200, b"READY")
            api.gateway.stopping.set()
            assert (await client.get("/health/ready")).status_code == 503
            assert (await client.get("/gateway/v2/interceptor", headers=ADMIN)).status_code == 503
            assert (await put(client, "/gateway/v2/interceptor", interceptor("late"))).status_code == 503
            assert (await client.get("/health/live")).status_code == 200
            nursery.cancel_scope.cancel()
        assert api.store.count("Interceptor") == 0

    run_admin(body, load=False)


# -- metrics and OpenAPI ------------------------------------------------------------------------------


def test_http_metrics_use_route_templates_and_skip_unknown_routes() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        await client.get("/gateway/v2/interceptor/abc", headers=ADMIN)
        await client.get("/gateway/v2/interceptor/def", headers=ADMIN)
        await client.get("/no/such/route", headers=ADMIN)
        await client.get("/gateway/v2/interceptor")
        text = (await (await client.get("/metrics")).get_data()).decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        requests = {
            (s.labels["method"], s.labels["path"], s.labels["status"]): s.value
            for s in families["gateway_api_request"].samples
            if s.name == "gateway_api_request_total"
        }
        assert requests[("GET", "/gateway/v2/interceptor/{name}", "404")] == 2
        assert requests[("GET", "/gateway/v2/interceptor", "401")] == 1
        assert not any("/no/such" in path for _, path, _ in requests)
        assert families["gateway_api_request_duration_seconds"].type == "histogram"
        in_progress = families["gateway_api_requests_in_progress"].samples
        assert {s.labels["path"] for s in in_progress} >= {"/gateway/v2/interceptor/{name}"}
        assert {tuple(sorted(s.labels)) for s in in_progress} == {("method", "path")}
        assert families["gateway_state_loaded"].samples[0].value == 1
        assert "gateway_latency_request_response_seconds" in families  # the Kafka-side metrics
        assert not any(name.endswith("_total") for name in families if name.startswith("gateway_lived_event"))

    run_admin(body)


def test_openapi_lists_every_route_with_templated_paths() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        document = await (await client.get("/openapi.json")).get_json()
        assert document["openapi"].startswith("3.")
        paths = document["paths"]
        assert set(paths["/gateway/v2/interceptor"]) == {"get", "put"}
        assert set(paths["/gateway/v2/interceptor/{name}"]) == {"get", "delete"}
        assert "post" in paths["/gateway/v2/interceptor/resolve"]
        assert "/gateway/v2/greeting" in paths and "/gateway/v2/greeting-count" in paths
        assert paths["/gateway/v2/greeting-count"]["get"]["summary"] == "How many greetings are stored."
        assert paths["/health/ready"]["get"]["security"] == []
        assert set(document["components"]["schemas"]) == {*CORE_KINDS, "Greeting"}

    run_admin(body)


class BrokenLog(MemoryLog):
    async def append(self, key: bytes, value: bytes | None) -> int:
        raise LogError("state topic _kanal_gateway_resources: broker gone")


def test_changes_answer_503_before_the_state_is_loaded_and_when_it_cannot_be_written() -> None:
    async def body(api: AdminApi, client: Client) -> None:
        early = await put(client, "/gateway/v2/interceptor", interceptor("x"))
        assert early.status_code == 503
        assert "still loading" in (await early.get_json())["msg"]
        async with trio.open_nursery() as nursery:
            await nursery.start(api.store.run)
            failed = await put(client, "/gateway/v2/interceptor", interceptor("x"))
            assert failed.status_code == 503
            assert "broker gone" in (await failed.get_json())["msg"]
            assert api.store.count("Interceptor") == 0
            assert api.gateway.pipeline.specs() == []
            nursery.cancel_scope.cancel()

    run_admin(body, log=BrokenLog(), load=False)


def test_changes_are_audited_with_user_and_host_port(caplog: pytest.LogCaptureFixture) -> None:
    async def body(api: AdminApi, client: Client) -> None:
        peer = {"client": ("10.1.2.3", 40123), "server": ("10.0.0.2", 8888)}
        await client.put(
            "/gateway/v2/interceptor", json=interceptor("audited", username="alice"), headers=ADMIN, scope_base=peer
        )
        await client.delete(
            "/gateway/v2/interceptor/audited", json={"username": "alice"}, headers=ADMIN, scope_base=peer
        )
        await client.get("/gateway/v2/interceptor", headers=WRONG, scope_base=peer)

    with caplog.at_level("INFO", logger="kanal.audit"):
        run_admin(body)
    events = [vars(r) for r in caplog.records if r.name == "kanal.audit"]
    upsert, delete, login = events
    assert (upsert["action"], upsert["result"], upsert["kind"], upsert["resourceName"]) == (
        "UPSERT",
        "CREATED",
        "Interceptor",
        "audited",
    )
    assert upsert["scope"] == {"username": "alice"} and upsert["user"] == "admin"
    assert (upsert["clientAddress"], upsert["listenerAddress"]) == ("10.1.2.3:40123", "10.0.0.2:8888")
    assert (delete["action"], delete["result"]) == ("DELETE", "DELETED")
    assert (login["event"], login["result"], login["clientAddress"]) == ("AUTHENTICATION", "FAILURE", "10.1.2.3:40123")


def test_client_addresses_are_host_port() -> None:
    assert host_port(("10.0.0.1", 5000)) == "10.0.0.1:5000"
    assert host_port(("::1", 80)) == "[::1]:80"
    assert host_port(None) is None
