"""Unit tests of the contrib-header-injection interceptor on record sets built with Kanal's record codec.

Each test builds a Produce partition's records with ``kanal.api.encode_batch``, runs the hook as
the gateway would (one call per topic-partition, on an interceptor whose config Kanal validated),
then parses the bytes the gateway would forward and checks them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from header_injection_helpers import header_injection
from kanal.api import (
    GZIP,
    LZ4,
    NONE,
    SNAPPY,
    ZSTD,
    ApiKey,
    Connection,
    Headers,
    InterceptorSpec,
    Record,
    RecordBatch,
    RecordsContext,
    RecordSet,
    encode_batch,
)
from kanal.pipeline.chain import Pipeline
from kanal.pipeline.registry import PluginRegistry
from kanal.testing import FakeServices

from kanal_header_injection import HeaderInjection, kanal_interceptor_types

CONTROL_COMMIT = 1  # the control type of a transaction's commit marker
BASE_TS = 1_700_000_000_123  # ms; deltas below make every record's timestamp distinct
CLIENT_ADDRESS = "10.1.2.3:54321"


def make_records(n: int = 5, headers: Headers | None = None) -> list[Record]:
    return [
        Record(
            offset_delta=i,
            timestamp_delta=7 * i,
            key=None if i == 2 else f"k{i}".encode(),
            value=None if i == 3 else f"value-{i}".encode() * (i + 1),
            headers=list(headers) if headers is not None else [("trace", f"t{i}".encode()), ("empty", None)],
        )
        for i in range(n)
    ]


def producer_batch(records: list[Record], *, compression: int = NONE, base_sequence: int = 42) -> bytes:
    """A batch as an idempotent producer sends it."""
    return encode_batch(
        records,
        base_timestamp=BASE_TS,
        compression=compression,
        producer_id=9001,
        producer_epoch=3,
        base_sequence=base_sequence,
    )


def context(data: bytes, topic: str = "orders", partition: int = 2, client_id: str | None = "app-1") -> RecordsContext:
    connection = Connection(
        id=1, client_address=CLIENT_ADDRESS, listener_address="127.0.0.1:9092", node_id=111, client_id=client_id
    )
    return RecordsContext(connection, ApiKey.PRODUCE, 9, client_id, topic, partition, RecordSet.parse(data))


def run(config: Mapping[str, Any], data: bytes, **where: Any) -> tuple[RecordsContext, bytes | None]:
    """Runs the hook on ``data``; returns the context and the bytes the gateway would forward."""
    ctx = context(data, **where)
    assert header_injection(config).kanal_produce_records(ctx) is None
    return ctx, ctx.records.to_bytes()


def decoded(data: bytes | None) -> list[RecordBatch]:
    assert data is not None
    batches = RecordSet.parse(data).batches
    for batch in batches:
        batch.check_crc()  # every forwarded batch carries a valid CRC
    return batches


def headers_of(data: bytes | None) -> list[Headers]:
    return [r.headers for b in decoded(data) for r in b.records()]


def test_literal_headers_are_appended_after_the_records_own() -> None:
    data = producer_batch(make_records())
    _, out = run({"headers": {"x-origin": "kanal", "x-dc": "eu-1"}}, data)
    assert headers_of(out) == [
        [("trace", f"t{i}".encode()), ("empty", None), ("x-origin", b"kanal"), ("x-dc", b"eu-1")] for i in range(5)
    ]


def test_records_without_headers_get_them() -> None:
    _, out = run({"headers": {"x-origin": "kanal"}}, producer_batch(make_records(headers=[])))
    assert headers_of(out) == [[("x-origin", b"kanal")]] * 5


def test_templates_are_rendered_for_the_connection_topic_and_partition() -> None:
    config = {
        "headers": {
            "x-client": "{{clientId}}",
            "x-from": "{{ clientAddress }}",
            "x-where": "topic={{topic}} partition={{partition}}",
            "x-mixed": "{{clientId}}@{{clientAddress}}",
        }
    }
    _, out = run(config, producer_batch(make_records(headers=[])), topic="payments", partition=7)
    assert headers_of(out)[0] == [
        ("x-client", b"app-1"),
        ("x-from", CLIENT_ADDRESS.encode()),
        ("x-where", b"topic=payments partition=7"),
        ("x-mixed", b"app-1@" + CLIENT_ADDRESS.encode()),
    ]


def test_null_client_id_renders_empty() -> None:
    _, out = run({"headers": {"x-client": "<{{clientId}}>"}}, producer_batch(make_records(1, [])), client_id=None)
    assert headers_of(out) == [[("x-client", b"<>")]]


def test_numbers_and_null_values() -> None:
    _, out = run({"headers": {"x-version": 2, "x-ratio": 0.5, "x-flag": None}}, producer_batch(make_records(1, [])))
    assert headers_of(out) == [[("x-version", b"2"), ("x-ratio", b"0.5"), ("x-flag", None)]]


def test_existing_header_wins_by_default() -> None:
    records = make_records(3, headers=[])
    records[1].headers = [("x-origin", b"producer"), ("other", b"1")]
    _, out = run({"headers": {"x-origin": "kanal", "x-dc": "eu-1"}}, producer_batch(records))
    assert headers_of(out) == [
        [("x-origin", b"kanal"), ("x-dc", b"eu-1")],
        [("x-origin", b"producer"), ("other", b"1"), ("x-dc", b"eu-1")],
        [("x-origin", b"kanal"), ("x-dc", b"eu-1")],
    ]


def test_override_replaces_every_header_of_that_name() -> None:
    records = make_records(2, headers=[])
    records[0].headers = [("x-origin", b"a"), ("keep", b"k"), ("x-origin", b"b")]
    config = {"headers": {"x-origin": "kanal"}, "overrideIfExists": True}
    _, out = run(config, producer_batch(records))
    assert headers_of(out) == [[("keep", b"k"), ("x-origin", b"kanal")], [("x-origin", b"kanal")]]


@pytest.mark.parametrize("compression", [NONE, GZIP, SNAPPY, LZ4, ZSTD], ids=["none", "gzip", "snappy", "lz4", "zstd"])
def test_everything_but_the_headers_is_unchanged(compression: int) -> None:
    original = make_records(20)
    data = producer_batch(original, compression=compression)
    _, out = run({"headers": {"x-origin": "kanal", "x-where": "{{topic}}"}}, data)
    (before,) = decoded(data)
    (after,) = decoded(out)
    # batch header: producer id/epoch/sequence (idempotence), codec, timestamps, offsets, count
    for attr in (
        "base_offset",
        "attributes",
        "last_offset_delta",
        "base_timestamp",
        "max_timestamp",
        "producer_id",
        "producer_epoch",
        "base_sequence",
        "records_count",
        "partition_leader_epoch",
    ):
        assert getattr(after, attr) == getattr(before, attr), attr
    assert after.compression == compression
    for old, new in zip(before.records(), after.records(), strict=True):
        assert (new.key, new.value, new.offset_delta, new.attributes) == (
            old.key,
            old.value,
            old.offset_delta,
            old.attributes,
        )
        assert after.timestamp_of(new) == before.timestamp_of(old)
        assert new.headers == [*old.headers, ("x-origin", b"kanal"), ("x-where", b"orders")]


def test_topics_not_selected_are_forwarded_byte_for_byte() -> None:
    data = producer_batch(make_records())
    config = {"headers": {"x-origin": "kanal"}, "topics": ["orders", "pay-.*"]}
    ctx, out = run(config, data, topic="orders-eu")  # a regex must match the whole name
    assert not ctx.records.changed()
    assert out is data
    _, out = run(config, data, topic="pay-1")
    assert headers_of(out)[0][-1] == ("x-origin", b"kanal")
    _, out = run(config, data, topic="orders")
    assert headers_of(out)[0][-1] == ("x-origin", b"kanal")
    interceptor = header_injection(config)  # requests for other topics are not even decoded
    assert [interceptor.wants_produce_records(t) for t in ("orders", "pay-1", "orders-eu")] == [True, True, False]
    assert header_injection({"headers": {"x-origin": "kanal"}}).wants_produce_records("anything")


def test_every_batch_of_the_partition_is_changed_and_control_batches_are_not() -> None:
    first = producer_batch(make_records(3), base_sequence=0)
    marker = encode_batch(
        [Record(key=b"\x00\x00\x00\x01", value=b"\x00\x00\x00\x00\x00\x00")],
        base_timestamp=BASE_TS,
        control=True,
        transactional=True,
        producer_id=9001,
        producer_epoch=3,
    )
    second = producer_batch(make_records(2), compression=GZIP, base_sequence=3)
    ctx, out = run({"headers": {"x-origin": "kanal"}}, first + marker + second)
    batches = decoded(out)
    assert len(batches) == 3
    assert batches[1].control_type == CONTROL_COMMIT
    assert batches[1].to_bytes() == marker
    assert not ctx.records.batches[1].changed()
    for batch in (batches[0], batches[2]):
        assert all(r.headers[-1] == ("x-origin", b"kanal") for r in batch.records())


def test_null_records_are_left_alone() -> None:
    ctx = context(b"")
    ctx.records = RecordSet.parse(None)
    assert header_injection({"headers": {"x": "y"}}).kanal_produce_records(ctx) is None
    assert ctx.records.to_bytes() is None


def test_a_later_interceptor_can_edit_headers_in_place() -> None:
    """Every record gets its own header list, so in-place edits by the next interceptor stay local."""
    ctx = context(producer_batch(make_records(3, headers=[])))
    header_injection({"headers": {"x-origin": "kanal"}}).kanal_produce_records(ctx)
    records = ctx.records.batches[0].records()
    records[0].headers.append(("only-first", b"1"))
    assert [len(r.headers) for r in records] == [2, 1, 1]


def test_two_instances_chain() -> None:
    ctx = context(producer_batch(make_records(1, headers=[("x-env", b"dev")])))
    header_injection({"headers": {"x-origin": "kanal", "x-env": "ignored"}}).kanal_produce_records(ctx)
    header_injection({"headers": {"x-env": "prod"}, "overrideIfExists": True}).kanal_produce_records(ctx)
    assert headers_of(ctx.records.to_bytes()) == [[("x-origin", b"kanal"), ("x-env", b"prod")]]


# -- how Kanal sees the plugin


def test_plugin_object_declares_the_interceptor_type() -> None:
    assert kanal_interceptor_types() == [HeaderInjection]
    assert HeaderInjection.plugin_name == "contrib-header-injection"


def test_installed_entry_point_is_found_and_only_produce_is_decoded() -> None:
    """Needs the distribution installed (``pip install -e plugins-contrib/kanal-header-injection``)."""
    registry = PluginRegistry()
    registry.load_entry_points()
    assert registry.interceptor_type("contrib-header-injection") is HeaderInjection, (
        "kanal-header-injection is not installed: its kanal.plugins entry point was not found"
    )
    pipeline = Pipeline(registry, lambda plugin: FakeServices())
    pipeline.configure(
        [InterceptorSpec("add-origin", "contrib-header-injection", config={"headers": {"x-origin": "kanal"}})]
    )
    chain = pipeline.resolve()
    assert len(chain.produce_records) == 1
    assert chain.decode_request(ApiKey.PRODUCE)
    assert not any(chain.decode_request(key) for key in ApiKey if key != ApiKey.PRODUCE)
    assert not any(chain.decode_response(key) for key in ApiKey)
