"""Field-path diffs, documented rewrites and expectations."""

from __future__ import annotations

import datetime
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from kio.schema.errors import ErrorCode

from kanal.conformance.diff import (
    AddressBook,
    ExpectationError,
    apply_expectations,
    compare_trees,
    diff,
    message_label,
    parse_expectations,
    parse_path,
    render,
    to_tree,
)
from kanal.conformance.frames import read_frames
from kanal.conformance.replay import compare_response, load_case, run_case, suggest_expectations
from kanal.protocol.messages import decode_response, encode_response

ROOT = Path(__file__).resolve().parents[2]
KAFKA = ROOT / "conformance" / "captures" / "kafka"

BOOK = AddressBook(
    expected={("127.0.0.1", 19194): 111},
    gateway={("127.0.0.1", 6969): 111},
    upstream={("127.0.0.1", 40000)},
)


def metadata_response() -> tuple[bytes, Any]:
    frame = next(f for f in read_frames(KAFKA / "rdkafka.jsonl") if f.dir == "s2c" and f.api_key == 3)
    return frame.data, decode_response(3, 12, frame.data)


def with_broker(body: Any, **changes: Any) -> Any:
    return replace(body, brokers=(replace(body.brokers[0], **changes),))


def lines(expected: Any, actual: Any, expect: list[dict[str, Any]] | None = None) -> list[str]:
    exps = parse_expectations(expect or [], "test")
    return render(
        "Metadata v12 response #3 (conn 2 seq 5)", compare_trees(to_tree(expected), to_tree(actual), exps, BOOK)
    )


def test_the_gateway_address_is_the_captured_broker_address() -> None:
    _, body = metadata_response()
    assert (body.brokers[0].host, body.brokers[0].port) == ("127.0.0.1", 19194)
    assert lines(body, with_broker(body, port=6969)) == []


def test_a_wrong_address_reads_as_a_field_path_with_placeholders() -> None:
    _, body = metadata_response()
    assert lines(body, with_broker(body, port=6970)) == [
        "Metadata v12 response #3 (conn 2 seq 5): brokers[node_id=111].port: expected 19194 (<broker:111>), got 6970",
    ]
    assert lines(body, with_broker(body, port=40000)) == [
        "Metadata v12 response #3 (conn 2 seq 5): brokers[node_id=111].port: expected 19194 (<broker:111>),"
        " got 40000 (<upstream address, not rewritten>)",
    ]
    assert lines(body, with_broker(body, host="10.0.0.1", port=6970)) == [
        'Metadata v12 response #3 (conn 2 seq 5): brokers[node_id=111].host: expected "127.0.0.1" (<broker:111>),'
        ' got "10.0.0.1"',
        "Metadata v12 response #3 (conn 2 seq 5): brokers[node_id=111].port: expected 19194 (<broker:111>), got 6970",
    ]


def test_throttle_times_are_not_compared_but_correlation_ids_are() -> None:
    data, body = metadata_response()
    slower = replace(with_broker(body, port=6969), throttle_time=datetime.timedelta(milliseconds=250))
    assert lines(body, slower) == []
    other = encode_response(slower, 99)
    result = compare_response("Metadata v12 response #1 (conn 1 seq 1)", 3, 12, data, bytes(other), [], BOOK)
    assert result.lines() == ["Metadata v12 response #1 (conn 1 seq 1): correlation_id: expected 2, got 99"]


def test_lists_of_entities_compare_by_key_and_name_missing_and_extra_entries() -> None:
    expected = {"api_keys": [{"api_key": 0, "max_version": 9}, {"api_key": 3, "max_version": 12}]}
    actual = {"api_keys": [{"api_key": 3, "max_version": 12}, {"api_key": 71, "max_version": 0}]}
    assert [d.render() for d in diff(expected, actual)] == [
        "api_keys[api_key=0]: missing, expected {api_key: 0, max_version: 9}",
        "api_keys[api_key=71]: unexpected {api_key: 71, max_version: 0}",
    ]
    # other lists by index
    assert [d.render() for d in diff({"ids": [1, 2]}, {"ids": [1, 3, 4]})] == [
        "ids: expected 2 items, got 3",
        "ids[1]: expected 2, got 3",
        "ids[2]: unexpected 4",
    ]
    assert [d.render() for d in diff({"records": b"\x00" * 30}, {"records": b"\x00" * 29 + b"\x01"})] == [
        "records: expected <30 bytes>, got <30 bytes> (first difference at byte 29)",
    ]
    assert [d.render() for d in diff({"e": ErrorCode.none}, {"e": ErrorCode.invalid_record})] == [
        "e: expected 0 (none), got 87 (invalid_record)",
    ]


def test_paths() -> None:
    steps = parse_path("responses[name=t.1].partition_responses[*].records[0]")
    assert [s.name for s in steps if s.name] == ["responses", "partition_responses", "records"]
    assert steps[1].key == ("name", "t.1") and steps[3].any and steps[5].index == 0
    for bad in ("a[", "a..b[x]", "a b"):
        with pytest.raises(ExpectationError):
            parse_path(bad)


def test_expectations_absent_value_values_ignore() -> None:
    expected = {
        "throttle": 0,
        "topics": [{"name": "a", "parts": [{"index": 0, "error_code": 0}, {"index": 1, "error_code": 0}]}],
        "api_keys": [{"api_key": 0, "min_version": 0}, {"api_key": 71, "min_version": 0}],
        "cluster_id": "x",
    }
    actual = {
        "throttle": 0,
        "topics": [{"name": "a", "parts": [{"index": 0, "error_code": 0}, {"index": 1, "error_code": ErrorCode(87)}]}],
        "api_keys": [{"api_key": 0, "min_version": 3}],
        "cluster_id": "random-id",
    }
    exps = parse_expectations(
        [
            {"api": "Metadata", "path": "topics[name=a].parts[index=1].error_code", "value": 87, "reason": "policy"},
            {"api": "api_versions", "path": "api_keys[api_key=71]", "absent": True, "reason": "unsupported"},
            {"api": 3, "values": {"api_keys[api_key=0].min_version": 3}, "reason": "kio"},
            {"path": "cluster_id", "ignore": True, "reason": "random per run"},
        ],
        "case.yaml",
    )
    assert [e.api_key for e in exps] == [3, 18, 3, None]
    apply_expectations(expected, actual, exps)
    assert diff(expected, actual) == []
    assert [e.uses for e in exps] == [1, 1, 1, 1]
    assert "(policy)" in exps[0].describe() and "case.yaml: expect[0]" in exps[0].describe()


def test_value_can_state_an_entity_the_capture_lacks() -> None:
    expected = {"parts": [{"index": 0, "error_code": 0}]}
    actual = {"parts": [{"index": 0, "error_code": 0}, {"index": 1, "error_code": ErrorCode(87)}]}
    exps = parse_expectations(
        [{"path": "parts[index=1]", "value": {"error_code": "invalid_record"}, "reason": "added by the gateway"}], "t"
    )
    apply_expectations(expected, actual, exps)
    assert diff(expected, actual) == []


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"path": "a", "value": 1}, "needs a reason"),
        ({"path": "a", "value": 1, "absent": True, "reason": "r"}, "exactly one of"),
        ({"path": "a", "absent": "yes", "reason": "r"}, "absent must be true"),
        ({"value": 1, "reason": "r"}, "only absent applies to a whole message"),
        ({"path": "a", "value": 1, "reason": "r", "api": "NoSuchApi"}, "unknown API"),
        ({"path": "a", "value": 1, "reason": "r", "colour": 1}, "unknown key 'colour'"),
        ({"path": "a", "value": 1, "reason": "r", "message": "request"}, "message must be"),
        ({"values": {}, "reason": "r"}, "non-empty mapping"),
    ],
)
def test_invalid_expectations(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ExpectationError, match=message):
        parse_expectations([entry], "case.yaml")


def test_labels() -> None:
    assert message_label(3, 12, "response", 3, 2, 5) == "Metadata v12 response #3 (conn 2 seq 5)"
    assert message_label(0, 9, "upstream-request", None, 4, 4) == "Produce v9 upstream request (conn 4 seq 4)"


def test_suggested_expectations_document_every_difference(tmp_path: Path) -> None:
    """The update workflow: replay without expectations, take the suggestions, replay green."""
    case = load_case(KAFKA.parent.parent / "cases" / "partition-policy" / "partition-policy.case.yaml")
    case.expectations = []  # the policy's changes, undocumented
    failing = run_case(case)
    assert not failing.ok
    suggestion = suggest_expectations(failing)
    doc = yaml.safe_load(suggestion)
    assert {e["api"] for e in doc["expect"]} == {"Produce"}
    assert any(
        (e.get("values") or {}).get("responses[name=cap-kafkapython].partition_responses[index=1].error_code") == 87
        for e in doc["expect"]
    ), suggestion
    assert all(e["reason"].startswith("TODO") for e in doc["expect"])
    case.expectations = parse_expectations(doc["expect"], "suggested")
    assert run_case(case).ok


def test_case_file_values_compare_with_decoded_values() -> None:
    import uuid

    topic = uuid.UUID(int=7)
    expected = {"throttle_time": 250, "error_code": "invalid_record", "topic_id": str(topic), "records": "00ff"}
    actual = {
        "throttle_time": datetime.timedelta(milliseconds=250),
        "error_code": ErrorCode.invalid_record,
        "topic_id": topic,
        "records": b"\x00\xff",
    }
    assert diff(expected, actual) == []
    assert [d.path for d in diff({"error_code": "none"}, {"error_code": ErrorCode.invalid_record})] == ["error_code"]
    assert [d.path for d in diff({"flag": 1}, {"flag": True})] == ["flag"]
