"""Encrypting and decrypting whole record batches: what the decrypter gets back is what was
produced, whatever the parts, and ciphertext moved elsewhere (another field, record, topic)
never decrypts."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from batch_keys import Keys, batch_of, plan_of
from hypothesis import given, settings
from hypothesis import strategies as st
from kanal_encryption.crypto.envelope import is_envelope
from kanal_encryption.decrypt import DecryptionFailed, Selection, decrypt_batch
from kanal_encryption.encrypt import AlreadyEncrypted, EncryptionFailed, encrypt_batch
from kanal_encryption.kms.memory import InMemoryKms

from kanal.api import InterceptorConfigError, Record, RecordBatch


def _round(
    plan: Any, keys: Keys, records: list[Record], topic: str = "orders", decrypt_topic: str | None = None
) -> tuple[RecordBatch, RecordBatch]:
    failures: list[tuple[str, Exception]] = []

    async def run() -> tuple[RecordBatch, RecordBatch]:
        sealed = RecordBatch.from_bytes(await encrypt_batch(plan, topic, batch_of(records), keys))
        data, _ = await decrypt_batch(Selection(), decrypt_topic or topic, sealed, keys, lambda *f: failures.append(f))
        return sealed, RecordBatch.from_bytes(data) if data is not None else sealed

    return trio.run(run)


KEY = "in-memory-kms://batches"
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), st.text(max_size=30))


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(
        st.dictionaries(st.sampled_from(["a", "b", "c"]), json_scalars, max_size=3), min_size=1, max_size=8
    ),
    keyed=st.booleans(),
)
def test_fields_round_trip(values: list[dict[str, Any]], keyed: bool) -> None:
    keys = Keys()
    plan = plan_of(
        keys,
        kmsConfig={},
        recordValue={
            "fields": [
                {"fieldName": "a", "keySecretId": KEY},
                {"fieldName": "b", "keySecretId": KEY, "algorithm": "XCHACHA20_POLY1305"},
            ]
        },
    )
    records = [
        Record(offset_delta=i, key=b"k%d" % i if keyed else None, value=json.dumps(v).encode())
        for i, v in enumerate(values)
    ]
    sealed, clear = _round(plan, keys, records)
    assert [json.loads(r.value) for r in clear.records()] == values
    for record, value in zip(sealed.records(), values, strict=True):
        stored = json.loads(record.value)
        assert stored.get("c", "absent") == value.get("c", "absent")  # not encrypted
        assert all(isinstance(stored[f], str) and stored[f] != value[f] for f in ("a", "b") if f in value)


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(st.one_of(st.none(), st.binary(max_size=300)), min_size=1, max_size=8),
    codec=st.sampled_from(["none", "gzip", "zstd", "lz4", "snappy"]),
)
def test_payloads_keys_and_headers_round_trip(values: list[bytes | None], codec: str) -> None:
    keys = Keys()
    plan = plan_of(
        keys,
        kmsConfig={},
        compressionType=codec,
        recordValue={"payload": {"keySecretId": KEY, "algorithm": "AES256_GCM"}},
        recordKey={"payload": {"keySecretId": KEY}},
        recordHeader={"header": "secret-.*", "payload": {"keySecretId": KEY}},
    )
    headers = [("secret-a", b"x"), ("plain", b"y"), ("secret-b", None)]
    records = [Record(offset_delta=i, key=b"key", value=v, headers=headers) for i, v in enumerate(values)]
    sealed, clear = _round(plan, keys, records)
    assert [(r.key, r.value, r.headers) for r in clear.records()] == [(b"key", v, headers) for v in values]
    for record, value in zip(sealed.records(), values, strict=True):
        assert is_envelope(record.key) and (record.value is None) == (value is None)  # a tombstone stays one
        assert value is None or is_envelope(record.value)
        assert (
            record.headers[1] == ("plain", b"y")
            and is_envelope(record.headers[0][1])
            and record.headers[2] == ("secret-b", None)
        )


def test_ciphertext_moved_to_another_record_field_or_topic_stays_encrypted() -> None:
    keys = Keys()
    plan = plan_of(
        keys,
        kmsConfig={},
        recordValue={"fields": [{"fieldName": "a", "keySecretId": KEY}, {"fieldName": "b", "keySecretId": KEY}]},
    )
    records = [
        Record(offset_delta=i, key=b"k%d" % i, value=json.dumps({"a": f"a{i}", "b": f"b{i}"}).encode())
        for i in range(2)
    ]

    async def run() -> None:
        sealed = [
            json.loads(r.value)
            for r in RecordBatch.from_bytes(await encrypt_batch(plan, "orders", batch_of(records), keys)).records()
        ]
        moved = [
            {"a": sealed[1]["a"], "b": sealed[1]["b"]},  # the fields of another record (another key)
            {"a": sealed[1]["b"], "b": sealed[1]["a"]},  # fields swapped within the record
        ]
        batch = batch_of(
            [
                Record(offset_delta=i, key=r.key, value=json.dumps(m).encode())
                for i, (r, m) in enumerate(zip(records, moved, strict=True))
            ]
        )
        failures: list[Any] = []
        data, count = await decrypt_batch(Selection(), "orders", batch, keys, lambda *f: failures.append(f))
        assert data is None and count == 0 and len(failures) == 4  # nothing decrypted, each reported
        genuine = batch_of(
            [
                Record(offset_delta=i, key=r.key, value=json.dumps(s).encode())
                for i, (r, s) in enumerate(zip(records, sealed, strict=True))
            ]
        )
        data, count = await decrypt_batch(Selection(), "payments", genuine, keys, lambda *f: failures.append(f))
        assert data is None and count == 0  # another topic
        with pytest.raises(DecryptionFailed):
            await decrypt_batch(Selection(fail_fetch=True), "payments", genuine, keys, lambda *f: None)
        data, count = await decrypt_batch(Selection(), "orders", genuine, keys, lambda *f: None)
        assert count == 4 and data is not None

    trio.run(run)


def test_already_encrypted_input_fails_or_is_skipped_as_configured() -> None:
    keys = Keys()
    config = {"kmsConfig": {}, "recordValue": {"payload": {"keySecretId": KEY}}}
    records = [Record(offset_delta=0, value=b"clear")]
    sealed, _ = _round(plan_of(keys, **config), keys, records)

    async def again(plan: Any) -> bytes:
        return await encrypt_batch(plan, "orders", sealed, keys)

    with pytest.raises(AlreadyEncrypted):
        trio.run(again, plan_of(keys, **config))
    skipped = RecordBatch.from_bytes(trio.run(again, plan_of(keys, errorPolicy="skip_already_encrypted", **config)))
    assert [r.value for r in skipped.records()] == [r.value for r in sealed.records()]


def test_a_record_that_cannot_be_encrypted_fails_thebatch_of() -> None:
    keys = Keys()
    fields = plan_of(keys, kmsConfig={}, recordValue={"fields": [{"fieldName": "a", "keySecretId": KEY}]})
    with pytest.raises(EncryptionFailed, match="not JSON"):
        trio.run(encrypt_batch, fields, "orders", batch_of([Record(value=b"not json")]), keys)
    templated = plan_of(
        keys, kmsConfig={}, recordValue={"payload": {"keySecretId": "in-memory-kms://k-{{record.header.tenant}}"}}
    )
    with pytest.raises(EncryptionFailed, match="no header 'tenant'"):
        trio.run(encrypt_batch, templated, "orders", batch_of([Record(value=b"v")]), keys)


def test_templated_keys_give_each_tenant_its_own_key() -> None:
    keys = Keys()
    plan = plan_of(
        keys, kmsConfig={}, recordValue={"payload": {"keySecretId": "in-memory-kms://t-{{record.header.tenant}}"}}
    )
    records = [
        Record(offset_delta=i, value=b"v", headers=[("tenant", t)]) for i, t in enumerate([b"blue", b"red", b"blue"])
    ]
    sealed, clear = _round(plan, keys, records)
    refs = [Envelope_ref(r.value) for r in sealed.records()]
    assert refs == ["in-memory-kms://t-blue", "in-memory-kms://t-red", "in-memory-kms://t-blue"]
    assert [r.value for r in clear.records()] == [b"v"] * 3


def Envelope_ref(value: bytes | None) -> str:
    from kanal_encryption.crypto.envelope import parse

    assert value is not None
    envelope = parse(value)
    assert envelope is not None
    return envelope.key_ref


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"kmsConfig": {}}, "nothing to encrypt"),
        (
            {"kmsConfig": {}, "recordValue": {"payload": {"keySecretId": KEY, "algorithm": "ROT13"}}},
            "recordValue.payload",
        ),
        ({"kmsConfig": {}, "recordValue": {"payload": {"keyId": "k"}}}, "keySecretId"),
        ({"kmsConfig": {}, "recordValue": {"fields": [{"fieldName": "a..b", "keySecretId": KEY}]}}, "fieldName"),
        (
            {
                "kmsConfig": {},
                "recordKey": {"payload": {"keySecretId": KEY}},
                "recordValue": {"payload": {"keySecretId": "in-memory-kms://{{record.key}}"}},
            },
            "reads the record key",
        ),
        (
            {
                "kmsConfig": {},
                "recordValue": {
                    "fields": [
                        {"fieldName": "user.id", "keySecretId": KEY},
                        {"fieldName": "x", "keySecretId": "in-memory-kms://u{{record.value.user.id}}"},
                    ]
                },
            },
            "reads the value field 'user.id'",
        ),
        (
            {
                "kmsConfig": {},
                "recordHeader": {"fields": [{"fieldName": "tenant", "keySecretId": KEY}]},
                "recordValue": {"payload": {"keySecretId": "in-memory-kms://{{record.header.tenant}}"}},
            },
            "reads the header 'tenant'",
        ),
    ],
)
def test_configs_that_cannot_work_are_refused_naming_the_problem(config: dict[str, Any], message: str) -> None:
    with pytest.raises(InterceptorConfigError, match=message):
        plan_of(Keys(), **config)


def test_the_in_memory_kms_is_one_per_process() -> None:
    assert isinstance(Keys().locator.locate(KEY).kms, InMemoryKms)


def test_whole_values_decrypt_record_by_record_whatever_sits_between_them() -> None:
    """Values under one data key, with a tampered one, one under another key, a clear one and a
    tombstone among them: each envelope decrypts or is reported on its own."""
    keys = Keys()
    first = plan_of(keys, kmsConfig={}, recordValue={"payload": {"keySecretId": KEY}})
    other = plan_of(keys, kmsConfig={}, recordValue={"payload": {"keySecretId": "in-memory-kms://other"}})

    async def sealed(plan: Any, values: list[bytes], keyed: bool) -> list[Record]:
        batch = batch_of(
            [Record(offset_delta=i, key=b"k%d" % i if keyed else None, value=v) for i, v in enumerate(values)]
        )
        return RecordBatch.from_bytes(await encrypt_batch(plan, "orders", batch, keys)).records()

    async def run() -> None:
        a = await sealed(first, [b"a0", b"a1", b"a2", b"a3"], keyed=True)
        b = await sealed(other, [b"b0"], keyed=False)
        tampered = bytearray(a[2].value or b"")
        tampered[-1] ^= 1
        mixed = [
            (a[0].key, a[0].value),
            (a[1].key, a[1].value),
            (a[2].key, bytes(tampered)),
            (None, b[0].value),
            (b"clear", b"clear value"),
            (b"t", None),
            (a[3].key, a[3].value),
        ]
        batch = batch_of([Record(offset_delta=i, key=k, value=v) for i, (k, v) in enumerate(mixed)])
        failures: list[Any] = []
        data, count = await decrypt_batch(Selection(), "orders", batch, keys, lambda *f: failures.append(f))
        assert data is not None and count == 4 and len(failures) == 1
        values = [r.value for r in RecordBatch.from_bytes(data).records()]
        assert values == [b"a0", b"a1", bytes(tampered), b"b0", b"clear value", None, b"a3"]

    trio.run(run)
