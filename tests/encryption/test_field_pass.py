"""The compiled field passes (``_aead.c``'s ``seal_json_fields`` and ``open_json_fields``): they
seal and open the same fields the Python passes do, to the same documents; they never take for
JSON what orjson refuses; and what they do not decide (surrogate escapes, exponents, fields already
encrypted, a key to fetch, an envelope that does not open) goes to the Python pass, so no field is
ever left in clear and every failure is reported as before."""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any
from unittest.mock import patch

import orjson
import pytest
import trio
from batch_keys import Keys, batch_of, plan_of
from hypothesis import given, settings
from hypothesis import strategies as st
from kanal_encryption import decrypt as decrypt_module
from kanal_encryption.crypto.ciphers import seal_json_fields
from kanal_encryption.crypto.envelope import TEXT_MAGIC, Sealer
from kanal_encryption.decrypt import DecryptionFailed, Selection, decrypt_batch
from kanal_encryption.encrypt import AlreadyEncrypted, Plan, encrypt_batch
from kanal_encryption.targets import associated_data

from kanal.api import Record, RecordBatch, record_spans, records_area

KEY = "in-memory-kms://splice"
PATHS = ["a", "b.c", "l[1]", "l[0].a", "é"]

names = st.sampled_from(["a", "b", "c", "l", "é", 'q"', "x\\y", "\n"])
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(names, inner, max_size=4)),
    max_leaves=12,
)
#: How producers write JSON: compact, indented, spaced, ASCII-escaped or not.
styles = st.sampled_from(
    [
        lambda v: orjson.dumps(v),
        lambda v: json.dumps(v).encode(),
        lambda v: json.dumps(v, indent=2, ensure_ascii=False).encode(),
        lambda v: json.dumps(v, separators=(" ,", " : ")).encode(),
    ]
)


def _plan(keys: Keys, paths: list[str], **extra: Any) -> Plan:
    fields = [{"fieldName": p, "keySecretId": KEY} for p in paths]
    return plan_of(keys, kmsConfig={}, recordValue={"fields": fields}, **extra)


def _without_splice(plan: Plan) -> Plan:
    python = dataclasses.replace(plan)
    object.__setattr__(python, "splice", False)
    return python


def _encrypt(
    plan: Plan, keys: Keys, values: list[bytes | None], keyed: bool = True, headers: list[Any] | None = None
) -> RecordBatch:
    records = [
        Record(offset_delta=i, key=b"k%d" % i if keyed else None, value=v, headers=headers)
        for i, v in enumerate(values)
    ]
    return RecordBatch.from_bytes(trio.run(encrypt_batch, plan, "orders", batch_of(records), keys))


def _decrypt(keys: Keys, batch: RecordBatch) -> list[bytes | None]:
    data, _ = trio.run(decrypt_batch, Selection(), "orders", batch, keys, lambda *f: None)
    return [r.value for r in (RecordBatch.from_bytes(data) if data is not None else batch).records()]


def _masked(value: bytes | None) -> Any:
    """The stored document with every envelope text replaced by one marker."""

    def walk(node: Any) -> Any:
        if isinstance(node, str) and node.startswith(TEXT_MAGIC):
            return "<sealed>"
        if isinstance(node, list):
            return [walk(n) for n in node]
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        return node

    return None if value is None else walk(orjson.loads(value))


def test_plans_of_value_fields_take_the_compiled_path() -> None:
    keys = Keys()
    assert _plan(keys, ["a", "b.c"]).splice
    assert not _plan(keys, ["a", "a.b"]).splice  # one field inside another: the Python path
    chacha = plan_of(
        keys,
        kmsConfig={},
        recordValue={"fields": [{"fieldName": "a", "keySecretId": KEY, "algorithm": "XCHACHA20_POLY1305"}]},
    )
    assert not chacha.splice  # OpenSSL has no XChaCha20-Poly1305


@settings(max_examples=150, deadline=None)
@given(
    docs=st.lists(documents, min_size=1, max_size=5),
    style=styles,
    paths=st.lists(st.sampled_from(PATHS), min_size=1, max_size=3, unique=True),
    keyed=st.booleans(),
)
def test_the_compiled_path_seals_what_the_python_path_seals(
    docs: list[Any], style: Any, paths: list[str], keyed: bool
) -> None:
    keys = Keys()
    plan = _plan(keys, paths)
    assert plan.splice
    values = [style(d) for d in docs]
    compiled = [r.value for r in _encrypt(plan, keys, values, keyed).records()]
    python = [r.value for r in _encrypt(_without_splice(plan), keys, values, keyed).records()]
    assert [_masked(v) for v in compiled] == [_masked(v) for v in python]
    both = _encrypt(plan, keys, values, keyed)
    assert [orjson.loads(v) if v is not None else None for v in _decrypt(keys, both)] == [
        orjson.loads(v) for v in values
    ]


@settings(max_examples=150, deadline=None)
@given(doc=documents, paths=st.lists(st.sampled_from(PATHS), min_size=1, max_size=3, unique=True))
def test_compact_json_is_decided_by_the_scan(doc: Any, paths: list[str]) -> None:
    """What producers write (orjson's compact form, no exponent) never needs the Python path."""
    assert _scan(orjson.dumps(_no_exponents(doc)), paths) is not ...


def _no_exponents(node: Any) -> Any:
    if isinstance(node, float) and "e" in orjson.dumps(node).decode():
        return 0.5
    if isinstance(node, list):
        return [_no_exponents(n) for n in node]
    if isinstance(node, dict):
        return {k: _no_exponents(v) for k, v in node.items()}
    return node


def _scan(value: bytes, paths: list[str], key: bytes | None = b"k") -> bytes | Any | None:
    """``seal_json_fields`` on one record holding ``value``."""
    keys = Keys()
    plan = _plan(keys, paths)
    batch = batch_of([Record(offset_delta=0, key=key, value=value)])
    area, start = records_area(batch)
    spans = record_spans(area, start, 1, len(area))
    sealer = Sealer(plan.value_fields[0].algorithm, bytes(16), "ref", b"edek")
    fields = tuple(
        (t.path.steps, sealer.aead, sealer.text_header, associated_data(b"orders", t.label, None)[:-1])
        for t in plan.value_fields
        if t.path is not None
    )
    return seal_json_fields(area, spans, fields)[0]


@settings(max_examples=300, deadline=None)
@given(doc=documents, edits=st.lists(st.tuples(st.integers(0, 200), st.binary(max_size=2)), min_size=1, max_size=3))
def test_the_scan_never_takes_for_json_what_orjson_refuses(doc: Any, edits: list[tuple[int, bytes]]) -> None:
    value = bytearray(json.dumps({"a": doc, "b": {"c": "x"}}, ensure_ascii=False).encode())
    for at, data in edits:
        at %= len(value) + 1
        value[at : at + len(data) % 2] = data  # replace one byte or insert
    try:
        orjson.loads(bytes(value))
    except orjson.JSONDecodeError:
        assert _scan(bytes(value), ["a", "b.c"]) is ...


@pytest.mark.parametrize(
    "value",
    [
        b'{"a":1,}',
        b'{"a":01}',
        b'{"a" 1}',
        b'{"a":"\x01"}',
        b'{"a":"\xff"}',
        b'{"a":"\xed\xa0\x80"}',
        b'{"a":"\xc0\xaf"}',
        b'{"a":"\\ud800"}',
        b'{"a":1} x',
        b'{"a":NaN}',
        b'{"a":1e400}',
        b'{"a":"\\x"}',
        b"",
        b"\x00\x00\x00\x00\x01",
        b'{"a":[1 2]}',
        b'{"a":-}',
        b'{"a":1.}',
        b'{"a":tru}',
    ],
)
def test_what_the_scan_does_not_read_goes_to_the_python_path(value: bytes) -> None:
    assert _scan(value, ["a"]) is ...


def test_every_copy_of_a_repeated_key_is_sealed() -> None:
    keys = Keys()
    stored = _encrypt(_plan(keys, ["a"]), keys, [b'{"a":"first","b":1,"a":"second"}'])
    [value] = [r.value for r in stored.records()]
    assert value is not None and b"first" not in value and b"second" not in value
    assert orjson.loads(_decrypt(keys, stored)[0] or b"") == {"a": "second", "b": 1}


def test_a_key_spelled_with_escapes_is_the_field_it_reads_as() -> None:
    keys = Keys()
    assert _scan(b'{"\\u0061":"secret"}', ["a"]) is not ...
    assert _scan(b'{"\\u00e9":"secret"}', ["\u00e9"]) is not None
    stored = _encrypt(_plan(keys, ["a"]), keys, [b'{"\\u0061":"secret"}'])
    [value] = [r.value for r in stored.records()]
    assert value is not None and b"secret" not in value


def test_the_record_keeps_its_layout_around_the_sealed_fields() -> None:
    keys = Keys()
    text = b'{ "id" : 7,\n  "a" : { "x" : [1, 2] },\n  "z" : "keep" }'
    [value] = [r.value for r in _encrypt(_plan(keys, ["a"]), keys, [text]).records()]
    assert value is not None
    before, after = value.split(b'"/KNL', 1)
    assert before == b'{ "id" : 7,\n  "a" : '
    assert after.split(b'"', 1)[1] == b',\n  "z" : "keep" }'


def test_records_without_the_fields_or_values_are_copied() -> None:
    keys = Keys()
    values = [b'{"other":1}', None, b'{"a":null}']
    stored = [r.value for r in _encrypt(_plan(keys, ["a"]), keys, values).records()]
    assert stored[:2] == values[:2]
    assert stored[2] is not None and orjson.loads(stored[2])["a"].startswith(TEXT_MAGIC)


def test_encrypted_fields_follow_the_error_policy_on_the_compiled_path() -> None:
    keys = Keys()
    sealed = _encrypt(_plan(keys, ["a"]), keys, [b'{"a":"x","b":"y"}'])
    stored = [r.value for r in sealed.records()]

    with pytest.raises(AlreadyEncrypted):
        trio.run(encrypt_batch, _plan(keys, ["a"]), "orders", sealed, keys)
    skip = _plan(keys, ["a", "b"], errorPolicy="skip_already_encrypted")
    assert skip.splice
    again = RecordBatch.from_bytes(trio.run(encrypt_batch, skip, "orders", sealed, keys))
    [value] = [r.value for r in again.records()]
    assert value is not None and stored[0] is not None
    assert orjson.loads(value)["a"] == orjson.loads(stored[0])["a"]  # kept as it was
    assert orjson.loads(value)["b"].startswith(TEXT_MAGIC)  # sealed now
    assert orjson.loads(_decrypt(keys, again)[0] or b"") == {"a": "x", "b": "y"}


def test_a_sealed_field_is_bound_to_the_record_key() -> None:
    keys = Keys()
    sealed = _encrypt(_plan(keys, ["a"]), keys, [b'{"a":"x"}'])
    [record] = sealed.records()
    moved = batch_of([Record(offset_delta=0, key=b"another", value=record.value)])
    assert _decrypt(keys, moved) == [record.value]  # stays encrypted (return_encrypted)


# ------------------------------------------------------------------------------ opening fields


def _decrypt_with(keys: Keys, batch: RecordBatch, selection: Selection, compiled: bool) -> tuple[list[Any], list[str]]:
    failures: list[str] = []
    with patch.object(decrypt_module, "open_json_fields", decrypt_module.open_json_fields if compiled else None):
        data, _ = trio.run(decrypt_batch, selection, "orders", batch, keys, lambda label, exc: failures.append(label))
    clear = RecordBatch.from_bytes(data) if data is not None else batch
    return [None if r.value is None else orjson.loads(r.value) for r in clear.records()], failures


@settings(max_examples=100, deadline=None)
@given(
    docs=st.lists(documents, min_size=1, max_size=5),
    style=styles,
    paths=st.lists(st.sampled_from(PATHS), min_size=1, max_size=3, unique=True),
    listed=st.booleans(),
    keyed=st.booleans(),
)
def test_the_compiled_pass_opens_what_the_python_pass_opens(
    docs: list[Any], style: Any, paths: list[str], listed: bool, keyed: bool
) -> None:
    keys = Keys()
    values = [style(d) for d in docs]
    sealed = _encrypt(_plan(keys, paths), keys, values, keyed)
    selection = Selection(value=frozenset(paths[:1]) if listed else None)
    compiled = _decrypt_with(keys, sealed, selection, compiled=True)
    assert compiled == _decrypt_with(keys, sealed, selection, compiled=False)
    if not listed:
        assert compiled[0] == [orjson.loads(v) for v in values]


def test_the_compiled_pass_opens_all_but_the_record_that_fetches_the_key() -> None:
    keys = Keys()
    values = [b'{"a":"secret %d","b":{"c":[1,"two"]}}' % i for i in range(50)]
    sealed = _encrypt(_plan(keys, ["a", "b.c"]), keys, values, headers=[("trace", b"t-1"), ("empty", None)])
    decided: list[int] = []
    real = decrypt_module.open_json_fields

    def spy(*args: Any) -> Any:
        values, opened = real(*args)
        decided.append(len(values))
        return values, opened

    with patch.object(decrypt_module, "open_json_fields", spy):
        data, opened = trio.run(decrypt_batch, Selection(), "orders", sealed, keys, lambda *f: None)
    assert data is not None and opened == 100
    clear = [orjson.loads(r.value or b"") for r in RecordBatch.from_bytes(data).records()]
    assert clear == [orjson.loads(v) for v in values]
    assert sum(decided) == 49  # the first record went through the Python pass, which unwrapped the key


def test_a_field_that_does_not_open_is_reported_and_the_others_open() -> None:
    keys = Keys()
    sealed = _encrypt(_plan(keys, ["a"]), keys, [b'{"a":"one"}', b'{"a":"two"}', b'{"a":"three"}'])
    records = list(sealed.records())
    text = orjson.loads(records[1].value or b"")["a"]
    raw = bytearray(base64.b64decode(text))
    raw[-1] ^= 1  # a flipped tag byte
    tampered = orjson.dumps({"a": base64.b64encode(raw).decode()})
    batch = batch_of(
        [Record(offset_delta=i, key=r.key, value=tampered if i == 1 else r.value) for i, r in enumerate(records)]
    )
    clear, failures = _decrypt_with(keys, batch, Selection(), compiled=True)
    assert clear[0] == {"a": "one"} and clear[2] == {"a": "three"}
    assert clear[1] == orjson.loads(tampered)  # left as stored
    assert failures == ["value.a"]
    with pytest.raises(DecryptionFailed):
        trio.run(decrypt_batch, Selection(fail_fetch=True), "orders", batch, keys, lambda *f: None)


def test_records_with_encrypted_headers_or_keys_take_the_python_pass() -> None:
    keys = Keys()
    plan = plan_of(
        keys,
        kmsConfig={},
        recordValue={"fields": [{"fieldName": "a", "keySecretId": KEY}]},
        recordHeader={"header": "secret-.*", "payload": {"keySecretId": KEY}},
    )
    records = [Record(offset_delta=0, key=b"k", value=b'{"a":"x"}', headers=[("secret-1", b"hidden"), ("plain", b"p")])]
    sealed = RecordBatch.from_bytes(trio.run(encrypt_batch, plan, "orders", batch_of(records), keys))
    data, opened = trio.run(decrypt_batch, Selection(), "orders", sealed, keys, lambda *f: None)
    assert data is not None and opened == 2
    [record] = RecordBatch.from_bytes(data).records()
    assert orjson.loads(record.value or b"") == {"a": "x"}
    assert list(record.headers) == [("secret-1", b"hidden"), ("plain", b"p")]
