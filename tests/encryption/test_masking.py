"""The ``masking`` interceptor on fetched record batches, through the core's harness: what a client
in its scope reads (every rule, wildcards, scalars, nulls, missing fields), the error policies,
what stays byte-for-byte, and the configs it refuses."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import trio
from kanal_encryption.masking import MaskingInterceptor, parse_mask_path
from kanal_encryption.paths import PathError

from kanal.api import GZIP, ZSTD, ErrorCode, InterceptorConfigError, Record, RecordSet, encode_batch
from kanal.testing import Harness

CARD = "4111111111111111"


def _config(*policies: dict[str, Any], **rest: Any) -> dict[str, Any]:
    return {"policies": list(policies), **rest}


def _policy(fields: list[str], **rule: Any) -> dict[str, Any]:
    return {"name": "p", "fields": fields, "rule": rule} if rule else {"name": "p", "fields": fields}


def _batch(values: list[Any], *, base_offset: int = 0, compression: int = 0, **kwargs: Any) -> bytes:
    records = [
        Record(
            offset_delta=i,
            timestamp_delta=i,
            key=b"k%d" % i,
            value=None if v is None else v if isinstance(v, bytes) else orjson.dumps(v),
            headers=[("h", b"v%d" % i)],
        )
        for i, v in enumerate(values)
    ]
    return encode_batch(
        records, base_offset=base_offset, base_timestamp=1_700_000_000_000, compression=compression, **kwargs
    )


def _fetch(config: dict[str, Any], data: bytes, topic: str = "orders") -> tuple[RecordSet, Any, Harness]:
    harness = Harness()
    harness.add(MaskingInterceptor, config, name="masking")

    async def run() -> tuple[RecordSet, Any]:
        return await harness.records(topic, 0, data, fetch=True)

    records, error = trio.run(run)
    return records, error, harness


def _values(records: RecordSet) -> list[Any]:
    return [None if r.value is None else orjson.loads(r.value) for _, r in records]


def _masked(config: dict[str, Any], document: Any) -> Any:
    records, error, _ = _fetch(config, _batch([document]))
    assert error is None
    return _values(records)[0]


def _metric(harness: Harness, name: str) -> float | None:
    return harness.services.metrics.get_sample_value(name, {"interceptor": "masking"})


# --------------------------------------------------------------------------- rules


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ({}, "*" * 16),
        ({"type": "MASK_ALL", "maskingChar": "#"}, "#" * 16),
        ({"type": "MASK_FIRST_N", "numberOfChars": 12}, "************1111"),
        ({"type": "MASK_LAST_N", "numberOfChars": 12, "maskingChar": "X"}, "4111XXXXXXXXXXXX"),
        ({"type": "MASK_FIRST_N", "numberOfChars": 40}, "*" * 16),  # more than the string: all of it
        ({"type": "MASK_LAST_N", "numberOfChars": 40}, "*" * 16),
        ({"type": "MASK_FIRST_N", "numberOfChars": 0}, CARD),
    ],
)
def test_each_rule_masks_a_string_field(rule: dict[str, Any], expected: str) -> None:
    document = {"card": {"number": CARD, "expiry": "12/30"}, "id": 7}
    assert _masked(_config(_policy(["card.number"], **rule)), document) == {
        "card": {"number": expected, "expiry": "12/30"},
        "id": 7,
    }


def test_non_string_scalars_are_masked_as_their_json_text_and_null_stays_null() -> None:
    document = {"pin": 4111, "ratio": 0.5, "flag": True, "none": None, "text": "ab"}
    config = _config(_policy(["pin", "ratio", "flag", "none", "text"]))
    assert _masked(config, document) == {"pin": "****", "ratio": "***", "flag": "****", "none": None, "text": "**"}
    last = _config(_policy(["pin"], type="MASK_LAST_N", numberOfChars=2))
    assert _masked(last, {"pin": 123456}) == {"pin": "1234**"}


def test_objects_and_lists_are_masked_scalar_by_scalar() -> None:
    document = {"card": {"number": CARD, "cvv": 123, "holder": None}, "tags": ["ab", 12]}
    assert _masked(_config(_policy(["card", "tags"])), document) == {
        "card": {"number": "*" * 16, "cvv": "***", "holder": None},
        "tags": ["**", "**"],
    }


def test_missing_fields_and_wrong_shapes_are_left_alone() -> None:
    config = _config(_policy(["card.number", "items[3].x", "list[*].y", "name.first"]))
    document = {"card": {"expiry": "12/30"}, "items": [{"x": 1}], "list": {"y": 1}, "name": "plain"}
    assert _masked(config, document) == document
    for scalar in ("text", 12, [1, 2], None):
        assert _masked(config, scalar) == scalar


def test_indexes_and_wildcards() -> None:
    document = {
        "cards": [{"number": CARD, "type": "visa"}, {"number": "5500000000000004"}, {"type": "none"}],
        "matrix": [["ab", "cd"], ["ef"]],
        "first": [{"x": "one"}, {"x": "two"}],
    }
    config = _config(
        _policy(["cards[*].number"], type="MASK_FIRST_N", numberOfChars=12),
        _policy(["matrix[*][*]"], type="MASK_LAST_N", numberOfChars=1),
        _policy(["first[0].x"]),
    )
    assert _masked(config, document) == {
        "cards": [{"number": "************1111", "type": "visa"}, {"number": "************0004"}, {"type": "none"}],
        "matrix": [["a*", "c*"], ["e*"]],
        "first": [{"x": "***"}, {"x": "two"}],
    }
    assert _masked(_config(_policy(["[*].id"])), [{"id": "a1"}, {"id": "b2"}]) == [{"id": "**"}, {"id": "**"}]
    assert _masked(_config(_policy(["tags[*]"])), {"tags": ["abc", None, 5]}) == {"tags": ["***", None, "*"]}


def test_policies_apply_in_order() -> None:
    config = _config(
        _policy(["secret"], type="MASK_FIRST_N", numberOfChars=2, maskingChar="#"),
        _policy(["secret"], type="MASK_LAST_N", numberOfChars=2),
    )
    assert _masked(config, {"secret": "abcdef"}) == {"secret": "##cd**"}


def test_unicode_is_masked_by_character() -> None:
    config = _config(_policy(["name"], type="MASK_LAST_N", numberOfChars=3, maskingChar="•"))
    assert _masked(config, {"name": "Zoë Ångström"}) == {"name": "Zoë Ångst•••"}


# --------------------------------------------------------------------------- records and batches


def test_offsets_keys_headers_and_timestamps_are_kept_and_the_metric_counts_masked_records() -> None:
    values: list[Any] = [{"card": CARD}, {"other": 1}, None, {"card": None}, {"card": "12"}]
    data = _batch(values, base_offset=100, compression=ZSTD)
    records, error, harness = _fetch(_config(_policy(["card"])), data)
    assert error is None
    [batch] = records.batches
    assert batch.compression == ZSTD and batch.base_offset == 100
    got = [(batch.offset_of(r), batch.timestamp_of(r), r.key, r.headers) for _, r in records]
    assert got == [(100 + i, 1_700_000_000_000 + i, b"k%d" % i, [("h", b"v%d" % i)]) for i in range(5)]
    assert _values(records) == [{"card": "*" * 16}, {"other": 1}, None, {"card": None}, {"card": "**"}]
    assert _metric(harness, "gateway_encryption_records_masked_total") == 2


def test_untouched_batches_stay_byte_for_byte() -> None:
    unmatched = _batch([{"id": 1}, {"id": 2}])
    matched = _batch([{"card": CARD}], base_offset=2, compression=GZIP)
    data = unmatched + matched
    records, error, _ = _fetch(_config(_policy(["card"])), data)
    assert error is None
    assert records.batches[0].to_bytes() == unmatched  # none of its records had the field
    assert records.batches[1].to_bytes() != matched
    assert _values(records) == [{"id": 1}, {"id": 2}, {"card": "*" * 16}]

    for config, topic in (
        (_config(_policy(["absent"])), "orders"),
        (_config(_policy(["card"]), topic="x.*"), "orders"),
    ):
        records, error, _ = _fetch(config, data, topic)
        assert error is None and not records.changed() and records.to_bytes() == data


def test_the_topic_regex_must_match_the_whole_name() -> None:
    config = _config(_policy(["card"]), topic="orders-.*")
    for topic, masked in (("orders-eu", True), ("x-orders-eu", False), ("orders", False)):
        records, error, _ = _fetch(config, _batch([{"card": "ab"}]), topic)
        assert error is None and _values(records) == [{"card": "**" if masked else "ab"}]


def test_control_batches_are_untouched() -> None:
    marker = encode_batch(
        [Record(key=b"\x00\x00\x00\x01", value=b"\x00\x00\x00\x00\x00\x00")],
        base_offset=1,
        base_timestamp=0,
        producer_id=5,
        producer_epoch=0,
        transactional=True,
        control=True,
    )
    data = _batch([{"card": "ab"}], producer_id=5, producer_epoch=0, transactional=True) + marker
    records, error, _ = _fetch(_config(_policy(["card"])), data)
    assert error is None
    assert records.batches[1].to_bytes() == marker
    assert _values(records) == [{"card": "**"}]


# --------------------------------------------------------------------------- error policies


def test_fail_fetch_fails_the_partition_on_a_value_that_is_not_json() -> None:
    data = _batch([{"card": "ab"}, b"not json", b""], base_offset=10)
    _, error, harness = _fetch(_config(_policy(["card"])), data)
    assert error is not None and error.error_code == ErrorCode.corrupt_message
    assert "offset 11 is not JSON" in error.message
    assert harness.services.audited[0][2] == {
        "operation": "mask",
        "topic": "orders",
        "partition": 0,
        "reason": "the value at offset 11 is not JSON",
    }
    failures = harness.services.metrics.get_sample_value(
        "gateway_encryption_failures_total", {"interceptor": "masking", "operation": "mask"}
    )
    assert failures == 1


def test_skip_masking_returns_that_record_unmasked_and_counts_it() -> None:
    data = _batch([{"card": "ab"}, b"not json", b"", {"card": "cd"}])
    records, error, harness = _fetch(_config(_policy(["card"]), errorPolicy="skip_masking"), data)
    assert error is None
    assert [r.value for _, r in records] == [b'{"card":"**"}', b"not json", b"", b'{"card":"**"}']
    assert _metric(harness, "gateway_encryption_masking_skipped_total") == 2
    assert _metric(harness, "gateway_encryption_records_masked_total") == 2

    only_bad = _batch([b"<xml/>"])
    records, error, _ = _fetch(_config(_policy(["card"]), errorPolicy="skip_masking"), only_bad)
    assert error is None and records.to_bytes() == only_bad


# --------------------------------------------------------------------------- configs


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (_config(_policy(["card"]), topic="orders["), "topic"),
        (_config(_policy(["card..number"])), "policies[0].fields[0]"),
        (_config(_policy(["a"]), _policy(["ok", "cards[x].n"])), "policies[1].fields[1]"),
        (_config(_policy(["a[*]b"])), "policies[0].fields[0]"),
        (_config(_policy([""])), "policies[0].fields[0]"),
        (_config(_policy(["a"], maskingChar="")), "policies[0].rule.maskingChar"),
        (_config(_policy(["a"], maskingChar="**")), "policies[0].rule.maskingChar"),
        (_config(_policy(["a"], type="MASK_FIRST_N", numberOfChars=-1)), "policies[0].rule.numberOfChars"),
        (_config(_policy(["a"], type="MASK_LAST_N", numberOfChars=-3)), "policies[0].rule.numberOfChars"),
        (_config(_policy([])), "policies[0].fields"),
        (_config(), "policies"),
        (_config(_policy(["a"], type="MASK_MIDDLE")), "type"),  # refused by the config type itself
        ({"topic": ".*"}, "policies"),
        (_config(_policy(["a"]), errorPolicy="ignore"), "errorPolicy"),
    ],
)
def test_bad_configs_are_refused_naming_the_field(config: dict[str, Any], field: str) -> None:
    with pytest.raises(InterceptorConfigError, match=field.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        Harness().add(MaskingInterceptor, config)


def test_mask_all_ignores_number_of_chars() -> None:
    Harness().add(MaskingInterceptor, _config(_policy(["a"], type="MASK_ALL", numberOfChars=-1)))


@pytest.mark.parametrize(
    ("text", "steps"),
    [
        ("a", ("a",)),
        ("a.b.c", ("a", "b", "c")),
        ("list[0].x", ("list", 0, "x")),
        ("m[1][2]", ("m", 1, 2)),
        ("first name", ("first name",)),
    ],
)
def test_paths_without_wildcards_parse_as_the_encryption_paths(text: str, steps: tuple[Any, ...]) -> None:
    assert parse_mask_path(text) == steps


@pytest.mark.parametrize("text", ["", ".a", "a.", "a..b", "a[", "a[-1]", "a]", "a[*]b", "a[0]x"])
def test_bad_paths(text: str) -> None:
    with pytest.raises(PathError):
        parse_mask_path(text)
