"""A virtual cluster's names: prefixing, mapping back, refusing what Kafka would, scoping regexes."""

from __future__ import annotations

import re

import pytest
import re2
from hypothesis import given, settings
from hypothesis import strategies as st

from kanal.tenancy import regex as regexes
from kanal.tenancy.names import INVALID_TOPIC, MAX_TOPIC_LENGTH, VirtualNames

PREFIX = "team-a."
NAMES = VirtualNames(PREFIX)

_kinds = (
    (NAMES.topic, NAMES.logical_topic),
    (NAMES.group, NAMES.logical_group),
    (NAMES.transactional_id, NAMES.logical_transactional_id),
)


@settings(max_examples=300, database=None)
@given(st.text())
def test_every_logical_name_maps_back_to_itself(logical: str) -> None:
    for to_physical, to_logical in _kinds:
        physical = to_physical(logical)
        assert physical == PREFIX + logical
        assert to_logical(physical) == logical


@settings(max_examples=300, database=None)
@given(st.text().filter(lambda name: not name.startswith(PREFIX)))
def test_names_without_the_prefix_are_nobody_s_here(physical: str) -> None:
    for _, to_logical in _kinds:
        assert to_logical(physical) is None


@pytest.mark.parametrize("foreign", ["team-b.orders", "__consumer_offsets", "_kanal_audit", "team-a", "team-a-orders"])
def test_other_tenants_and_internal_topics_have_no_logical_name(foreign: str) -> None:
    assert NAMES.logical_topic(foreign) is None
    assert NAMES.logical_group(foreign) is None
    assert NAMES.logical_transactional_id(foreign) is None


def test_the_prefix_is_used_verbatim() -> None:
    assert VirtualNames("acme_").topic("orders") == "acme_orders"
    assert VirtualNames("acme_").logical_topic("acme_orders") == "orders"


@pytest.mark.parametrize("prefix", ["", "team a.", "team/a.", "tëam.", "x" * MAX_TOPIC_LENGTH])
def test_a_prefix_must_be_usable_in_topic_names(prefix: str) -> None:
    with pytest.raises(ValueError, match="prefix"):
        VirtualNames(prefix)


def test_topic_names_up_to_the_limit_with_the_prefix_are_allowed() -> None:
    longest = "x" * (MAX_TOPIC_LENGTH - len(PREFIX))
    assert len(NAMES.topic(longest)) == MAX_TOPIC_LENGTH == 249
    assert NAMES.invalid_topic(longest) is None
    assert NAMES.invalid_topic("orders") is None


def test_a_topic_name_too_long_with_the_prefix_is_refused_naming_the_limit() -> None:
    name = "x" * (MAX_TOPIC_LENGTH - len(PREFIX) + 2)
    message = NAMES.invalid_topic(name)
    assert message == (
        f"topic name '{'x' * 40}...' is 251 characters with the virtual cluster's prefix 'team-a.'; "
        "Kafka allows at most 249"
    )
    assert int(INVALID_TOPIC) == 17


@pytest.mark.parametrize("name", ["", ".", ".."])
def test_names_kafka_reserves_are_refused_even_though_the_prefix_would_make_them_legal(name: str) -> None:
    assert NAMES.invalid_topic(name) == f"topic name {name!r} is not allowed"


# -- regexes ------------------------------------------------------------------------------------------

_REGEXES = ["orders.*", "^orders.*", "^(orders|payments)-[0-9]+$", "a|b", "[^.]+", "\\Aorders", "(?i)ORDERS.*", "^$|x"]
_TOPICS = ["orders", "orders-1", "payments-12", "a", "b", "ORDERS-x", "x.y", "", "payments-"]


@pytest.mark.parametrize("regex", _REGEXES)
def test_a_scoped_regex_matches_exactly_the_tenant_s_names_the_client_s_regex_matches(regex: str) -> None:
    scoped = regexes.to_physical(regex, PREFIX)
    assert scoped.startswith(re.escape(PREFIX) + "(?:")
    for topic in _TOPICS:
        assert bool(re2.fullmatch(scoped, PREFIX + topic)) == bool(re2.fullmatch(regex, topic)), (regex, topic)
        assert not re2.fullmatch(scoped, "team-b." + topic)
        assert not re2.fullmatch(scoped, PREFIX.upper() + topic)
        assert not re2.fullmatch(scoped, topic) or topic.startswith(PREFIX)


@pytest.mark.parametrize("regex", [")|(.*", "(a", "a)", "[a", "(?x)a", "*"])
def test_a_regex_that_could_escape_its_group_is_refused(regex: str) -> None:
    with pytest.raises(regexes.InvalidRegex, match="not valid"):
        regexes.to_physical(regex, PREFIX)


@pytest.mark.parametrize(
    ("regex", "inside"),
    [
        ("[^^]x", "[^^]x"),  # in a class ^ is no anchor
        ("\\^x", "\\^x"),
        ("\\Q^\\E", "\\Q^\\E"),
        ("\\p{^Greek}", "\\p{^Greek}"),
        ("a[]^]b", "a[]^]b"),
        ("^a|^b", "a|b"),
    ],
)
def test_only_start_anchors_are_dropped(regex: str, inside: str) -> None:
    assert regexes.to_physical(regex, PREFIX) == re.escape(PREFIX) + "(?:" + inside + ")"


@pytest.mark.parametrize("regex", ["", "  "])
def test_a_blank_regex_stays_blank_for_kafka_to_read_as_no_filter_or_refuse(regex: str) -> None:
    assert regexes.to_physical(regex, PREFIX) == regex


def test_a_scoped_regex_maps_back_and_a_foreign_one_does_not() -> None:
    assert regexes.to_logical(regexes.to_physical("orders.*", PREFIX), PREFIX) == "orders.*"
    assert regexes.to_logical("orders.*", PREFIX) is None
    assert regexes.to_logical(regexes.to_physical("orders.*", "team-b."), PREFIX) is None
