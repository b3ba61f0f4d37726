"""Topic views without a network: record rewriting, protocol rewriting, groups, the resource kind."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import pytest
from kanal_topicviews import groups, rewrite
from kanal_topicviews.connections import ValueDecoders, parse_connections
from kanal_topicviews.interceptor import PLUGIN_NAME, TopicViewsInterceptor
from kanal_topicviews.resource import SOURCE, topic_view_kind
from kanal_topicviews.runtime import RUNTIME, Runtime, shared_runtime
from kanal_topicviews.sql import compile_view
from kanal_topicviews.transform import FetchFailed, Transformer
from kanal_topicviews.views import View, Views, view_topic_id
from kio.schema.errors import ErrorCode

from kanal.api import FamilyCheck, Hint, SettingsFamily, hookimpl
from kanal.api.errors import ConfigError
from kanal.api.resources import ResourceError
from kanal.api.results import Reject
from kanal.config.settings import KnownSettings, Settings, build_settings
from kanal.gateway import Gateway
from kanal.pipeline.registry import PluginRegistry
from kanal.protocol.api import request_class, response_class
from kanal.protocol.entities import build, nested
from kanal.protocol.records import GZIP, LZ4, NONE, SNAPPY, ZSTD, Record, RecordSet, encode_batch

STATEMENT = "SELECT id, amount FROM orders WHERE amount > 100 AND currency = 'EUR'"


def manifest(name: str = "big-eur", statement: str = STATEMENT, on_error: str = "DROP", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gateway/v2",
        "kind": "TopicView",
        "metadata": {"name": name},
        "spec": {"transformation": {"type": "sql", "statement": statement}, "onError": {"type": on_error}, **spec},
    }


def view(name: str = "big-eur", statement: str = STATEMENT, on_error: str = "DROP") -> View:
    return View.from_manifest(manifest(name, statement, on_error), "test-cluster")


def order(i: int, amount: int, currency: str = "EUR") -> bytes:
    return orjson.dumps({"id": i, "amount": amount, "currency": currency, "note": "x" * 20})


def batch(values: Sequence[bytes | None], base_offset: int = 0, compression: int = NONE, **kw: Any) -> bytes:
    records = [Record(i, i * 10, f"k{i}".encode(), v, [("h", b"v")] if i % 2 else []) for i, v in enumerate(values)]
    return encode_batch(
        records, base_offset=base_offset, base_timestamp=1_700_000_000_000, compression=compression, **kw
    )


def records_of(data: bytes | None) -> list[tuple[int, bytes | None]]:
    assert data is not None
    out = []
    for b in RecordSet.parse(data).batches:
        out.extend((b.offset_of(r), r.value) for r in b.records())
    return out


# -- record rewriting ------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", [NONE, GZIP, SNAPPY, LZ4, ZSTD])
def test_filter_and_project_keep_physical_offsets(codec: int) -> None:
    data = batch([order(0, 50), order(1, 150), order(2, 500, "USD"), order(3, 900)], base_offset=40, compression=codec)
    out = view().transformer.fetch(data, 0, 40)
    assert records_of(out) == [(41, b'{"id":1,"amount":150}'), (43, b'{"id":3,"amount":900}')]
    (b,) = RecordSet.parse(out).batches
    assert (b.base_offset, b.last_offset_delta, b.next_offset, b.compression) == (40, 3, 44, codec)
    first = b.records()[0]
    assert (first.key, first.headers, b.timestamp_of(first)) == (b"k1", [("h", b"v")], 1_700_000_000_010)


def test_an_emptied_batch_still_moves_the_consumer_past_it() -> None:
    data = batch([order(0, 1), order(1, 2)], base_offset=7, compression=ZSTD) + batch([order(9, 999)], base_offset=9)
    out = view().transformer.fetch(data, 0, 7)
    first, second = RecordSet.parse(out).batches
    assert (first.base_offset, first.records_count, first.next_offset, first.compression) == (7, 0, 9, NONE)
    assert first.records() == []
    assert records_of(second.to_bytes()) == [(9, b'{"id":9,"amount":999}')]


def test_select_star_forwards_the_original_bytes() -> None:
    data = batch([order(0, 500), order(1, 600)])
    assert view(statement="SELECT * FROM orders WHERE amount > 100").transformer.fetch(data, 0, 0) is data
    out = view(statement="SELECT * FROM orders WHERE amount > 550").transformer.fetch(data, 0, 0)
    assert records_of(out) == [(1, order(1, 600))]


def test_records_before_the_fetch_offset_are_removed_unread() -> None:
    data = batch([b"not json", order(1, 500), order(2, 600)], base_offset=100)
    out = view(on_error="FAIL_FETCH").transformer.fetch(data, 3, 101)
    assert records_of(out) == [(101, b'{"id":1,"amount":500}'), (102, b'{"id":2,"amount":600}')]
    assert RecordSet.parse(out).batches[0].next_offset == 103


def test_metadata_columns_and_headers() -> None:
    sql = "SELECT id, record.offset AS o, record.partition AS p, record.key AS k, record.header.h AS h FROM orders"
    out = view(statement=sql).transformer.fetch(batch([order(0, 1), order(1, 2)], base_offset=5), 4, 5)
    assert [orjson.loads(v or b"") for _, v in records_of(out)] == [
        {"id": 0, "o": 5, "p": 4, "k": "k0", "h": None},
        {"id": 1, "o": 6, "p": 4, "k": "k1", "h": "v"},
    ]


def test_drop_removes_what_cannot_be_transformed() -> None:
    data = batch([b"not json", b"[1, 2]", None, order(3, 700), b"\xff\xfe"])
    assert records_of(view().transformer.fetch(data, 0, 0)) == [(3, b'{"id":3,"amount":700}')]


def test_fail_fetch_delivers_the_records_before_and_fails_at_the_bad_one() -> None:
    data = batch([order(0, 500), order(1, 5), b"oops", order(3, 700)], base_offset=20) + batch([order(9, 999)], 24)
    transformer = view(on_error="FAIL_FETCH").transformer
    with pytest.raises(FetchFailed) as failed:
        transformer.fetch(data, 0, 20)
    assert (failed.value.offset, failed.value.reason) == (22, "the value is not JSON")
    (head,) = RecordSet.parse(failed.value.records).batches
    assert (head.base_offset, head.next_offset, records_of(failed.value.records)) == (
        20,
        22,
        [(20, b'{"id":0,"amount":500}')],
    )
    with pytest.raises(FetchFailed) as failed:  # the consumer's next fetch starts at the bad record
        transformer.fetch(data, 0, 22)
    assert (failed.value.offset, failed.value.records) == (22, None)


def test_a_corrupt_batch_is_not_transformable() -> None:
    data = bytearray(batch([order(0, 500), order(1, 600)], base_offset=3))
    data[-1] ^= 0xFF
    dropped = view().transformer.fetch(bytes(data), 0, 3)
    assert [(b.base_offset, b.records_count, b.next_offset) for b in RecordSet.parse(dropped).batches] == [(3, 0, 5)]
    with pytest.raises(FetchFailed) as failed:
        view(on_error="FAIL_FETCH").transformer.fetch(bytes(data), 0, 3)
    assert failed.value.offset == 3 and "CRC" in failed.value.reason


def test_control_batches_and_a_truncated_tail_are_forwarded_as_they_are() -> None:
    marker = encode_batch(
        [Record(0, 0, b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00")],
        base_offset=2,
        base_timestamp=1,
        control=True,
        transactional=True,
        producer_id=7,
    )
    data = batch([order(0, 500), order(1, 1)], base_offset=0, transactional=True, producer_id=7) + marker
    full = data + batch([order(3, 999)], base_offset=3)
    truncated = full[:-10]
    out = view().transformer.fetch(truncated, 0, 0)
    assert out.endswith(marker + full[len(data) : -10])
    assert records_of(out[: len(out) - len(marker) - (len(full) - len(data) - 10)]) == [(0, b'{"id":0,"amount":500}')]


def test_fast_and_general_paths_agree() -> None:
    values = [order(i, i * 37 % 1000, "EUR" if i % 3 else "USD") for i in range(300)] + [b"bad", None]
    data = batch(values, base_offset=1000)
    fast = view().transformer.fetch(data, 0, 1000)
    general = Transformer(compile_view(STATEMENT + " AND record.partition >= 0"), True).fetch(data, 0, 1000)
    assert records_of(fast) == records_of(general)


# -- views and ids ---------------------------------------------------------------------------------------


def test_view_topic_ids_are_stable_and_distinct() -> None:
    a = view_topic_id("cluster-a", "v")
    assert a == view_topic_id("cluster-a", "v") == view("v").topic_id.__class__(str(a))
    assert len({a, view_topic_id("cluster-a", "w"), view_topic_id("cluster-b", "v")}) == 3
    assert a != uuid.UUID(int=0)
    assert Views.of([view("v")]).group_view("v::team-a") is not None
    assert Views.of([view("v")]).group_view("v") is None


# -- protocol rewriting ----------------------------------------------------------------------------------


def _names(mapping: dict[str, uuid.UUID]) -> Any:
    return mapping.get


def metadata_request(version: int, topics: Sequence[str] | None) -> Any:
    cls = request_class(3, version)
    items = None if topics is None else tuple(build(nested(cls, "topics"), name=t) for t in topics)
    return build(cls, topics=items, allow_auto_topic_creation=True)


def metadata_response(version: int, *names: str) -> Any:
    cls = response_class(3, version)
    topic_cls = nested(cls, "topics")
    part_cls = nested(topic_cls, "partitions")
    topics = tuple(
        build(
            topic_cls,
            name=n,
            topic_id=uuid.uuid5(uuid.NAMESPACE_DNS, n),
            partitions=tuple(build(part_cls, partition_index=i, leader_id=111) for i in range(3)),
        )
        for n in names
    )
    return build(cls, topics=topics)


def test_metadata_shows_the_view_as_a_copy_of_its_input_topic() -> None:
    views = Views.of([view()])
    request, plan = rewrite.metadata_request(metadata_request(12, ["big-eur"]), 12, views) or (None, None)
    assert [t.name for t in request.topics] == ["orders"] and request.allow_auto_topic_creation is False
    answer = rewrite.metadata_response(metadata_response(12, "orders"), plan)
    (topic,) = answer.topics
    assert (topic.name, topic.topic_id, len(topic.partitions)) == ("big-eur", views.by_name["big-eur"].topic_id, 3)

    request, plan = rewrite.metadata_request(metadata_request(12, ["big-eur", "orders"]), 12, views) or (None, None)
    assert [t.name for t in request.topics] == ["orders"]
    answer = rewrite.metadata_response(metadata_response(12, "orders"), plan)
    assert sorted(t.name for t in answer.topics) == ["big-eur", "orders"]

    assert rewrite.metadata_request(metadata_request(12, ["other"]), 12, views) is None
    for version, topics in ((12, None), (0, [])):
        request, plan = rewrite.metadata_request(metadata_request(version, topics), version, views) or (None, None)
        answer = rewrite.metadata_response(metadata_response(version, "orders", "other"), plan)
        assert sorted(t.name for t in answer.topics) == ["big-eur", "orders", "other"]


def fetch_request(version: int, topics: Sequence[tuple[Any, Sequence[tuple[int, int]]]]) -> Any:
    cls = request_class(1, version)
    topic_cls = nested(cls, "topics")
    part_cls = nested(topic_cls, "partitions")
    key = "topic_id" if version >= 13 else "topic"
    items = tuple(
        build(topic_cls, **{key: k}, partitions=tuple(build(part_cls, partition=p, fetch_offset=o) for p, o in parts))
        for k, parts in topics
    )
    return build(cls, topics=items, session_id=42, session_epoch=3)


def fetch_response(version: int, topics: Sequence[tuple[Any, Sequence[tuple[int, bytes]]]]) -> Any:
    cls = response_class(1, version)
    topic_cls = nested(cls, "responses")
    part_cls = nested(topic_cls, "partitions")
    key = "topic_id" if version >= 13 else "topic"
    items = tuple(
        build(
            topic_cls,
            **{key: k},
            partitions=tuple(build(part_cls, partition_index=p, high_watermark=99, records=r) for p, r in parts),
        )
        for k, parts in topics
    )
    return build(cls, responses=items)


def _apply(v: View, p: Any, fetch_offset: int) -> Any:
    from dataclasses import replace

    return replace(p, records=v.transformer.fetch(p.records, int(p.partition_index), fetch_offset))


@pytest.mark.parametrize("version", [4, 7, 12, 13, 17])
def test_fetch_on_a_view_goes_to_the_input_topic_without_a_session(version: int) -> None:
    v = view()
    views = Views.of([v])
    orders_id = uuid.uuid4()
    ids = _names({"orders": orders_id})
    key = v.topic_id if version >= 13 else "big-eur"
    physical = orders_id if version >= 13 else "orders"
    request, plan = rewrite.fetch_request(fetch_request(version, [(key, [(0, 5)])]), version, views, ids, 0) or (
        None,
        None,
    )
    (topic,) = request.topics
    assert getattr(topic, "topic_id" if version >= 13 else "topic") == physical
    if version >= 7:
        assert (request.session_id, request.session_epoch) == (0, -1)
    data = batch([order(0, 1), order(1, 200)], base_offset=5)
    answer = rewrite.fetch_response(fetch_response(version, [(physical, [(0, data)])]), plan, _apply)
    (topic,) = answer.responses
    assert getattr(topic, "topic_id" if version >= 13 else "topic") == key
    assert records_of(topic.partitions[0].records) == [(6, b'{"id":1,"amount":200}')]
    untouched = fetch_request(version, [(orders_id if version >= 13 else "orders", [(0, 5)])])
    assert rewrite.fetch_request(untouched, version, views, ids, 0) is None


def test_one_partition_asked_under_two_names_is_served_in_turn() -> None:
    views = Views.of([view(), view("cheap", "SELECT id FROM orders WHERE amount < 100")])
    request = fetch_request(12, [("big-eur", [(0, 10)]), ("cheap", [(0, 3)]), ("orders", [(0, 7), (1, 0)])])
    served = []
    for turn in range(3):
        upstream, plan = rewrite.fetch_request(request, 12, views, _names({}), turn) or (None, None)
        (topic,) = upstream.topics
        offsets = {int(p.partition): int(p.fetch_offset) for p in topic.partitions}
        served.append(offsets[0])
        assert offsets[1] == 0
        data = batch([order(i, 50) for i in range(12)])
        answer = rewrite.fetch_response(fetch_response(12, [("orders", [(0, data), (1, data)])]), plan, _apply)
        by_topic = {t.topic: {int(p.partition_index): p for p in t.partitions} for t in answer.responses}
        assert set(by_topic) == {"big-eur", "cheap", "orders"} and set(by_topic["orders"]) == {0, 1}
        empty = [t for t in ("big-eur", "cheap", "orders") if by_topic[t][0].records == b""]
        assert len(empty) == 2 and all(by_topic[t][0].error_code == ErrorCode.none for t in empty)
    assert served == [10, 3, 7]


def test_list_offsets_rename() -> None:
    views = Views.of([view()])
    cls = request_class(2, 7)
    topic_cls = nested(cls, "topics")
    part_cls = nested(topic_cls, "partitions")
    topics = (
        build(topic_cls, name="big-eur", partitions=(build(part_cls, partition_index=0, timestamp=-1),)),
        build(topic_cls, name="orders", partitions=(build(part_cls, partition_index=1, timestamp=-1),)),
    )
    upstream, plan = rewrite.rename_request(topics, "name", "partitions", "partition_index", views, _names({})) or (
        None,
        None,
    )
    assert [(t.name, [p.partition_index for p in t.partitions]) for t in upstream] == [("orders", [0, 1])]
    resp_topic = nested(response_class(2, 7), "topics")
    resp_part = nested(resp_topic, "partitions")
    answered = (
        build(resp_topic, name="orders", partitions=tuple(build(resp_part, partition_index=i) for i in (0, 1))),
    )
    back = rewrite.rename_response(answered, "name", "partitions", "partition_index", plan)
    assert sorted((t.name, [p.partition_index for p in t.partitions]) for t in back) == [
        ("big-eur", [0]),
        ("orders", [1]),
    ]


# -- consumer groups -------------------------------------------------------------------------------------


def commit(version: int, group: str, *topics: str) -> Any:
    cls = request_class(8, version)
    topic_cls = nested(cls, "topics")
    part_cls = nested(topic_cls, "partitions")
    items = tuple(
        build(topic_cls, name=t, partitions=(build(part_cls, partition_index=0, committed_offset=5),)) for t in topics
    )
    return build(cls, group_id=group, topics=items)


def test_commits_on_a_view_need_the_view_prefix() -> None:
    views = Views.of([view(), view("cheap", "SELECT id FROM orders WHERE amount < 100")])
    for group, topics in (("team", ["big-eur"]), ("cheap::x", ["big-eur"]), ("big-eur::x", ["orders"])):
        refused = groups.commit_request(commit(9, group, *topics), views, _names({}))
        assert isinstance(refused, Reject) and refused.error_code == ErrorCode.invalid_group_id
        assert refused.message and group in refused.message
    upstream, plan = groups.commit_request(commit(9, "big-eur::x", "big-eur", "other"), views, _names({})) or (
        None,
        None,
    )
    assert [t.name for t in upstream.topics] == ["orders", "other"]
    assert [t.name for t in groups.commit_response(upstream.topics, plan)] == ["big-eur", "other"]
    assert groups.commit_request(commit(9, "team", "orders"), views, _names({})) is None


def test_offset_fetch_reads_the_view_offsets_of_view_groups_only() -> None:
    views = Views.of([view()])
    cls = request_class(9, 7)
    topic_cls = nested(cls, "topics")
    asked = build(cls, group_id="team", topics=(build(topic_cls, name="big-eur", partition_indexes=(0, 1)),))
    upstream, plan = groups.offset_fetch_request(asked, views, _names({})) or (None, None)
    assert upstream.topics == ()
    answer = groups.offset_fetch_response(build(response_class(9, 7), topics=()), plan)
    assert [(t.name, [(p.partition_index, p.committed_offset) for p in t.partitions]) for t in answer.topics] == [
        ("big-eur", [(0, -1), (1, -1)])
    ]
    everything = build(cls, group_id="big-eur::a", topics=None)
    upstream, plan = groups.offset_fetch_request(everything, views, _names({})) or (None, None)
    resp_topic = nested(response_class(9, 7), "topics")
    answer = groups.offset_fetch_response(
        build(response_class(9, 7), topics=(build(resp_topic, name="orders"), build(resp_topic, name="x"))), plan
    )
    assert [t.name for t in answer.topics] == ["big-eur", "x"]


# -- the interceptor and the resource kind ---------------------------------------------------------------


def gateway(env: dict[str, str] | None = None) -> Gateway:
    registry = PluginRegistry()
    import kanal_topicviews.plugin as plugin

    registry.register(plugin, "topic-views")
    environ = {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "GATEWAY_CLUSTER_ID": "unit", **(env or {})}
    return Gateway(build_settings(environ, known=KnownSettings(registry.declared_settings())), registry, environ)


class _State:
    def __init__(self, *manifests: dict[str, Any]) -> None:
        self.items = list(manifests)

    def resources(self, kind: str) -> list[dict[str, Any]]:
        return self.items if kind == "TopicView" else []


def _invalid(kind: Any, body: Any, state: _State | None = None) -> str:
    with pytest.raises(ResourceError) as error:
        kind.validate(body, state or _State())
    assert error.value.status == 400
    return error.value.msg


def test_validation_names_what_is_wrong() -> None:
    gw = gateway()
    kind = topic_view_kind(gw.services_for(PLUGIN_NAME))
    assert "JOIN" in _invalid(kind, manifest(statement="SELECT a FROM t JOIN u ON t.x = u.x"))
    assert "GROUP BY" in _invalid(kind, manifest(statement="SELECT a FROM t GROUP BY a"))
    assert "SUBSTRING" in _invalid(kind, manifest(statement="SELECT SUBSTRING(a, 1, 2) AS s FROM t"))
    assert "onError" in _invalid(kind, manifest(on_error="IGNORE"))
    assert "spec.transformation.type" in _invalid(
        kind, {**manifest(), "spec": {**manifest()["spec"], "transformation": {"type": "cel", "statement": "x"}}}
    )
    assert "unknown field spec.extra" in _invalid(kind, manifest(extra=1))
    assert "cannot read itself" in _invalid(kind, manifest(statement='SELECT * FROM "big-eur"'))
    assert "is a topic view" in _invalid(kind, manifest(statement="SELECT * FROM other"), _State(manifest("other")))
    assert "input topic of topic view" in _invalid(kind, manifest("orders", "SELECT * FROM x"), _State(manifest()))
    gw.topic_names.put(uuid.uuid4(), "taken")
    assert "exists on the cluster" in _invalid(kind, manifest("taken"))
    assert "no schema registry" in _invalid(kind, manifest(schemaRegistryConnectionName="nope"))
    good = kind.validate(manifest(on_error="fail_fetch"), _State())
    assert good["spec"]["onError"] == {"type": "FAIL_FETCH"} and good["apiVersion"] == "gateway/v2"


def test_apply_installs_and_removes_the_interceptor() -> None:
    gw = gateway()
    kind = topic_view_kind(gw.services_for(PLUGIN_NAME))
    statuses = kind.apply([manifest(), manifest("cheap", "SELECT id FROM orders")], _State())
    assert {k[0]: s.state for k, s in statuses.items()} == {"big-eur": "Ready", "cheap": "Ready"}
    (spec,) = gw.pipeline.specs(source=SOURCE)
    assert spec.plugin == PLUGIN_NAME
    (item,) = [c for c in gw.pipeline.resolve().interceptors if not c.builtin]
    assert isinstance(item.instance, TopicViewsInterceptor) and set(item.instance.views.by_name) == {"big-eur", "cheap"}
    kind.apply([], _State())
    assert gw.pipeline.specs(source=SOURCE) == []


def test_each_gateway_has_its_own_runtime_which_its_interceptor_uses() -> None:
    first, second = gateway(), gateway()
    kind = topic_view_kind(first.services_for(PLUGIN_NAME))
    topic_view_kind(second.services_for(PLUGIN_NAME))
    runtime = shared_runtime(first.services_for(PLUGIN_NAME))
    assert runtime is not None and runtime is not shared_runtime(second.services_for(PLUGIN_NAME))
    assert runtime.read_ahead and runtime.pool is not None
    kind.apply([manifest()], _State())
    (item,) = [c for c in first.pipeline.resolve().interceptors if not c.builtin]
    assert isinstance(item.instance, TopicViewsInterceptor) and item.instance.runtime is runtime
    assert "runtime" not in item.spec.config  # the config is plain JSON: views and the cluster id
    assert not [c for c in second.pipeline.resolve().interceptors if not c.builtin]


def test_feature_flags_and_connections_come_from_the_gateway_settings() -> None:
    gw = gateway(
        {
            "GATEWAY_FEATURE_FLAGS_TOPIC_VIEWS_READ_AHEAD": "false",
            "GATEWAY_FEATURE_FLAGS_TOPIC_VIEWS_HELPER_PROCESS": "off",
            "GATEWAY_EXTERNAL_CONNECTION_MY_SR_CONFIG_URL": "http://127.0.0.1:1",
        }
    )
    kind = topic_view_kind(gw.services_for(PLUGIN_NAME))
    runtime = shared_runtime(gw.services_for(PLUGIN_NAME))
    assert runtime is not None and not runtime.read_ahead and runtime.pool is None
    assert (
        kind.validate(manifest(schemaRegistryConnectionName="my-sr"), _State())["spec"]["schemaRegistryConnectionName"]
        == "my-sr"
    )
    assert "no schema registry" in _invalid(kind, manifest(schemaRegistryConnectionName="other"))


def test_the_plugin_closes_the_helper_process_when_the_gateway_stops() -> None:
    import kanal_topicviews.plugin as plugin
    import trio
    import trio.testing

    gw = gateway()
    services = gw.services_for(PLUGIN_NAME)
    (kind,) = plugin.kanal_admin_resources(services)
    assert kind.kind == "TopicView"
    plugin.kanal_admin_resources(services)  # closed once, however often the kind is built
    runtime = shared_runtime(services)
    assert runtime is not None and runtime.pool is not None

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(gw.core_services.run)
            await trio.testing.wait_all_tasks_blocked()
            assert runtime.pool is not None and runtime.pool.usable
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert not runtime.pool.usable


def test_a_fetch_by_topic_id_learns_the_input_topic_id_from_the_gateway_kafka_client() -> None:
    import trio

    from kanal.testing import FakeKafka, FakeServices, Harness

    kafka = FakeKafka(lambda request: metadata_response(12, "orders"))
    harness = Harness(services=FakeServices(kafka=kafka))
    interceptor = harness.add(TopicViewsInterceptor, {"views": [manifest()], "clusterId": "unit"})
    assert isinstance(interceptor, TopicViewsInterceptor)
    view_id = interceptor.views.by_name["big-eur"].topic_id

    async def main() -> None:
        for _ in range(2):
            exchange = await harness.request(fetch_request(13, [(view_id, [(0, 5)])]))
            (topic,) = exchange.forwarded.topics
            assert topic.topic_id == uuid.uuid5(uuid.NAMESPACE_DNS, "orders")

    trio.run(main)
    assert [[t.name for t in request.topics] for _, request in kafka.calls] == [["orders"]]  # asked once


def test_read_aheads_go_to_the_consumer_broker_and_stop_when_the_interceptor_is_closed() -> None:
    import trio
    import trio.testing
    from kanal_topicviews import readahead

    from kanal.api import Connection
    from kanal.testing import FakeKafka, FakeServices, Harness

    values = [orjson.dumps({"id": i, "amount": 500, "currency": "EUR", "note": "x" * 3000}) for i in range(90)]
    data = batch(values)
    assert len(data) >= readahead.MIN_BYTES

    async def never(request: Any) -> Any:
        await trio.sleep_forever()

    kafka = FakeKafka(never)
    services = FakeServices(kafka=kafka)
    services.shared[RUNTIME] = Runtime(None, read_ahead=True)
    harness = Harness(services=services, connection=Connection(1, "client", "listener", 3))
    interceptor = harness.add(TopicViewsInterceptor, {"views": [manifest()], "clusterId": "unit"})
    assert isinstance(interceptor, TopicViewsInterceptor)
    request = fetch_request(12, [("big-eur", [(0, 0)])])

    def upstream(forwarded: Any) -> Any:
        return fetch_response(12, [("orders", [(0, data)])])

    async def main() -> None:
        exchange = await harness.request(request, upstream)
        (topic,) = exchange.response.responses
        assert topic.topic == "big-eur"
        assert interceptor.read_aheads_started == 1
        async with trio.open_nursery() as nursery:
            nursery.start_soon(services.run_tasks)
            await trio.testing.wait_all_tasks_blocked()
            assert [node_id for node_id, _ in kafka.calls] == [3]  # the broker the consumer fetched from
            (chain,) = harness.connection.state[readahead.STATE].values()
            (ra,) = chain.values()
            await harness.close()  # aclose: the read-ahead's call is cancelled
            with trio.fail_after(5):
                await ra.done.wait()
        assert ra.response is None
        chain.clear()
        await harness.request(request, upstream, correlation_id=2)
        assert interceptor.read_aheads_started == 1  # none after aclose

    trio.run(main)


# -- external connections --------------------------------------------------------------------------------


def test_schema_registry_connections_from_the_environment() -> None:
    env = {
        "GATEWAY_EXTERNAL_CONNECTION_MY_SR_CONFIG_URL": "http://a:8081, http://b:8081/",
        "GATEWAY_EXTERNAL_CONNECTION_MY_SR_CONFIG_BASIC_AUTH_USER_INFO": "u:p:w",
        "GATEWAY_EXTERNAL_CONNECTION_VAULT_TYPE": "KMS",
        "GATEWAY_EXTERNAL_CONNECTION_VAULT_CONFIG_ENGINE_TYPE": "TRANSIT",
    }
    (sr,) = parse_connections(env).values()
    assert (sr.urls, sr.username, sr.password) == (("http://a:8081", "http://b:8081"), "u", "p:w")
    assert ValueDecoders.from_env(env).has("my-sr")
    typo = {**env, "GATEWAY_EXTERNAL_CONNECTION_MY_SR_CONFIG_BASIC_AUTH_PASWORD": "x"}
    decoders = ValueDecoders.from_env(typo)  # not claimed: it may be another plugin's connection
    assert not decoders.has("my-sr") and "BASIC_AUTH_PASWORD" in (decoders.why_not("my-sr") or "")
    with pytest.raises(ConfigError) as error:
        parse_connections({**typo, "GATEWAY_EXTERNAL_CONNECTION_MY_SR_TYPE": "SCHEMA_REGISTRY"})
    assert error.value.key == "GATEWAY_EXTERNAL_CONNECTION_MY_SR_CONFIG_BASIC_AUTH_PASWORD"
    with pytest.raises(ConfigError) as error:
        parse_connections({"GATEWAY_EXTERNAL_CONNECTION_R_TYPE": "schema_registry"})
    assert error.value.key == "GATEWAY_EXTERNAL_CONNECTION_R_CONFIG_URL"


EC = "GATEWAY_EXTERNAL_CONNECTION_"
VAULT_PROPERTIES = ("URI", "TOKEN", "AUTH_TYPE", "ENGINE_TYPE", "ENGINE_MOUNT")


class FakeKmsPlugin:
    """Another plugin declaring the external-connection family for its own type (VAULT), as a KMS
    plugin will: it reads its connections, rejects what is wrong with them, and hints at the rest."""

    @staticmethod
    def check(variables: Mapping[str, str]) -> FamilyCheck:
        mine = {
            v[len(EC) : -len("_TYPE")] for v, value in variables.items() if v.endswith("_TYPE") and value == "VAULT"
        }
        read: list[str] = []
        hints: dict[str, Hint] = {}
        for variable in variables:
            name, _, prop = variable[len(EC) :].partition("_CONFIG_")
            if not prop and variable.endswith("_TYPE"):
                if variable[len(EC) : -len("_TYPE")] in mine:
                    read.append(variable)
                else:
                    hints[variable] = Hint(values=["VAULT"], what="external connection type")
            elif name in mine:
                if prop not in VAULT_PROPERTIES:
                    raise ConfigError(variable, f"unknown vault connection property {prop}")
                read.append(variable)
        return FamilyCheck(read=read, hints=hints)

    @hookimpl
    def kanal_settings(self) -> list[str | SettingsFamily]:
        return [SettingsFamily(EC + "*", self.check)]


def startup(env: dict[str, str], *, kms: bool = False) -> Settings:
    """The gateway's settings as ``kanal run`` builds them at startup, with the topic views plugin (and
    the fake KMS plugin)."""
    import kanal_topicviews.plugin as plugin

    registry = PluginRegistry()
    registry.register(plugin, "topic-views")
    if kms:
        registry.register(FakeKmsPlugin(), "kms")
    return build_settings(env, known=KnownSettings(registry.declared_settings()))


@pytest.mark.parametrize(
    "env,error",
    [
        (
            {f"{EC}SR_CONFIG_URLL": "http://r:8081"},
            f"{EC}SR_CONFIG_URLL: unknown setting (did you mean {EC}SR_CONFIG_URL?)",
        ),
        (
            {f"{EC}SR_CONFIG_URL": "http://r:8081", f"{EC}SR_TYPEE": "SCHEMA_REGISTRY"},
            f"{EC}SR_TYPEE: unknown setting (did you mean {EC}SR_TYPE?)",
        ),
        (
            {f"{EC}SR_CONFIGURL": "http://r:8081"},
            f"{EC}SR_CONFIGURL: unknown setting (did you mean {EC}SR_CONFIG_URL?)",
        ),
        (
            {f"{EC}SR_CONFIG_URL": "http://r:8081", f"{EC}SR_CONFIG_BASIC_AUTH_PASWORD": "pw"},
            f"{EC}SR_CONFIG_BASIC_AUTH_PASWORD: unknown setting (did you mean {EC}SR_CONFIG_BASIC_AUTH_PASSWORD?)",
        ),
        (
            {f"{EC}SR_TYPE": "SCHEMA_REGISTRY", f"{EC}SR_CONFIG_URLL": "http://r:8081"},
            f"{EC}SR_CONFIG_URLL: unknown schema registry connection property URLL (did you mean URL?); known: URL,",
        ),
        (
            {f"{EC}SR_TYPE": "SCHEMA_REGISTRY"},
            f"{EC}SR_CONFIG_URL: required: the schema registry's URL",
        ),
        (
            {f"{EC}SR_CONFIG_URL": "http://r:8081", f"{EC}SR_CONFIG_TIMEOUT_MS": "soon"},
            f"{EC}SR_CONFIG_TIMEOUT_MS: expected a positive integer, got 'soon'",
        ),
        (
            {f"{EC}V_TYPE": "VAULT", f"{EC}V_CONFIG_URI": "http://v:8200"},
            f"{EC}V_TYPE: unknown external connection type 'VAULT'; known: SCHEMA_REGISTRY",
        ),
        (
            {f"{EC}SR_TYPE": "SCHEMA_REGISTRI", f"{EC}SR_CONFIG_URL": "http://r:8081"},
            f"{EC}SR_TYPE: unknown external connection type 'SCHEMA_REGISTRI' (did you mean SCHEMA_REGISTRY?);"
            " known: SCHEMA_REGISTRY",
        ),
    ],
)
def test_a_misspelt_external_connection_stops_the_gateway_at_startup(env: dict[str, str], error: str) -> None:
    with pytest.raises(ConfigError) as info:
        startup(env)
    assert str(info.value).startswith(error)


def test_another_plugin_adds_external_connection_types() -> None:
    env = {
        f"{EC}MY_SR_CONFIG_URL": "http://r:8081",
        f"{EC}MY_VAULT_TYPE": "VAULT",
        f"{EC}MY_VAULT_CONFIG_URI": "http://v:8200",
        f"{EC}MY_VAULT_CONFIG_ENGINE_TYPE": "TRANSIT",
    }
    startup(env, kms=True)
    decoders = ValueDecoders.from_env(env)
    assert decoders.has("my-sr") and "ENGINE_TYPE, URI" in (decoders.why_not("my-vault") or "")
    with pytest.raises(ConfigError) as info:  # the vault connection's owner names what is wrong in it
        startup({**env, f"{EC}MY_VAULT_CONFIG_ENGINE": "TRANSIT"}, kms=True)
    assert str(info.value) == f"{EC}MY_VAULT_CONFIG_ENGINE: unknown vault connection property ENGINE"
    with pytest.raises(ConfigError) as info:  # a type neither plugin knows: the types of both
        startup({**env, f"{EC}MY_VAULT_TYPE": "VALT"}, kms=True)
    assert str(info.value) == (
        f"{EC}MY_VAULT_TYPE: unknown external connection type 'VALT' (did you mean VAULT?);"
        " known: SCHEMA_REGISTRY, VAULT"
    )
    with pytest.raises(ConfigError) as info:  # the registry's hints still apply beside the other plugin
        startup({**env, f"{EC}OTHER_CONFIG_URLL": "http://r:8081"}, kms=True)
    assert str(info.value) == f"{EC}OTHER_CONFIG_URLL: unknown setting (did you mean {EC}OTHER_CONFIG_URL?)"
    with pytest.raises(ConfigError, match=r"unknown external connection type 'VAULT'"):  # without that plugin
        startup(env)


# -- read-ahead and the helper process -------------------------------------------------------------------


def test_next_offset_and_split_point() -> None:
    from kanal_topicviews.pool import split_point
    from kanal_topicviews.transform import next_offset

    data = batch([order(0, 1)] * 3, base_offset=10) + batch([order(1, 2)] * 2, base_offset=13)
    assert next_offset(data) == 15
    assert next_offset(data + data[:30]) == 15  # a truncated tail does not count
    assert next_offset(b"") is None
    first = len(batch([order(0, 1)] * 3, base_offset=10))
    assert split_point(data) == first and split_point(data[:first]) is None


def test_the_helper_process_gives_what_the_gateway_would() -> None:
    import trio
    from kanal_topicviews.pool import HelperPool, split_point

    values = [order(i, i * 37 % 1000, "EUR" if i % 3 else "USD") for i in range(2000)]
    good = b"".join(batch(values[i : i + 200], base_offset=i) for i in range(0, 2000, 200))
    bad_values = list(values)
    bad_values[1500] = b"not json"
    bad = b"".join(batch(bad_values[i : i + 200], base_offset=i) for i in range(0, 2000, 200))
    assert len(good) >= 512 * 1024 // 4

    async def main() -> None:
        import kanal_topicviews.pool as pool_module

        import kanal.api.parallel

        pool = HelperPool()
        old = pool_module.MIN_SPLIT, kanal.api.parallel._MAP_STEP
        pool_module.MIN_SPLIT = 1024  # type: ignore[misc]
        kanal.api.parallel._MAP_STEP = 4096  # the shared memory grows with the chunks
        try:
            assert await pool.ready()
            keep_all = view(statement="SELECT * FROM orders WHERE amount >= 0")
            assert await pool.fetch(keep_all.transformer, keep_all.statement, True, good, 0, 0) is good
            for on_error in ("DROP", "FAIL_FETCH"):
                v = view(on_error=on_error)
                drop = on_error == "DROP"
                small = good[: split_point(good, 0.3)]
                assert await pool.fetch(v.transformer, v.statement, drop, small, 0, 0) == v.transformer.fetch(
                    small, 0, 0
                )
                assert await pool.fetch(v.transformer, v.statement, drop, good, 0, 0) == v.transformer.fetch(good, 0, 0)
                assert pool.started
                if drop:
                    assert await pool.fetch(v.transformer, v.statement, drop, bad, 0, 0) == v.transformer.fetch(
                        bad, 0, 0
                    )
                    continue
                with pytest.raises(FetchFailed) as local:
                    v.transformer.fetch(bad, 0, 0)
                with pytest.raises(FetchFailed) as split:
                    await pool.fetch(v.transformer, v.statement, drop, bad, 0, 0)
                assert (
                    (split.value.offset, split.value.records)
                    == (local.value.offset, local.value.records)
                    == (
                        1500,
                        local.value.records,
                    )
                )
                assert local.value.records is not None and records_of(split.value.records)[-1][0] < 1500
        finally:
            pool_module.MIN_SPLIT, kanal.api.parallel._MAP_STEP = old  # type: ignore[misc]
            pool.close()

    trio.run(main)


def test_read_ahead_requests_copy_the_consumer_request() -> None:
    from kanal_topicviews.readahead import prepare_request

    upstream = fetch_request(12, [("orders", [(0, 5), (1, 9)]), ("other", [(0, 1)])])
    request = prepare_request(upstream, "topic", "orders", 1, 4000)
    (topic,) = request.topics
    (part,) = topic.partitions
    assert (topic.topic, part.partition, part.fetch_offset, request.min_bytes) == ("orders", 1, 4000, 1)
    assert (request.session_id, request.session_epoch) == (0, -1)
    assert prepare_request(upstream, "topic", "orders", 7, 1) is None
