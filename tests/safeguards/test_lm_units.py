"""``large-message`` without a broker: the reference format byte by byte, refused configs naming the
field, and the records hooks run by ``kanal.testing``'s harness over a local-directory store (what
is stored, what a forged or broken reference does, the restore budget, a failing store)."""

from __future__ import annotations

import functools
import hashlib
import re
import struct
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml
from kanal_safeguards.claim_check.large_messages import MARKER, STORE_FAILED, LargeMessage, Reference
from kanal_safeguards.claim_check.object_store import new_key, valid_key

from kanal.api import ErrorCode, InterceptorConfigError, PartitionError, Record, RecordSet, encode_batch
from kanal.testing import Harness

KEY = "orders/3/" + "0123456789abcdef" * 2
DIGEST = hashlib.sha256(b"value").digest()


# -- the reference format


def test_reference_bytes() -> None:
    encoded = Reference(KEY, 5, DIGEST).encode()
    assert encoded[:8] == b"KANAL-LM"
    assert encoded[8] == 1
    assert struct.unpack(">Q", encoded[9:17]) == (5,)
    assert encoded[17:49] == DIGEST
    assert struct.unpack(">H", encoded[49:51]) == (len(KEY),)
    assert encoded[51:] == KEY.encode()
    assert len(encoded) == 51 + len(KEY)
    assert Reference.decode(encoded, KEY.encode()) == Reference(KEY, 5, DIGEST)


@pytest.mark.parametrize(
    ("value", "header"),
    [
        (b"KANAL-LN" + Reference(KEY, 5, DIGEST).encode()[8:], KEY.encode()),  # magic
        (Reference(KEY, 5, DIGEST).encode()[:8] + b"\x02" + Reference(KEY, 5, DIGEST).encode()[9:], KEY.encode()),
        (Reference(KEY, 5, DIGEST).encode() + b"!", KEY.encode()),  # trailing byte
        (Reference(KEY, 5, DIGEST).encode()[:-1], KEY.encode()),  # truncated
        (Reference(KEY, 5, DIGEST).encode(), b"orders/3/" + b"f" * 32),  # the header names another key
        (Reference(KEY, 5, DIGEST).encode(), None),  # no header
        (None, KEY.encode()),  # a null value
        (Reference("../3/" + "0" * 32, 5, DIGEST).encode(), b"../3/" + b"0" * 32),  # escapes the store
        (Reference("orders/x/" + "0" * 32, 5, DIGEST).encode(), b"orders/x/" + b"0" * 32),  # not a partition
        (b"KANAL-LM", KEY.encode()),
    ],
)
def test_what_is_not_a_reference(value: bytes | None, header: bytes | None) -> None:
    assert Reference.decode(value, header) is None


def test_keys() -> None:
    key = new_key("my.topic_1-x", 12)
    assert valid_key(key) and re.fullmatch(r"my\.topic_1-x/12/[0-9a-f]{32}", key)
    assert new_key("t", 0) != new_key("t", 0)
    for bad in ("../0/" + "0" * 32, "./0/" + "0" * 32, "t/0/" + "0" * 31, "t/0/" + "A" * 32, "a/b/0/" + "0" * 32):
        assert not valid_key(bad), bad


# -- configs


REFUSED: list[tuple[dict[str, Any], str]] = [
    ({}, "s3Config, localDiskDirectory: a store is required"),
    ({"s3Config": {"uri": "http://s3"}}, "s3Config.bucketName: required"),
    ({"s3Config": {"bucketName": ""}}, "s3Config.bucketName: must not be empty"),
    ({"s3Config": {"bucketName": "b"}, "localDiskDirectory": "/tmp"}, "s3Config, localDiskDirectory: set one store"),
    ({"s3Config": {"bucketName": "b", "accessKey": "a"}}, "s3Config.accessKey, s3Config.secretKey: set both"),
    ({"s3Config": {"bucketName": "b", "uri": "s3.local:9000"}}, "s3Config.uri: 's3.local:9000' is not an http"),
    ({"s3Config": {"bucketName": "b", "bucket": "c"}}, "unknown field `bucket`"),
    ({"localDiskDirectory": "/tmp", "minimumSizeInBytes": 0}, "minimumSizeInBytes: Expected `int` >= 1"),
    ({"localDiskDirectory": "/tmp", "minimumSizeInBytes": -5}, "minimumSizeInBytes: Expected `int` >= 1"),
    ({"localDiskDirectory": "/tmp", "minimumSizeInBytes": "1MB"}, "minimumSizeInBytes: Expected `int`"),
    ({"localDiskDirectory": "/no/such/directory"}, "localDiskDirectory: '/no/such/directory' is not an existing"),
    ({"localDiskDirectory": "/tmp", "topic": "(["}, "topic: '([' is not a valid regex"),
    ({"localDiskDirectory": "/tmp", "storeTimeoutMs": 0}, "storeTimeoutMs: Expected `int` >= 1"),
]


@pytest.mark.parametrize(("config", "message"), REFUSED)
def test_refused_configs_name_the_field(config: dict[str, Any], message: str) -> None:
    with pytest.raises(InterceptorConfigError, match=re.escape(message)):
        Harness().add(LargeMessage, config)


def test_accepted_configs() -> None:
    Harness().add(LargeMessage, {"s3Config": {"bucketName": "b"}})
    Harness().add(LargeMessage, {"localDiskDirectory": "/tmp", "minimumSizeInBytes": 1, "topic": "a.*"})


# -- the hooks, over a local directory


def batch(*values: bytes | None, headers: list[tuple[str, bytes | None]] | None = None) -> bytes:
    records = [
        Record(offset_delta=i, timestamp_delta=0, value=v, headers=list(headers or [])) for i, v in enumerate(values)
    ]
    return bytes(encode_batch(records, base_timestamp=1_700_000_000_000))


def run(harness: Harness, data: bytes | RecordSet, fetch: bool = False) -> tuple[RecordSet, PartitionError | None]:
    return trio.run(functools.partial(harness.records, "t", 0, data, fetch=fetch))


def harness(store: Path, **config: Any) -> Harness:
    h = Harness()
    h.add(LargeMessage, {"localDiskDirectory": str(store), "minimumSizeInBytes": 100, **config})
    return h


def values(records: RecordSet) -> list[tuple[bytes | None, list[tuple[str, bytes | None]]]]:
    return [(r.value, list(r.headers)) for _, r in records]


def test_produce_stores_large_values_and_fetch_restores_them(tmp_path: Path) -> None:
    h = harness(tmp_path)
    big = b"B" * 100
    produced, error = run(h, batch(b"small", big, None, headers=[("h", b"1")]))
    assert error is None
    stored = values(produced)
    assert stored[0] == (b"small", [("h", b"1")]) and stored[2] == (None, [("h", b"1")])
    value, headers = stored[1]
    assert headers[0] == ("h", b"1") and headers[1][0] == MARKER
    reference = Reference.decode(value, headers[1][1])
    assert reference is not None and reference.size == 100 and reference.sha256 == hashlib.sha256(big).digest()
    assert (tmp_path / reference.key).read_bytes() == big

    fetched, error = run(h, produced.to_bytes(), fetch=True)
    assert error is None
    assert values(fetched) == [(b"small", [("h", b"1")]), (big, [("h", b"1")]), (None, [("h", b"1")])]


def test_a_produce_carrying_the_marker_is_refused(tmp_path: Path) -> None:
    _, error = run(harness(tmp_path), batch(b"x", headers=[(MARKER, KEY.encode())]))
    assert error is not None and error.error_code == ErrorCode.invalid_record
    assert MARKER in (error.message or "")


def test_a_broken_reference_is_left_as_it_is(tmp_path: Path) -> None:
    data = batch(b"looks like data", headers=[(MARKER, KEY.encode())])
    fetched, error = run(harness(tmp_path), data, fetch=True)
    assert error is None
    assert values(fetched) == [(b"looks like data", [(MARKER, KEY.encode())])]


def test_a_missing_object_fails_the_fetch_retriably(tmp_path: Path) -> None:
    reference = Reference(KEY, 5, DIGEST)
    data = batch(reference.encode(), headers=[(MARKER, KEY.encode())])
    _, error = run(harness(tmp_path), data, fetch=True)
    assert error is not None and error.error_code == STORE_FAILED == ErrorCode.kafka_storage_error
    assert KEY in (error.message or "")


def test_an_object_that_does_not_match_fails_the_fetch(tmp_path: Path) -> None:
    (tmp_path / "orders" / "3").mkdir(parents=True)
    (tmp_path / KEY).write_bytes(b"other")  # same size, another digest
    data = batch(Reference(KEY, 5, DIGEST).encode(), headers=[(MARKER, KEY.encode())])
    _, error = run(harness(tmp_path), data, fetch=True)
    assert error is not None and error.error_code == STORE_FAILED and "does not match" in (error.message or "")


def test_a_failing_store_fails_the_produce_and_stores_nothing(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    h = harness(store)
    store.rmdir()
    store.write_bytes(b"")  # the directory is now a file: every write fails
    _, error = run(h, batch(b"A" * 100, b"B" * 100))
    assert error is not None and error.error_code == STORE_FAILED
    assert "cannot write" in (error.message or "")


def test_restores_stop_at_the_budget_and_the_consumer_fetches_the_rest_again(tmp_path: Path) -> None:
    h = harness(tmp_path, maximumRestoredBytesPerPartition=250)
    produced = b"".join(run(h, batch(bytes([65 + i]) * 100))[0].to_bytes() for i in range(4))
    fetched, error = run(h, produced, fetch=True)
    assert error is None
    assert [v for v, _ in values(fetched)] == [b"A" * 100, b"B" * 100]  # 300 bytes would pass the budget
    one = batch(b"Z" * 100)
    alone, error = run(harness(tmp_path, maximumRestoredBytesPerPartition=1), run(h, one)[0].to_bytes(), fetch=True)
    assert error is None and [v for v, _ in values(alone)] == [b"Z" * 100]  # the first batch always comes


DOC = Path(__file__).resolve().parents[2] / "docs" / "safeguards-large-messages.md"


def test_the_operator_doc_examples_are_accepted(tmp_path: Path) -> None:
    text = DOC.read_text().replace("/var/lib/kanal/large-values", str(tmp_path))
    text = text.replace("${S3_ACCESS_KEY}", "AKIAEXAMPLE").replace("${S3_SECRET_KEY}", "secret")
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    declared = [entry for block in blocks for entry in yaml.safe_load(block)["interceptors"]]
    assert {entry["plugin"] for entry in declared} == {"large-message", "large-batch"}  # (see test_large_batches)
    declared = [entry for entry in declared if entry["plugin"] == "large-message"]
    assert len(declared) == 2
    for entry in declared:
        Harness().add(LargeMessage, entry["config"])
    assert "`4B 41 4E 41 4C 2D 4C 4D`" in text and Reference.MAGIC.hex(" ").upper() == "4B 41 4E 41 4C 2D 4C 4D"
