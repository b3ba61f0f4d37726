"""Audit events without I/O: their JSON form, the filters of GET /gateway/v2/audit, and the index."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kanal.audit.events import (
    AuditIndex,
    AuditQuery,
    BadFilter,
    bracketed,
    iso_time,
    make_event,
    parse_query,
    parse_time,
    stamp,
)

NOW = datetime.datetime(2026, 11, 24, 19, 9, 21, 123456, tzinfo=datetime.UTC).timestamp()


def event(event_type: str = "AUTHENTICATION", user: str | None = "orders-app", now: float = NOW) -> dict[str, Any]:
    return make_event(
        event_type,
        source="kanal://gw-1:6969",
        user=user,
        vcluster=None,
        local_address="127.0.0.1:6969",
        remote_address="127.0.0.1:53422",
        event_data="SUCCESS",
        time=iso_time(now),
    )


def test_an_event_has_the_cloudevents_like_fields() -> None:
    made = make_event(
        "AUTHENTICATION",
        source="kanal://gw-1:6969",
        user="orders-app",
        vcluster="tenant-a",
        local_address="::1:6969",
        remote_address="10.0.0.9:53422",
        event_data="SUCCESS",
        time=iso_time(NOW),
    )
    made_id = uuid.UUID(made.pop("id"))
    assert made_id.version == 4 and made_id.variant == uuid.RFC_4122
    assert made == {
        "source": "kanal://gw-1:6969",
        "type": "AUTHENTICATION",
        "authenticationPrincipal": "tenant-a",
        "userName": "orders-app",
        "connection": {"localAddress": "[::1]:6969", "remoteAddress": "10.0.0.9:53422"},
        "specVersion": "0.1.0",
        "time": "2026-11-24T19:09:21.123456Z",
        "eventData": "SUCCESS",
    }
    assert event()["authenticationPrincipal"] == "passthrough"  # no virtual cluster
    assert event()["id"] != event()["id"]


@pytest.mark.parametrize(
    ("address", "written"),
    [
        ("10.0.0.9:53422", "10.0.0.9:53422"),
        ("::1:53422", "[::1]:53422"),
        ("fe80::1%eth0:9092", "[fe80::1%eth0]:9092"),
        ("[::1]:9092", "[::1]:9092"),
        ("gw-1.example:6969", "gw-1.example:6969"),
        (None, None),
    ],
)
def test_addresses_are_host_port_with_ipv6_in_brackets(address: str | None, written: str | None) -> None:
    assert bracketed(address) == written


@given(st.integers(min_value=0, max_value=4_102_444_800_000))
def test_an_events_time_parses_back_to_its_millisecond(epoch_ms: int) -> None:
    text = iso_time(epoch_ms / 1000)
    assert text.endswith("Z")
    assert parse_time("from", text) == epoch_ms
    assert parse_time("from", str(epoch_ms)) == epoch_ms


@given(st.floats(min_value=0, max_value=4_102_444_800, allow_nan=False))
def test_an_events_time_text_and_milliseconds_agree(epoch_seconds: float) -> None:
    text, epoch_ms = stamp(epoch_seconds)
    assert parse_time("from", text) == epoch_ms


@pytest.mark.parametrize(
    ("text", "epoch_ms"),
    [
        ("1764000000000", 1764000000000),
        ("2026-11-24T19:09:21Z", 1795547361000),
        ("2026-11-24T19:09:21", 1795547361000),  # no offset: UTC
        ("2026-11-24T20:09:21+01:00", 1795547361000),
        ("2026-11-24T20:09:21 01:00", 1795547361000),  # the "+" of an unencoded query string
        ("2026-11-24", 1795478400000),
    ],
)
def test_times_are_iso_8601_or_epoch_milliseconds(text: str, epoch_ms: int) -> None:
    assert parse_time("from", text) == epoch_ms


def test_a_query_reads_every_filter() -> None:
    query = parse_query(
        {
            "type": "authentication, ADMIN_API_CALL",
            "principal": "orders-app",
            "from": "2026-11-24T00:00:00Z",
            "to": "1795547361000",
            "limit": "5",
        }
    )
    assert query == AuditQuery(
        frozenset({"AUTHENTICATION", "ADMIN_API_CALL"}), "orders-app", 1795478400000, 1795547361000, 5
    )
    assert parse_query({}) == AuditQuery(None, None, None, None, 100)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ({"user": "orders-app"}, "user: unknown filter"),
        ({"from": "yesterday"}, "from: 'yesterday' is neither epoch milliseconds nor an ISO-8601 time"),
        ({"to": "2026-13-01"}, "to: '2026-13-01'"),
        ({"from": "2000", "to": "1000"}, "from: 2000 is after to (1000)"),
        ({"limit": "0"}, "limit: '0' is not a number from 1 to 10000"),
        ({"limit": "ten"}, "limit: 'ten'"),
        ({"limit": "10001"}, "limit: '10001'"),
        ({"limit": "²"}, "limit: '²'"),
        ({"from": "²"}, "from: '²' is neither"),
        ({"to": "9" * 5000}, "to: '999"),
    ],
)
def test_a_bad_filter_is_named(args: dict[str, str], named: str) -> None:
    with pytest.raises(BadFilter, match="^" + named.replace("(", r"\(").replace(")", r"\)")):
        parse_query(args)


def _index(*events: dict[str, Any], per_type: int = 100) -> AuditIndex:
    index = AuditIndex(per_type=per_type)
    for made in events:
        index.add_event(made, orjson.dumps(made))
    return index


def test_the_index_answers_newest_first_with_filters() -> None:
    first = event(user="orders-app", now=NOW)
    second = event("ADMIN_API_CALL", user="admin", now=NOW + 1)
    third = event(user="billing-app", now=NOW + 2)
    index = _index(second, third, first)  # arrival order does not matter
    ids = [e["id"] for e in index.query(AuditQuery())]
    assert ids == [third["id"], second["id"], first["id"]]
    assert [e["id"] for e in index.query(AuditQuery(types=frozenset({"AUTHENTICATION"})))] == [
        third["id"],
        first["id"],
    ]
    assert [e["id"] for e in index.query(AuditQuery(principal="orders-app"))] == [first["id"]]
    at = int(NOW * 1000)
    assert [e["id"] for e in index.query(AuditQuery(from_ms=at + 1000, to_ms=at + 1000))] == [second["id"]]
    assert [e["id"] for e in index.query(AuditQuery(limit=1))] == [third["id"]]
    assert index.query(AuditQuery(types=frozenset({"SAFEGUARD"}))) == []


def test_a_flood_of_one_type_does_not_push_the_others_out() -> None:
    change = event("ADMIN_API_CALL", user="admin")
    index = _index(change, *(event(now=NOW + i) for i in range(50)), per_type=10)
    assert len(index.query(AuditQuery(types=frozenset({"AUTHENTICATION"})))) == 10  # the 10 newest logins
    assert [e["id"] for e in index.query(AuditQuery(types=frozenset({"ADMIN_API_CALL"})))] == [change["id"]]


def test_an_event_read_back_from_the_topic_is_not_indexed_twice() -> None:
    own = event()
    raw = orjson.dumps(own)
    index = _index(own)
    assert not index.add_record(raw, 0)
    assert index.add_record(orjson.dumps(event(user="from-another-node")), 0)
    assert not index.add_record(b"not json", 0)  # not an event: ignored
    assert not index.add_record(b'{"id": 1}', 0)
    assert len(index) == 2


def test_types_beyond_the_limit_share_one_bucket_and_are_still_found() -> None:
    index = AuditIndex(per_type=10, max_types=2)
    for name in ("A", "B", "C", "D"):
        made = event(name)
        index.add_event(made, orjson.dumps(made))
    assert [e["type"] for e in index.query(AuditQuery(types=frozenset({"D"})))] == ["D"]
    assert {e["type"] for e in index.query(AuditQuery())} == {"A", "B", "C", "D"}


@given(st.dictionaries(st.sampled_from(["type", "principal", "from", "to", "limit", "x"]), st.text()))
def test_any_query_string_is_a_query_or_a_bad_filter_never_an_error(args: dict[str, str]) -> None:
    try:
        parse_query(args)
    except BadFilter as exc:
        assert str(exc).split(":", 1)[0] in args
