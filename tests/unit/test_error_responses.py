import pytest
from kafka_captures import frames

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
