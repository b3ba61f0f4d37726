"""Avro field encryption with a schema registry: records stay Avro under their schema id, string
and bytes fields hold envelopes, other fields a placeholder with the envelope in a header, and the
decrypter gives back the record as produced. The registry is a fake (``schema_by_id`` and
``references`` answering from a dict, or failing as told)."""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import msgspec
import pytest
import trio
from kanal_encryption.avro_fields import (
    AvroCodec,
    AvroSchemas,
    SchemaUnavailable,
    check_registry_connections,
    registry_client,
)
from kanal_encryption.compile import compile_plan
from kanal_encryption.config import EncryptionConfig, SchemaRegistryBlock
from kanal_encryption.crypto.envelope import TEXT_MAGIC, is_envelope
from kanal_encryption.decrypt import DecryptionFailed, Selection, decrypt_batch
from kanal_encryption.encrypt import AlreadyEncrypted, EncryptionFailed, encrypt_batch
from kanal_schemas import RegistryUnavailable, Schema, SchemaNotFound
from test_batches import KEY, Keys

from kanal.api import ConfigError, InterceptorConfigError, Record, RecordBatch, encode_batch

SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "card", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "pin", "type": "int"},
        {"name": "secret", "type": "bytes"},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {
            "name": "customer",
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "Customer",
                    "fields": [
                        {"name": "email", "type": "string"},
                        {"name": "age", "type": ["null", "int"], "default": None},
                    ],
                },
            ],
            "default": None,
        },
        {"name": "items", "type": {"type": "array", "items": {"type": "map", "values": "long"}}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
    ],
}
SCHEMA_ID = 7
PLAIN = fastavro.parse_schema(json.loads(json.dumps(SCHEMA)))


class FakeRegistry:
    def __init__(self, schemas: dict[int, dict[str, Any] | str]) -> None:
        self.schemas = schemas
        self.lookups = 0
        self.down = False

    async def schema_by_id(self, schema_id: int) -> Schema:
        self.lookups += 1
        if self.down:
            raise RegistryUnavailable("connection refused")
        found = self.schemas.get(schema_id)
        if found is None:
            raise SchemaNotFound(f"schema id {schema_id} is not in the schema registry")
        if isinstance(found, str):
            return Schema(text=found, schema_type="PROTOBUF", id=schema_id)
        return Schema(text=json.dumps(found), id=schema_id)

    async def references(self, schema: Schema) -> list[Schema]:
        return []

    async def aclose(self) -> None:
        pass


def _order(i: int, **changes: Any) -> dict[str, Any]:
    from decimal import Decimal

    value = {
        "id": i,
        "card": f"4111-{i:04d}",
        "amount": 12.5 + i,
        "note": None if i % 2 else f"note {i}",
        "pin": 1234 + i,
        "secret": b"s3cret-%d" % i,
        "price": Decimal(f"{i}.25"),
        "customer": None if i == 3 else {"email": f"u{i}@example.com", "age": 30 + i if i % 2 else None},
        "items": [{"a": i, "b": 2}],
        "kind": "B",
    }
    value.update(changes)
    return value


def _framed(value: dict[str, Any], schema_id: int = SCHEMA_ID) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, PLAIN, value)
    return b"\x00" + schema_id.to_bytes(4, "big") + out.getvalue()


def _read(data: bytes) -> tuple[int, Any]:
    assert data[0] == 0
    return int.from_bytes(data[1:5], "big"), fastavro.schemaless_reader(io.BytesIO(data[5:]), PLAIN, None)


def _batch(records: list[Record]) -> RecordBatch:
    return RecordBatch.from_bytes(encode_batch(records, base_timestamp=1_700_000_000_000))


def _plan(keys: Keys, fields: list[str], **config: Any) -> Any:
    spec = {"kmsConfig": {}, "recordValue": {"fields": [{"fieldName": f, "keySecretId": KEY} for f in fields]}}
    return compile_plan(msgspec.convert({**spec, **config}, EncryptionConfig), keys.locator)


def _schemas(registry: FakeRegistry | None = None) -> AvroSchemas:
    return AvroSchemas(registry or FakeRegistry({SCHEMA_ID: SCHEMA}))  # type: ignore[arg-type]


FIELDS = ["card", "amount", "note", "pin", "secret", "price", "customer.email", "customer.age", "items[0].a", "kind"]


def _seal(plan: Any, keys: Keys, records: list[Record], avro: AvroSchemas) -> RecordBatch:
    return RecordBatch.from_bytes(trio.run(encrypt_batch, plan, "orders", _batch(records), keys, avro))


def _open(
    keys: Keys, batch: RecordBatch, avro: AvroSchemas | None, selection: Selection | None = None
) -> tuple[RecordBatch, list[tuple[str, Exception]]]:
    failures: list[tuple[str, Exception]] = []

    def failed(label: str, error: Exception) -> None:
        failures.append((label, error))

    async def run() -> tuple[bytes | None, int]:
        return await decrypt_batch(selection or Selection(), "orders", batch, keys, failed, avro)

    data, _ = trio.run(run)
    return (RecordBatch.from_bytes(data) if data is not None else batch), failures


def test_avro_records_stay_avro_with_their_fields_sealed_and_come_back() -> None:
    keys = Keys()
    registry = FakeRegistry({SCHEMA_ID: SCHEMA})
    avro = _schemas(registry)
    plan = _plan(keys, FIELDS)
    values = [_order(i) for i in range(5)]
    records = [
        Record(offset_delta=i, key=b"k%d" % i, value=_framed(v), headers=[("trace", b"t")])
        for i, v in enumerate(values)
    ]
    sealed = _seal(plan, keys, records, avro)
    assert registry.lookups == 1  # one fetch for the id, none per record

    for record, original in zip(sealed.records(), values, strict=True):
        schema_id, stored = _read(record.value)  # still Avro, same schema id
        assert schema_id == SCHEMA_ID and stored["id"] == original["id"]
        assert stored["card"].startswith(TEXT_MAGIC) and stored["card"] != original["card"]
        assert stored["note"].startswith(TEXT_MAGIC)  # a nullable string: its null is sealed too
        assert is_envelope(stored["secret"])
        assert stored["amount"] == 4.9e-324 and stored["pin"] == -(2**31) and stored["kind"] == "A"
        assert stored["items"][0]["a"] == -(2**63) and stored["items"][0]["b"] == 2
        headers = dict(record.headers)
        assert headers["trace"] == b"t" and stored["price"] != original["price"]  # a decimal: its bytes sealed
        for name in ("amount", "pin", "items[0].a", "kind"):
            assert is_envelope(headers[f"kanal.enc.value.{name}"])
        if original["customer"] is None:
            assert stored["customer"] is None and "kanal.enc.value.customer.age" not in headers
        else:
            assert stored["customer"]["email"].startswith(TEXT_MAGIC) and stored["customer"]["age"] is None
            assert is_envelope(headers["kanal.enc.value.customer.age"])
        assert original["card"].encode() not in record.value

    clear, failures = _open(keys, sealed, avro)
    assert failures == []
    assert [_read(r.value)[1] for r in clear.records()] == values
    assert [r.headers for r in clear.records()] == [[("trace", b"t")]] * 5  # the kanal.enc headers are gone
    assert [r.value for r in clear.records()] == [r.value for r in records]  # bit for bit


def test_only_listed_fields_are_decrypted_and_others_keep_their_headers() -> None:
    keys = Keys()
    avro = _schemas()
    sealed = _seal(_plan(keys, ["card", "amount"]), keys, [Record(offset_delta=0, value=_framed(_order(1)))], avro)
    clear, _ = _open(keys, sealed, avro, Selection(value=frozenset({"amount"})))
    record = next(iter(clear.records()))
    value = _read(record.value)[1]
    assert value["amount"] == 13.5 and value["card"].startswith(TEXT_MAGIC)
    assert record.headers == []
    untouched, failures = _open(keys, sealed, None)  # no registry: left as stored
    assert next(iter(untouched.records())).value == next(iter(sealed.records())).value and failures == []


def test_ciphertext_moved_to_another_record_does_not_decrypt() -> None:
    keys = Keys()
    avro = _schemas()
    records = [Record(offset_delta=i, key=b"k%d" % i, value=_framed(_order(i))) for i in range(2)]
    sealed = list(_seal(_plan(keys, ["card", "pin"]), keys, records, avro).records())
    moved = _batch([Record(offset_delta=0, key=b"k0", value=sealed[1].value, headers=sealed[1].headers)])
    clear, failures = _open(keys, moved, avro)
    assert next(iter(clear.records())).value == sealed[1].value and len(failures) == 2
    with pytest.raises(DecryptionFailed):
        _open(keys, moved, avro, Selection(fail_fetch=True))


def test_json_values_on_the_same_topic_still_work() -> None:
    keys = Keys()
    avro = _schemas()
    records = [
        Record(offset_delta=0, value=b'{"card": "4111", "amount": 3}'),
        Record(offset_delta=1, value=_framed(_order(2))),
    ]
    sealed = list(_seal(_plan(keys, ["card", "amount"]), keys, records, avro).records())
    assert json.loads(sealed[0].value)["card"].startswith(TEXT_MAGIC)
    clear = list(
        _open(
            keys, _batch([Record(offset_delta=i, value=r.value, headers=r.headers) for i, r in enumerate(sealed)]), avro
        )[0].records()
    )
    assert json.loads(clear[0].value) == {"card": "4111", "amount": 3}
    assert _read(clear[1].value)[1] == _order(2)


def test_failures_on_produce() -> None:
    keys = Keys()
    registry = FakeRegistry({SCHEMA_ID: SCHEMA, 8: "syntax = 'proto3';"})
    plan = _plan(keys, ["card"])

    def run(value: bytes, avro: AvroSchemas | None) -> Any:
        return trio.run(encrypt_batch, plan, "orders", _batch([Record(offset_delta=0, value=value)]), keys, avro)

    with pytest.raises(EncryptionFailed):  # does not decode with its schema
        run(b"\x00" + SCHEMA_ID.to_bytes(4, "big") + b"\x07", _schemas(registry))
    with pytest.raises(EncryptionFailed):  # no registry: framed Avro is not JSON
        run(_framed(_order(1)), None)
    with pytest.raises(SchemaUnavailable) as unknown:
        run(_framed(_order(1), schema_id=99), _schemas(registry))
    assert not unknown.value.retriable
    with pytest.raises(SchemaUnavailable) as protobuf:
        run(_framed(_order(1), schema_id=8), _schemas(registry))
    assert not protobuf.value.retriable
    registry.down = True
    with pytest.raises(SchemaUnavailable) as down:
        run(_framed(_order(1)), _schemas(registry))
    assert down.value.retriable


def test_already_encrypted_fields_fail_or_are_skipped() -> None:
    keys = Keys()
    avro = _schemas()
    sealed = next(
        iter(
            _seal(
                _plan(keys, ["card", "pin"]), keys, [Record(offset_delta=0, value=_framed(_order(1)))], avro
            ).records()
        )
    )
    again = [Record(offset_delta=0, value=sealed.value, headers=sealed.headers)]
    with pytest.raises(AlreadyEncrypted):
        _seal(_plan(keys, ["card"]), keys, again, avro)
    with pytest.raises(AlreadyEncrypted):
        _seal(_plan(keys, ["pin"]), keys, again, avro)
    skipped = _seal(_plan(keys, ["card", "pin"], errorPolicy="skip_already_encrypted"), keys, again, avro)
    assert next(iter(skipped.records())).value == sealed.value


def test_the_registry_down_on_fetch_leaves_records_as_stored() -> None:
    keys = Keys()
    sealed = _seal(_plan(keys, ["card"]), keys, [Record(offset_delta=0, value=_framed(_order(1)))], _schemas())
    registry = FakeRegistry({SCHEMA_ID: SCHEMA})
    registry.down = True
    clear, failures = _open(keys, sealed, _schemas(registry))
    assert next(iter(clear.records())).value == next(iter(sealed.records())).value and len(failures) == 1
    with pytest.raises(DecryptionFailed):
        _open(keys, sealed, _schemas(registry), Selection(fail_fetch=True))


def test_placeholders_and_storage_by_type() -> None:
    codec = AvroCodec(1, json.dumps(SCHEMA))
    fields = {f["name"]: f["type"] for f in codec.schema["fields"]}
    assert [codec.storage(fields[n]) for n in ("card", "note", "secret", "price", "amount", "customer")] == [
        "string",
        "string",
        "bytes",
        "bytes",  # a decimal is read as its bytes
        "header",
        "header",
    ]
    assert codec.placeholder(fields["customer"]) is None
    assert codec.placeholder(fields["items"]) == []
    assert codec.placeholder({"type": "fixed", "name": "F", "size": 3}) == b"\x00\x00\x00"
    assert codec.placeholder({"type": "record", "name": "R", "fields": [{"name": "x", "type": "float"}]}) == {
        "x": 1.4e-45
    }


def test_registry_clients_from_connections_and_inline_blocks() -> None:
    env = {
        "GATEWAY_EXTERNAL_CONNECTION_SR_CONFIG_URL": "http://registry:8081",
        "GATEWAY_EXTERNAL_CONNECTION_SR_CONFIG_BASIC_AUTH_USERNAME": "u",
        "GATEWAY_EXTERNAL_CONNECTION_SR_CONFIG_BASIC_AUTH_PASSWORD": "p",
        "GATEWAY_EXTERNAL_CONNECTION_VAULT_CONFIG_URI": "http://vault:8200",
    }
    assert sorted(check_registry_connections(env).read) == sorted(k for k in env if "_SR_" in k)
    client = registry_client(env, "sr", None)
    assert client is not None and client.urls == ("http://registry:8081",)
    assert registry_client(env, None, None) is None
    inline = registry_client(
        {}, None, SchemaRegistryBlock(host="http://r:8081", basic_auth_username="a", basic_auth_password="b")
    )
    assert inline is not None
    with pytest.raises(InterceptorConfigError, match="no schema registry external connection 'vault'"):
        registry_client(env, "vault", None)
    with pytest.raises(InterceptorConfigError, match="not both"):
        registry_client(env, "sr", SchemaRegistryBlock(host="http://r"))
    with pytest.raises(InterceptorConfigError, match="host"):
        registry_client({}, None, SchemaRegistryBlock(host="r:8081"))
    with pytest.raises(ConfigError):
        check_registry_connections({"GATEWAY_EXTERNAL_CONNECTION_SR_TYPE": "SCHEMA_REGISTRY"})
    config = msgspec.convert(
        {"recordValue": {"fields": []}, "schemaRegistryConfig": {"host": "http://r", "basicAuthUsername": "x"}},
        EncryptionConfig,
    )
    assert config.schema_registry_config is not None and config.schema_registry_config.basic_auth_username == "x"
