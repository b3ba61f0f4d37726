from kafka_captures import frames

from kanal.protocol.api import supported_versions
from kanal.protocol.api_versions import intersect
from kanal.protocol.entities import build, nested
from kanal.protocol.messages import decode_response, response_type
from kanal.protocol.rewrite import broker_addresses, carries_addresses, rewrite_addresses
from kanal.protocol.topic_names import TopicNames


def gateway_address(node_id: int) -> tuple[str, int] | None:
    return ("gw.example", 7000 + node_id) if node_id == 111 else None


def test_captured_metadata_and_coordinators_point_at_the_gateway() -> None:
    kinds = set()
    for f in frames():
        if f.direction != "s2c" or f.api_key not in (3, 10):
            continue
        body = decode_response(f.api_key, f.api_version, f.frame)
        new = rewrite_addresses(f.api_key, body, gateway_address)
        text = repr(new)
        if f.api_key == 10 and "node_id=-1" in repr(body) and "19194" not in repr(body):
            continue
        assert new is not None, (f.api_key, f.api_version)
        assert "19194" not in text and "7111" in text
        kinds.add((f.api_key, f.api_version))
    assert {(3, 12), (3, 5), (10, 2), (10, 6), (10, 1)} <= kinds


def test_unchanged_response_is_reported_as_unchanged() -> None:
    for f in frames():
        if f.direction == "s2c" and f.api_key == 3:
            body = decode_response(3, f.api_version, f.frame)
            same = rewrite_addresses(3, body, lambda n: ("127.0.0.1", 19194))
            assert same is None
            assert broker_addresses(3, body) == {111: ("127.0.0.1", 19194)}
            return
    raise AssertionError("no metadata in captures")


def test_kip951_node_endpoints_are_rewritten() -> None:
    for api_key, version in ((0, 10), (1, 16)):
        cls = response_type(api_key, version)
        endpoint = build(nested(cls, "node_endpoints"), node_id=111, host="10.0.0.1", port=9092)
        body = build(cls, node_endpoints=(endpoint,))
        assert carries_addresses(api_key, version) and not carries_addresses(api_key, version - 1)
        new = rewrite_addresses(api_key, body, gateway_address)
        assert [(e.host, e.port) for e in new.node_endpoints] == [("gw.example", 7111)]
        assert rewrite_addresses(api_key, build(cls), gateway_address) is None


def test_describe_cluster_is_rewritten() -> None:
    cls = response_type(60, 1)
    broker = build(nested(cls, "brokers"), broker_id=111, host="10.0.0.1", port=9092)
    new = rewrite_addresses(60, build(cls, brokers=(broker,)), gateway_address)
    assert (new.brokers[0].host, new.brokers[0].port) == ("gw.example", 7111)


def test_api_versions_are_limited_to_what_the_gateway_decodes() -> None:
    for f in frames():
        if f.direction == "s2c" and f.api_key == 18:
            body = decode_response(18, f.api_version, f.frame)
            new = intersect(body) or body
            for entry in new.api_keys:
                low, high = supported_versions(int(entry.api_key)) or (None, None)
                assert low is not None and low <= entry.min_version <= entry.max_version <= high
            upstream = {int(e.api_key) for e in body.api_keys}
            assert {int(e.api_key) for e in new.api_keys} == {k for k in upstream if supported_versions(k)}
            return
    raise AssertionError("no ApiVersions in captures")


def test_topic_ids_are_learned_from_metadata() -> None:
    names = TopicNames()
    for f in frames():
        if f.direction == "s2c" and f.api_key == 3 and f.api_version >= 10:
            names.learn(3, decode_response(3, f.api_version, f.frame))
    assert len(names) >= 1
    some_id = names.id("cap-rdkafka")
    assert some_id is not None and names.name(some_id) == "cap-rdkafka"
