from typing import Any

import pytest
from kafka_captures import frames

from kanal.protocol.api import require_request_class
from kanal.protocol.entities import build, nested
from kanal.protocol.error_responses import error_response
from kanal.protocol.messages import decode_request, decode_response, encode_response


def _requests() -> dict[tuple[int, int], object]:
    seen: dict[tuple[int, int], object] = {}
    for f in frames():
        if f.direction == "c2s":
            seen.setdefault((f.api_key, f.api_version), decode_request(f.frame)[1])
    return seen


def test_every_captured_request_gets_an_encodable_error_response() -> None:
    for (api_key, version), request in _requests().items():
        body = error_response(api_key, version, request, 87, "blocked by policy")
        again = decode_response(api_key, version, encode_response(body, 1))
        assert again == body


def test_produce_errors_are_per_partition_with_message() -> None:
    for (api_key, version), request in _requests().items():
        if api_key != 0:
            continue
        body = error_response(0, version, request, 87, "blocked by policy")
        sent = {(t.name, p.index) for t in request.topic_data for p in t.partition_data}  # type: ignore[attr-defined]
        got = {(t.name, p.index) for t in body.responses for p in t.partition_responses}
        assert got == sent
        for t in body.responses:
            for p in t.partition_responses:
                assert p.error_code == 87 and p.base_offset == -1
                if hasattr(p, "error_message"):
                    assert p.error_message == "blocked by policy"


@pytest.mark.parametrize("api_key", [1, 2, 8])
def test_partitioned_apis_report_every_partition(api_key: int) -> None:
    found = False
    for (key, version), request in _requests().items():
        if key != api_key:
            continue
        body = error_response(key, version, request, 24)
        topics = body.responses if api_key == 1 else body.topics
        parts = [p for t in topics for p in t.partitions]
        assert parts and all(p.error_code == 24 for p in parts)
        found = True
    assert found


def test_create_topics_error_names_each_topic() -> None:
    for (key, version), request in _requests().items():
        if key == 19:
            body = error_response(19, version, request, 44, "too many partitions")
            assert [(t.name, t.error_code) for t in body.topics] == [(t.name, 44) for t in request.topics]  # type: ignore[attr-defined]


def test_top_level_error_for_group_apis() -> None:
    for (key, version), request in _requests().items():
        if key in (11, 12, 14):
            assert error_response(key, version, request, 24).error_code == 24


@pytest.mark.parametrize(
    ("api_key", "version", "field", "entries", "response_field", "name_field"),
    [
        (44, 1, "resources", [{"resource_type": 4, "resource_name": "1"}], "responses", "resource_name"),
        (15, 5, "groups", ["g", "h"], "groups", "group_id"),
        (42, 2, "groups_names", ["g"], "results", "group_id"),
        (65, 0, "transactional_ids", ["t"], "transaction_states", "transactional_id"),
    ],
)
def test_apis_with_errors_per_entry_only_answer_each_entry(
    api_key: int, version: int, field: str, entries: list[Any], response_field: str, name_field: str
) -> None:
    cls = require_request_class(api_key, version)
    values = tuple(build(nested(cls, field), **e) if isinstance(e, dict) else e for e in entries)
    body = error_response(api_key, version, build(cls, **{field: values}), 31, "not here")
    names = [e["resource_name"] if isinstance(e, dict) else e for e in entries]
    assert [getattr(e, name_field) for e in getattr(body, response_field)] == names
    assert {e.error_code for e in getattr(body, response_field)} == {31}
    assert decode_response(api_key, version, encode_response(body, 1)) == body
