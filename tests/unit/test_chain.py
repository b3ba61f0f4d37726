from collections.abc import Mapping
from typing import Any

import msgspec
import pytest

from kanal.api import GatewayServices
from kanal.api.hookspecs import hookimpl
from kanal.api.interceptor import Interceptor, InterceptorConfigError, InterceptorSpec, Scope
from kanal.api.results import Reject
from kanal.pipeline.chain import PASSTHROUGH, Pipeline
from kanal.pipeline.registry import PluginError, PluginRegistry
from kanal.testing import FakeServices


class Recorder(Interceptor):
    plugin_name = "recorder"
    request_api_keys = frozenset({0, 3})

    def __init__(self, config: Mapping[str, Any], services: GatewayServices) -> None:
        super().__init__(config, services)
        if not isinstance(config.get("tag", ""), str):
            raise InterceptorConfigError("tag: expected a string")
        self.tag = config.get("tag", "")

    @hookimpl
    def kanal_request(self, ctx: Any) -> Any:
        ctx.seen.append(self.tag)
        return Reject(87) if self.tag == "stop" else None


class LimitConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    limit: int = 0
    enabled: bool = False
    name: str = ""


class Limited(Interceptor):
    """A typed config: numbers and flags read from placeholders arrive as strings."""

    plugin_name = "limited"
    config_type = LimitConfig


class Catchall(Interceptor):
    plugin_name = "catchall"
    request_api_keys = None

    @hookimpl
    def kanal_request(self, ctx: Any) -> Any:
        return None


class BadHook(Interceptor):
    plugin_name = "bad-hook"

    @hookimpl
    def kanal_request(self, ctx: Any, extra: int) -> Any:
        return None


class FetchWatcher(Interceptor):
    """Sees every Fetch response (decoded for each one)."""

    plugin_name = "fetch-watcher"
    response_api_keys = frozenset({1})

    @hookimpl
    def kanal_response(self, ctx: Any) -> Any:
        return None


class OnDemand(FetchWatcher):
    """Sees the Fetch responses its request hook asked for."""

    plugin_name = "on-demand"
    request_api_keys = frozenset({1})
    responses_on_demand = True

    @hookimpl
    def kanal_request(self, ctx: Any) -> Any:
        return None


class Orders(Interceptor):
    """Sees the records produced to topics starting with ``orders``."""

    plugin_name = "orders"

    def wants_produce_records(self, topic: str) -> bool:
        if topic == "broken":
            raise RuntimeError("cannot tell")
        return topic.startswith("orders")

    @hookimpl
    def kanal_produce_records(self, ctx: Any) -> Any:
        return None


class EveryTopic(Interceptor):
    """Sees the records of every produced topic (the default ``wants_produce_records``)."""

    plugin_name = "every-topic"

    @hookimpl
    def kanal_produce_records(self, ctx: Any) -> Any:
        return None


class Plugin:
    @hookimpl
    def kanal_interceptor_types(self) -> list[type[Interceptor]]:
        return [Recorder, Limited, Catchall, BadHook, FetchWatcher, OnDemand, Orders, EveryTopic]


@pytest.fixture
def pipeline() -> Pipeline:
    registry = PluginRegistry()
    registry.register(Plugin(), "test-plugin")
    return Pipeline(registry, lambda plugin: FakeServices())


def spec(name: str, priority: int = 100, scope: Scope | None = None, **config: Any) -> InterceptorSpec:
    return InterceptorSpec(name=name, plugin="recorder", priority=priority, scope=scope or Scope(), config=config)


def test_lower_priority_runs_first(pipeline: Pipeline) -> None:
    pipeline.configure([spec("b", 20, tag="b"), spec("a", 10, tag="a"), spec("c", 30, tag="c")])
    chain = pipeline.resolve()
    assert [c.spec.name for c in chain.interceptors] == ["a", "b", "c"]

    class Ctx:
        seen: list[str] = []

    for entry in chain.requests_for(0):
        entry.hook(Ctx)
    assert Ctx.seen == ["a", "b", "c"]
    assert chain.requests_for(1) == []
    assert chain.decode_request(0) and chain.decode_request(3) and not chain.decode_request(1)


def test_most_specific_scope_replaces_global(pipeline: Pipeline) -> None:
    pipeline.configure(
        [
            spec("policy", tag="global"),
            spec("policy", scope=Scope(group="team"), tag="group"),
            spec("policy", scope=Scope(username="bob"), tag="bob"),
            spec("other", scope=Scope(vcluster="vc1"), tag="vc"),
        ]
    )
    assert [c.instance.tag for c in pipeline.resolve().interceptors] == ["global"]  # type: ignore[attr-defined]
    assert [c.instance.tag for c in pipeline.resolve("alice", ("team",)).interceptors] == ["group"]  # type: ignore[attr-defined]
    assert [c.instance.tag for c in pipeline.resolve("bob", ("team",)).interceptors] == ["bob"]  # type: ignore[attr-defined]
    tags = sorted(c.instance.tag for c in pipeline.resolve("carol", (), "vc1").interceptors)  # type: ignore[attr-defined]
    assert tags == ["global", "vc"]


def tags(
    pipeline: Pipeline, username: str | None = None, groups: tuple[str, ...] = (), vcluster: str | None = None
) -> list[str]:
    return sorted(c.instance.tag for c in pipeline.resolve(username, groups, vcluster).interceptors)  # type: ignore[attr-defined]


PASSTHROUGH_ONLY = Scope(vcluster=PASSTHROUGH)


@pytest.mark.parametrize(
    ("scope", "applies_to"),
    [
        (Scope(), {"anonymous", "alice", "team-member", "tenant-a", "alice@tenant-a", "team@tenant-a"}),
        (PASSTHROUGH_ONLY, {"anonymous", "alice", "team-member"}),
        (Scope(vcluster=PASSTHROUGH, username="alice"), {"alice"}),
        (Scope(vcluster=PASSTHROUGH, group="team"), {"team-member"}),
        (Scope(vcluster="tenant-a"), {"tenant-a", "alice@tenant-a", "team@tenant-a"}),
        (Scope(vcluster="tenant-a", username="alice"), {"alice@tenant-a"}),
        (Scope(vcluster="tenant-a", group="team"), {"team@tenant-a"}),
        (Scope(username="alice"), {"alice", "alice@tenant-a"}),
        (Scope(group="team"), {"team-member", "team@tenant-a"}),
    ],
    ids=[
        "global",
        "passthrough",
        "passthrough-user",
        "passthrough-group",
        "vcluster",
        "vcluster-user",
        "vcluster-group",
        "user-anywhere",
        "group-anywhere",
    ],
)
def test_each_scope_targets_exactly_its_connections(pipeline: Pipeline, scope: Scope, applies_to: set[str]) -> None:
    """The targeting table: a scope's virtual cluster None is every virtual cluster, PASSTHROUGH is
    the connections in none; group and username narrow it."""
    connections: dict[str, tuple[str | None, tuple[str, ...], str | None]] = {
        "anonymous": (None, (), None),
        "alice": ("alice", (), None),
        "team-member": ("bob", ("team",), None),
        "tenant-a": ("carol", (), "tenant-a"),
        "alice@tenant-a": ("alice", (), "tenant-a"),
        "team@tenant-a": ("bob", ("team",), "tenant-a"),
    }
    pipeline.configure([spec("x", scope=scope, tag="x")])
    assert {who for who, identity in connections.items() if tags(pipeline, *identity)} == applies_to


def test_for_one_name_user_beats_group_beats_vcluster_beats_global(pipeline: Pipeline) -> None:
    pipeline.configure(
        [
            spec("policy", scope=Scope(), tag="global"),
            spec("policy", scope=Scope(vcluster="tenant-a"), tag="vcluster"),
            spec("policy", scope=Scope(vcluster="tenant-a", group="team"), tag="group"),
            spec("policy", scope=Scope(vcluster="tenant-a", username="alice"), tag="user"),
        ]
    )
    assert tags(pipeline, "alice", ("team",), "tenant-a") == ["user"]
    assert tags(pipeline, "bob", ("team",), "tenant-a") == ["group"]
    assert tags(pipeline, "carol", (), "tenant-a") == ["vcluster"]
    assert tags(pipeline, "alice", ("team",)) == ["global"]  # none of the tenant-a scopes: not in it


def test_a_user_scope_for_every_vcluster_beats_a_group_of_that_vcluster(pipeline: Pipeline) -> None:
    pipeline.configure(
        [
            spec("policy", scope=Scope(vcluster="tenant-a", group="team"), tag="group"),
            spec("policy", scope=Scope(username="alice"), tag="user-anywhere"),
        ]
    )
    assert tags(pipeline, "alice", ("team",), "tenant-a") == ["user-anywhere"]


def test_at_one_level_the_scope_naming_the_vcluster_wins(pipeline: Pipeline) -> None:
    pipeline.configure(
        [
            spec("policy", scope=Scope(), tag="global"),
            spec("policy", scope=PASSTHROUGH_ONLY, tag="passthrough"),
            spec("policy", scope=Scope(username="alice"), tag="alice-anywhere"),
            spec("policy", scope=Scope(vcluster="tenant-a", username="alice"), tag="alice@tenant-a"),
        ]
    )
    assert tags(pipeline) == ["passthrough"]
    assert tags(pipeline, "carol", (), "tenant-b") == ["global"]
    assert tags(pipeline, "alice", (), "tenant-a") == ["alice@tenant-a"]
    assert tags(pipeline, "alice", (), "tenant-b") == ["alice-anywhere"]


def test_between_two_groups_of_a_connection_the_first_in_alphabetical_order_wins(pipeline: Pipeline) -> None:
    for order in ([("zeta", "z"), ("alpha", "a")], [("alpha", "a"), ("zeta", "z")]):
        pipeline.configure([spec("policy", scope=Scope(group=group), tag=tag) for group, tag in order])
        assert tags(pipeline, "bob", ("alpha", "zeta")) == ["a"]
        assert tags(pipeline, "bob", ("zeta",)) == ["z"]


def test_a_membership_change_moves_the_version_connections_check(pipeline: Pipeline) -> None:
    before = pipeline.version
    pipeline.groups_changed()
    assert pipeline.version != before


def test_catchall_forces_decoding_of_everything(pipeline: Pipeline) -> None:
    pipeline.configure([InterceptorSpec(name="all", plugin="catchall")])
    chain = pipeline.resolve()
    assert chain.decode_request(42) and len(chain.requests_for(42)) == 1


def test_a_catchall_does_not_widen_what_narrow_interceptors_see(pipeline: Pipeline) -> None:
    pipeline.configure([InterceptorSpec(name="all", plugin="catchall", priority=50), spec("narrow", 10, tag="n")])
    chain = pipeline.resolve()
    assert len(chain.requests_for(42)) == 1  # only the catch-all
    assert [e.name for e in chain.requests_for(0)] == ["narrow", "all"]  # both, in priority order


def test_responses_on_demand_are_not_decoded_for_every_request(pipeline: Pipeline) -> None:
    pipeline.configure([InterceptorSpec(name="views", plugin="on-demand")])
    chain = pipeline.resolve()
    assert len(chain.responses_for(1)) == 1 and not chain.decode_response(1)
    assert chain.decode_request(1)  # its request hook decides, per request, with ctx.want_response()
    pipeline.configure(
        [InterceptorSpec(name="views", plugin="on-demand"), InterceptorSpec(name="w", plugin="fetch-watcher")]
    )
    chain = pipeline.resolve()
    assert len(chain.responses_for(1)) == 2 and chain.decode_response(1)  # the watcher needs them all


def test_produce_is_decoded_only_for_topics_a_records_hook_wants(pipeline: Pipeline) -> None:
    pipeline.configure([InterceptorSpec(name="orders", plugin="orders")])
    chain = pipeline.resolve()
    assert chain.decode_produce(["orders-eu"]) and chain.decode_produce(["payments", "orders-us"])
    assert not chain.decode_produce(["payments"]) and not chain.decode_produce([])
    assert chain.decode_produce(None)  # topics not known (ids never named, or not in the first bytes)
    assert chain.decode_produce(["broken"])  # an interceptor that cannot tell gets its hook called
    pipeline.configure(
        [InterceptorSpec(name="orders", plugin="orders"), InterceptorSpec(name="e", plugin="every-topic")]
    )
    assert pipeline.resolve().decode_produce(["payments"])
    pipeline.configure([InterceptorSpec(name="orders", plugin="orders"), spec("requests", tag="r")])
    assert pipeline.resolve().decode_produce(["payments"])  # a Produce request hook sees every request
    pipeline.configure([InterceptorSpec(name="views", plugin="on-demand")])
    assert not pipeline.resolve().decode_produce(None)  # no hook reads Produce


class Misspelt(Interceptor):
    plugin_name = "misspelt"

    @hookimpl
    def kanal_produce_record(self, ctx: Any) -> None:
        return None


def test_a_misspelt_hook_is_refused() -> None:
    registry = PluginRegistry()

    class P:
        @hookimpl
        def kanal_interceptor_types(self) -> list[type[Interceptor]]:
            return [Misspelt]

    registry.register(P(), "p")
    with pytest.raises(InterceptorConfigError, match="kanal_produce_record"):
        Pipeline(registry, lambda plugin: FakeServices()).configure([InterceptorSpec(name="x", plugin="misspelt")])


def test_configure_is_all_or_nothing(pipeline: Pipeline) -> None:
    pipeline.configure([spec("a", tag="a")])
    version = pipeline.version
    with pytest.raises(InterceptorConfigError, match=r"interceptor 'b' \(recorder\): tag: expected a string"):
        pipeline.configure([spec("a", tag="a"), spec("b", tag=5)])
    assert pipeline.version == version and [s.name for s in pipeline.specs()] == ["a"]


def test_unknown_plugin_lists_the_known_ones(pipeline: Pipeline) -> None:
    with pytest.raises(
        InterceptorConfigError,
        match=r"unknown plugin 'nope'.*catchall, every-topic, fetch-watcher, limited, on-demand, orders, recorder",
    ):
        pipeline.configure([InterceptorSpec(name="x", plugin="nope")])


def test_hook_signature_is_checked_against_the_hookspec(pipeline: Pipeline) -> None:
    with pytest.raises(InterceptorConfigError, match="extra"):
        pipeline.configure([InterceptorSpec(name="x", plugin="bad-hook")])


def test_type_name_or_qualified_class(pipeline: Pipeline) -> None:
    pipeline.configure([InterceptorSpec(name="x", plugin=f"{Recorder.__module__}:Recorder")])
    assert pipeline.resolve().interceptors[0].spec.name == "x"


def test_duplicate_type_names_from_two_plugins_are_refused() -> None:
    registry = PluginRegistry()
    registry.register(Plugin(), "one")

    class Twin(Recorder):
        pass

    class Other:
        @hookimpl
        def kanal_interceptor_types(self) -> list[type[Interceptor]]:
            return [Twin]

    with pytest.raises(PluginError, match="provided by both one and two"):
        registry.register(Other(), "two")


def test_sources_are_replaced_independently(pipeline: Pipeline) -> None:
    pipeline.configure([spec("from-file", tag="f")])
    pipeline.configure([spec("from-admin", tag="a")], source="admin")
    pipeline.configure([spec("from-plugin", tag="p")], source="views")
    assert sorted(s.name for s in pipeline.specs()) == ["from-admin", "from-file", "from-plugin"]
    pipeline.configure([], source="admin")
    assert sorted(c.spec.name for c in pipeline.resolve().interceptors) == ["from-file", "from-plugin"]
    assert [s.name for s in pipeline.specs(source="views")] == ["from-plugin"]
    with pytest.raises(InterceptorConfigError, match="already defined by config"):
        pipeline.configure([spec("from-file", tag="again")], source="admin")


def test_replaced_and_removed_interceptors_are_retired_and_unchanged_ones_kept() -> None:
    registry = PluginRegistry()
    registry.register(Plugin(), "test-plugin")
    retired: list[Interceptor] = []
    pipeline = Pipeline(registry, lambda plugin: FakeServices(), retired.append)
    pipeline.configure([spec("a", tag="1"), spec("b", tag="1")])
    first_a, first_b = (c.instance for c in pipeline.resolve().interceptors)
    pipeline.configure([spec("a", tag="1"), spec("b", tag="2")])  # a unchanged, b changed
    second_a, second_b = (c.instance for c in pipeline.resolve().interceptors)
    assert second_a is first_a and second_b is not first_b
    assert retired == [first_b]
    pipeline.configure([spec("b", tag="2")])  # a removed
    assert retired == [first_b, first_a]
    with pytest.raises(InterceptorConfigError):
        pipeline.configure([spec("b", tag="2"), spec("c", tag=5)])  # nothing changes, nothing retired
    assert retired == [first_b, first_a]


def test_interceptors_get_their_plugins_services() -> None:
    registry = PluginRegistry()
    registry.register(Plugin(), "test-plugin")
    asked: list[str] = []
    services = FakeServices()

    def services_for(plugin: str) -> GatewayServices:
        asked.append(plugin)
        return services

    Pipeline(registry, services_for).configure([spec("a")])
    assert asked == ["test-plugin"]


def test_placeholders_in_an_interceptor_config_read_the_gateways_environment() -> None:
    registry = PluginRegistry()
    registry.register(Plugin(), "test-plugin")
    pipeline = Pipeline(registry, lambda plugin: FakeServices(), environ={"TEAM": "blue"})
    pipeline.configure([spec("a", tag="${TEAM}-${REGION|eu}")])
    (instance,) = pipeline.instances()
    assert isinstance(instance, Recorder) and instance.tag == "blue-eu"
    assert pipeline.specs()[0].config == {"tag": "${TEAM}-${REGION|eu}"}  # the resource keeps the placeholder
    unset = r"interceptor 'b' \(recorder\): config.tag: environment variable MISSING"
    with pytest.raises(InterceptorConfigError, match=unset):
        pipeline.configure([spec("b", tag="${MISSING}")])


def test_placeholders_fill_numbers_and_flags_of_a_typed_config() -> None:
    registry = PluginRegistry()
    registry.register(Plugin(), "test-plugin")
    pipeline = Pipeline(registry, lambda plugin: FakeServices(), environ={"LIMIT": "1048576", "NAME": "7"})
    limited = InterceptorSpec(
        name="a", plugin="limited", config={"limit": "${LIMIT}", "enabled": "${ON|true}", "name": "${NAME}"}
    )
    pipeline.configure([limited])
    (instance,) = pipeline.instances()
    assert instance.config == LimitConfig(limit=1048576, enabled=True, name="7")
    with pytest.raises(InterceptorConfigError, match=r"\(limited\): limit: Expected `int`, got `str`"):
        pipeline.configure([InterceptorSpec(name="b", plugin="limited", config={"limit": "${ROWS|lots}"})])
