"""Renaming for a virtual cluster, for every renamed API and every version the gateway decodes.

The generic tests do not read the table under test: they find names through kio's own types
(``TopicName``, ``GroupId``, ``TransactionalId``, plus the few plain-string fields listed in
``STRING_NAMES``), build a message with every such field filled in, and compare the rewritten message
with the same message built with the expected names.
"""

from __future__ import annotations

import dataclasses
import typing
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map
from kio.schema.types import GroupId, TopicName, TransactionalId

from kanal.protocol.api import ApiKey, require_request_class, supported_versions
from kanal.protocol.entities import build, hints, nested
from kanal.protocol.messages import decode_request, decode_response, encode_request, encode_response, response_type
from kanal.tenancy import scope
from kanal.tenancy.apis import NAMES, api_key
from kanal.tenancy.names import VirtualNames
from kanal.tenancy.rewrite import UNCHANGED, Rewrite, renames_response, to_logical, to_physical
from kanal.tenancy.walk import ByField, Each, Kind, Many, One, Regex

PREFIX = "team-a."
OTHER = "team-b."
NAMES_A = VirtualNames(PREFIX)

_NAME_TYPES: dict[Any, Kind] = {TopicName: Kind.TOPIC, GroupId: Kind.GROUP, TransactionalId: Kind.TRANSACTIONAL_ID}
#: Names kio types as plain strings: (api name, dotted path) -> kind (FindCoordinator's key type 0).
STRING_NAMES: dict[tuple[str, str], Kind] = {
    ("find_coordinator", "key"): Kind.GROUP,
    ("find_coordinator", "coordinator_keys"): Kind.GROUP,
    ("find_coordinator", "coordinators.key"): Kind.GROUP,
}

LOGICAL, PHYSICAL, FOREIGN = "", PREFIX, OTHER  # an owner is the prefix its names carry
_LETTER = {Kind.TOPIC: "t", Kind.GROUP: "g", Kind.TRANSACTIONAL_ID: "x"}


# -- a message with every name filled in ---------------------------------------------------------------


def _unoptional(hint: Any) -> tuple[Any, bool]:
    args = typing.get_args(hint)
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return hint, False


def _classify(api: str, cls: type, field: str, path: str) -> tuple[str, Any]:
    """("entities", cls) | ("entity", cls) | ("name", kind) | ("names", kind) | ("other", None)."""
    hint, _ = _unoptional(hints(cls)[field])
    many = typing.get_origin(hint) is tuple
    inner = typing.get_args(hint)[0] if many else hint
    if dataclasses.is_dataclass(inner):
        return ("entities" if many else "entity"), inner
    kind = _NAME_TYPES.get(inner) or STRING_NAMES.get((api, path))
    if kind is not None:
        return ("names" if many else "name"), kind
    return "other", None


def _owns_a_name(api: str, cls: type, path: str) -> bool:
    """Whether entries of ``cls`` hold a name of their own (and so are dropped when it is foreign)."""
    return any(
        _classify(api, cls, f.name, f"{path}.{f.name}".lstrip("."))[0] == "name" for f in dataclasses.fields(cls)
    )


def make(api: str, cls: type, owner: str, *, foreign: bool = False, path: str = "") -> Any:
    """An instance of ``cls`` whose names carry ``owner``'s prefix; with ``foreign``, every array of
    names or of named entries also holds one of another tenant's."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        where = f"{path}.{f.name}".lstrip(".")
        what, arg = _classify(api, cls, f.name, where)
        if what == "entities":
            entries = [make(api, arg, owner, foreign=foreign, path=where)]
            if foreign and _owns_a_name(api, arg, where):
                entries.append(make(api, arg, FOREIGN, path=where))
            values[f.name] = tuple(entries)
        elif what == "entity":
            values[f.name] = make(api, arg, owner, foreign=foreign, path=where)
        elif what == "name":
            values[f.name] = f"{owner}{_LETTER[arg]}-{f.name}"
        elif what == "names":
            names = [f"{owner}{_LETTER[arg]}-{f.name}-{i}" for i in range(2)]
            values[f.name] = tuple(names + ([f"{FOREIGN}{_LETTER[arg]}-{f.name}"] if foreign else []))
    return build(cls, **values)


def _versions(api_keys: frozenset[int]) -> Iterator[tuple[str, int]]:
    for key in sorted(api_keys):
        low, high = supported_versions(key) or (0, -1)
        for version in range(low, high + 1):
            yield api_key_map[key], version


RENAMED = list(_versions(scope.RENAMED_APIS))


def _ids(case: tuple[str, int]) -> str:
    return f"{case[0]}-v{case[1]}"


# -- every API, every version ----------------------------------------------------------------------------


@pytest.mark.parametrize("case", RENAMED, ids=_ids)
def test_requests_carry_physical_names(case: tuple[str, int]) -> None:
    api, version = case
    key = api_key(api)
    cls = require_request_class(key, version)
    request = make(api, cls, LOGICAL)
    physical, _ = to_physical(key, request, NAMES_A)
    assert physical == make(api, cls, PHYSICAL)
    _, again = decode_request(encode_request(physical, 7, "client"))
    assert again == physical


@pytest.mark.parametrize("case", RENAMED, ids=_ids)
def test_responses_show_exactly_the_tenant_s_entries_under_logical_names(case: tuple[str, int]) -> None:
    api, version = case
    key = api_key(api)
    _, rewrite = to_physical(key, make(api, require_request_class(key, version), LOGICAL), NAMES_A)
    cls = response_type(key, version)
    response = make(api, cls, PHYSICAL, foreign=True)
    logical = to_logical(key, response, rewrite, NAMES_A)
    assert logical == make(api, cls, LOGICAL)
    assert decode_response(key, version, encode_response(logical, 7)) == logical


def test_the_generic_messages_do_hold_names_and_foreign_entries() -> None:
    request = make("produce", require_request_class(0, 9), LOGICAL)
    assert request.transactional_id == "x-transactional_id" and request.topic_data[0].name == "t-name"
    response = make("metadata", response_type(3, 12), PHYSICAL, foreign=True)
    assert [t.name for t in response.topics] == ["team-a.t-name", "team-b.t-name"]


# -- the table itself --------------------------------------------------------------------------------


def _spec_fields(spec: Any, classes: list[type], where: str) -> Iterator[str]:
    for field, rule in spec.items():
        having = [c for c in classes if field in hints(c)]
        assert having, f"{where}.{field} is in no version"
        if isinstance(rule, Each | One):
            yield from _spec_fields(rule.fields, [_entity(c, field) for c in having], f"{where}.{field}")
            if isinstance(rule, One) and any(isinstance(r, Kind | ByField) for r in rule.fields.values()):
                assert all(_unoptional(hints(c)[field])[1] for c in having), f"{where}.{field} must be nullable"
        else:
            assert isinstance(rule, Kind | Many | ByField | Regex)
        yield f"{where}.{field}"


def _entity(cls: type, field: str) -> type:
    hint, _ = _unoptional(hints(cls)[field])
    if typing.get_origin(hint) is tuple:
        return nested(cls, field)
    assert dataclasses.is_dataclass(hint)
    return typing.cast(type, hint)


@pytest.mark.parametrize("key", sorted(NAMES), ids=lambda k: api_key_map[k])
def test_every_field_of_the_table_exists_in_some_version(key: int) -> None:
    low, high = supported_versions(key) or (0, -1)
    versions = range(low, high + 1)
    list(_spec_fields(NAMES[key].request, [require_request_class(key, v) for v in versions], "request"))
    list(_spec_fields(NAMES[key].response, [response_type(key, v) for v in versions], "response"))


def test_every_api_has_exactly_one_disposition() -> None:
    sets = [scope.RENAMED_APIS, scope.PASSED_APIS, scope.ACL_APIS, scope.REFUSED_APIS]
    for i, a in enumerate(sets):
        for b in sets[i + 1 :]:
            assert not a & b
    assert scope.disposition(api_key("produce")) is scope.Disposition.RENAME
    assert scope.disposition(api_key("api_versions")) is scope.Disposition.PASS
    assert scope.disposition(api_key("create_acls")) is scope.Disposition.ACL
    assert scope.disposition(api_key("elect_leaders")) is scope.Disposition.REFUSE
    assert scope.disposition(api_key("share_group_heartbeat")) is scope.Disposition.REFUSE  # not scoped yet
    assert scope.disposition(api_key("vote")) is scope.Disposition.REFUSE  # between controllers
    assert scope.disposition(9999) is scope.Disposition.REFUSE


def test_the_cluster_wide_apis_are_refused() -> None:
    for name in (
        "elect_leaders",
        "alter_partition_reassignments",
        "list_partition_reassignments",
        "describe_log_dirs",
        "alter_replica_log_dirs",
        "describe_client_quotas",
        "alter_client_quotas",
        "describe_user_scram_credentials",
        "alter_user_scram_credentials",
        "create_delegation_token",
        "renew_delegation_token",
        "expire_delegation_token",
        "describe_delegation_token",
        "update_features",
    ):
        key = api_key(name)
        assert key in scope.REFUSED_APIS
        with pytest.raises(ValueError, match="not renamed"):
            to_physical(key, build(require_request_class(key, supported_versions(key)[0])), NAMES_A)  # type: ignore[index]


@pytest.mark.parametrize("name", ["api_versions", "sasl_handshake", "sasl_authenticate", "describe_cluster"])
def test_apis_without_names_pass_unchanged(name: str) -> None:
    key = api_key(name)
    version = supported_versions(key)[1]  # type: ignore[index]
    request = build(require_request_class(key, version))
    forwarded, rewrite = to_physical(key, request, NAMES_A)
    assert forwarded is request and rewrite is UNCHANGED
    response = build(response_type(key, version))
    assert to_logical(key, response, rewrite, NAMES_A) is response


# -- CreateTopics: names Kafka would refuse once prefixed ------------------------------------------------

_TOO_LONG = "x" * (249 - len(PREFIX) + 1)


@pytest.mark.parametrize("version", range(2, 8))
def test_create_topics_refuses_too_long_names_per_topic_in_the_client_s_order(version: int) -> None:
    cls = require_request_class(19, version)
    topic = nested(cls, "topics")
    request = build(cls, topics=tuple(build(topic, name=n, num_partitions=3) for n in ("a", _TOO_LONG, "b")))
    physical, rewrite = to_physical(19, request, NAMES_A)
    assert [t.name for t in physical.topics] == ["team-a.a", "team-a.b"]  # the others still go to the broker
    assert rewrite.answer is None
    assert decode_request(encode_request(physical, 1, None))[1] == physical

    response_cls = response_type(19, version)
    entry = nested(response_cls, "topics")
    answer = build(response_cls, topics=(build(entry, name="team-a.b"), build(entry, name="team-a.a")))
    logical = to_logical(19, answer, rewrite, NAMES_A)
    assert [t.name for t in logical.topics] == ["a", _TOO_LONG, "b"]
    refused = logical.topics[1]
    assert refused.error_code == ErrorCode.invalid_topic_exception and int(refused.error_code) == 17
    assert refused.error_message == (
        f"topic name '{'x' * 40}...' is 250 characters with the virtual cluster's prefix 'team-a.'; "
        "Kafka allows at most 249"
    )
    assert [t.error_code for t in (logical.topics[0], logical.topics[2])] == [ErrorCode.none, ErrorCode.none]
    assert decode_response(19, version, encode_response(logical, 1)) == logical


def test_create_topics_with_every_name_refused_is_answered_without_the_broker() -> None:
    cls = require_request_class(19, 7)
    topic = nested(cls, "topics")
    request = build(cls, topics=(build(topic, name=_TOO_LONG), build(topic, name="")))
    _, rewrite = to_physical(19, request, NAMES_A)
    assert rewrite.answer is not None
    assert [(t.name, t.error_code) for t in rewrite.answer.topics] == [(_TOO_LONG, 17), ("", 17)]
    assert rewrite.answer.topics[1].error_message == "topic name '' is not allowed"
    assert to_logical(19, build(response_type(19, 7)), rewrite, NAMES_A) is rewrite.answer
    assert decode_response(19, 7, encode_response(rewrite.answer, 1)) == rewrite.answer


# -- all topics, listings --------------------------------------------------------------------------------


def _named(cls: type, field: str, *names: str | None, **values: Any) -> tuple[Any, ...]:
    return tuple(build(nested(cls, field), name=n, **values) for n in names)


@pytest.mark.parametrize("version", range(0, 14))
def test_metadata_for_all_topics_shows_only_the_tenant_s(version: int) -> None:
    request = build(require_request_class(3, version), topics=None)
    forwarded, rewrite = to_physical(3, request, NAMES_A)
    assert forwarded is request
    cls = response_type(3, version)
    names = ("team-a.orders", "team-b.orders", "__consumer_offsets", "_kanal_x")
    response = build(cls, topics=_named(cls, "topics", *names))
    assert [t.name for t in to_logical(3, response, rewrite, NAMES_A).topics] == ["orders"]


def test_metadata_by_topic_id_keeps_unknown_ids_and_hides_other_tenants_topics() -> None:
    cls = response_type(3, 12)
    response = build(cls, topics=_named(cls, "topics", None, "team-b.orders", "team-a.orders"))
    assert [t.name for t in to_logical(3, response, UNCHANGED, NAMES_A).topics] == [None, "orders"]


@pytest.mark.parametrize("version", range(0, 6))
def test_list_groups_shows_only_the_tenant_s_groups(version: int) -> None:
    cls = response_type(16, version)
    groups = tuple(build(nested(cls, "groups"), group_id=g) for g in ("team-a.billing", "team-b.billing", "x"))
    logical = to_logical(16, build(cls, groups=groups), UNCHANGED, NAMES_A)
    assert [g.group_id for g in logical.groups] == ["billing"]


def test_list_transactions_filters_by_a_scoped_pattern_and_shows_only_the_tenant_s() -> None:
    request = build(require_request_class(66, 2), transactional_id_pattern="^tx-.*")
    physical, rewrite = to_physical(66, request, NAMES_A)
    assert physical.transactional_id_pattern == "team\\-a\\.(?:tx-.*)"
    cls = response_type(66, 2)
    states = tuple(build(nested(cls, "transaction_states"), transactional_id=t) for t in ("team-a.tx-1", "team-b.tx-1"))
    logical = to_logical(66, build(cls, transaction_states=states), rewrite, NAMES_A)
    assert [s.transactional_id for s in logical.transaction_states] == ["tx-1"]
    unfiltered = build(require_request_class(66, 2), transactional_id_pattern=None)
    assert to_physical(66, unfiltered, NAMES_A)[0] is unfiltered


def test_describe_topic_partitions_for_all_topics_starts_at_the_tenant_s_names() -> None:
    request = build(require_request_class(75, 0), topics=())
    physical, rewrite = to_physical(75, request, NAMES_A)
    assert physical.cursor.topic_name == PREFIX and physical.cursor.partition_index == 0
    assert decode_request(encode_request(physical, 1, None))[1] == physical

    cls = response_type(75, 0)
    cursor_cls = typing.get_args(hints(cls)["next_cursor"])[0]
    topics = _named(cls, "topics", "team-a.a", "team-a.b", "team-b.a")
    past = build(cls, topics=topics, next_cursor=build(cursor_cls, topic_name="team-b.b"))
    logical = to_logical(75, past, rewrite, NAMES_A)
    assert [t.name for t in logical.topics] == ["a", "b"] and logical.next_cursor is None  # the tenant's are done
    more = build(cls, topics=topics[:1], next_cursor=build(cursor_cls, topic_name="team-a.b"))
    assert to_logical(75, more, rewrite, NAMES_A).next_cursor.topic_name == "b"


def test_describe_topic_partitions_continues_from_the_client_s_cursor() -> None:
    cls = require_request_class(75, 0)
    cursor_cls = typing.get_args(hints(cls)["cursor"])[0]
    request = build(cls, topics=(), cursor=build(cursor_cls, topic_name="b", partition_index=4))
    physical, _ = to_physical(75, request, NAMES_A)
    assert (physical.cursor.topic_name, physical.cursor.partition_index) == ("team-a.b", 4)


# -- FindCoordinator ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", range(1, 4))
def test_find_coordinator_prefixes_groups_and_transactional_ids(version: int) -> None:
    cls = require_request_class(10, version)
    assert to_physical(10, build(cls, key="billing", key_type=0), NAMES_A)[0].key == "team-a.billing"
    assert to_physical(10, build(cls, key="tx-1", key_type=1), NAMES_A)[0].key == "team-a.tx-1"


def test_find_coordinator_v0_names_a_group() -> None:
    assert to_physical(10, build(require_request_class(10, 0), key="billing"), NAMES_A)[0].key == "team-a.billing"


@pytest.mark.parametrize("version", range(4, 7))
def test_find_coordinator_batches_map_keys_back_with_the_request_s_key_type(version: int) -> None:
    request = build(require_request_class(10, version), key_type=1, coordinator_keys=("tx-1", "tx-2"))
    physical, rewrite = to_physical(10, request, NAMES_A)
    assert physical.coordinator_keys == ("team-a.tx-1", "team-a.tx-2")
    assert rewrite.coordinator_kind is Kind.TRANSACTIONAL_ID
    cls = response_type(10, version)
    coordinators = tuple(build(nested(cls, "coordinators"), key=k) for k in ("team-a.tx-1", "team-b.tx-2"))
    logical = to_logical(10, build(cls, coordinators=coordinators), rewrite, NAMES_A)
    assert [c.key for c in logical.coordinators] == ["tx-1"]


def test_find_coordinator_keys_of_other_types_are_left_alone() -> None:
    request = build(require_request_class(10, 6), key_type=2, coordinator_keys=("group:topic:0",))
    physical, rewrite = to_physical(10, request, NAMES_A)
    assert physical is request and rewrite.coordinator_kind is None


# -- configs ------------------------------------------------------------------------------------------


_CONFIG_APIS = [(32, range(1, 5), "results"), (33, range(0, 3), "responses"), (44, range(0, 2), "responses")]


@pytest.mark.parametrize(("key", "versions", "answers"), _CONFIG_APIS)
def test_config_resources_are_scoped_by_resource_type(key: int, versions: range, answers: str) -> None:
    for version in versions:
        cls = require_request_class(key, version)
        resources = tuple(
            build(nested(cls, "resources"), resource_type=kind, resource_name=name)
            for kind, name in ((2, "orders"), (32, "billing"), (4, "1"), (8, "1"))
        )
        physical, rewrite = to_physical(key, build(cls, resources=resources), NAMES_A)
        assert [r.resource_name for r in physical.resources] == ["team-a.orders", "team-a.billing", "1", "1"]
        response_cls = response_type(key, version)
        results = tuple(
            build(nested(response_cls, answers), resource_type=kind, resource_name=name)
            for kind, name in ((2, "team-a.orders"), (2, "team-b.orders"), (32, "team-a.billing"), (4, "1"))
        )
        logical = to_logical(key, build(response_cls, **{answers: results}), rewrite, NAMES_A)
        assert [r.resource_name for r in getattr(logical, answers)] == ["orders", "billing", "1"]


# -- groups -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", range(3, 6))
def test_leave_group_members_are_not_renamed(version: int) -> None:
    cls = require_request_class(13, version)
    members = (build(nested(cls, "members"), member_id="m-1", group_instance_id="instance-1"),)
    physical, _ = to_physical(13, build(cls, group_id="billing", members=members), NAMES_A)
    assert physical.group_id == "team-a.billing" and physical.members is members


def test_join_and_sync_group_payloads_stay_as_the_client_wrote_them() -> None:
    cls = require_request_class(11, 9)
    protocols = (build(nested(cls, "protocols"), name="range", metadata=b"\x00\x01orders"),)
    physical, _ = to_physical(11, build(cls, group_id="billing", protocols=protocols), NAMES_A)
    assert physical.group_id == "team-a.billing" and physical.protocols is protocols
    sync = require_request_class(14, 5)
    assignments = (build(nested(sync, "assignments"), member_id="m-1", assignment=b"\x00\x01orders"),)
    physical, _ = to_physical(14, build(sync, group_id="billing", assignments=assignments), NAMES_A)
    assert physical.assignments is assignments


@pytest.mark.parametrize("version", range(0, 2))
def test_consumer_group_heartbeat_scopes_subscriptions(version: int) -> None:
    cls = require_request_class(68, version)
    request = build(cls, group_id="billing", subscribed_topic_names=("orders",))
    physical, _ = to_physical(68, request, NAMES_A)
    assert (physical.group_id, physical.subscribed_topic_names) == ("team-a.billing", ("team-a.orders",))
    unchanged = build(cls, group_id="billing", subscribed_topic_names=None)
    assert to_physical(68, unchanged, NAMES_A)[0].subscribed_topic_names is None


def test_consumer_group_heartbeat_scopes_a_regex_subscription() -> None:
    request = build(require_request_class(68, 1), group_id="billing", subscribed_topic_regex="^orders-.*")
    physical, rewrite = to_physical(68, request, NAMES_A)
    assert physical.subscribed_topic_regex == "team\\-a\\.(?:orders-.*)"
    assert rewrite is UNCHANGED


_REGEX_FIELDS = [(68, 1, "subscribed_topic_regex"), (66, 2, "transactional_id_pattern")]


@pytest.mark.parametrize(("api", "version", "field"), _REGEX_FIELDS)
def test_a_regex_that_does_not_parse_is_answered_by_the_gateway(api: int, version: int, field: str) -> None:
    request = build(require_request_class(api, version), **{field: ")|(.*"})
    _, rewrite = to_physical(api, request, NAMES_A)
    assert rewrite.answer.error_code == ErrorCode.invalid_regular_expression
    assert decode_response(api, version, encode_response(rewrite.answer, 1)) == rewrite.answer


@pytest.mark.parametrize("version", range(0, 2))
def test_consumer_group_describe_shows_the_client_s_regex(version: int) -> None:
    cls = response_type(69, version)
    group_cls = nested(cls, "groups")
    member_cls = nested(group_cls, "members")
    members = (
        build(member_cls, member_id="m-1", subscribed_topic_regex="team\\-a\\.(?:orders-.*)"),
        build(member_cls, member_id="m-2", subscribed_topic_regex="orders-.*"),  # not set through the gateway
    )
    response = build(cls, groups=(build(group_cls, group_id="team-a.billing", members=members),))
    logical = to_logical(69, response, UNCHANGED, NAMES_A)
    assert [m.subscribed_topic_regex for m in logical.groups[0].members] == ["orders-.*", None]


# -- transactions -------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", range(0, 7))
def test_init_producer_id_without_a_transactional_id_stays_without(version: int) -> None:
    request = build(require_request_class(22, version), transactional_id=None)
    assert to_physical(22, request, NAMES_A)[0] is request
    named = build(require_request_class(22, version), transactional_id="tx-1")
    assert to_physical(22, named, NAMES_A)[0].transactional_id == "team-a.tx-1"


# -- what is not copied ------------------------------------------------------------------------------


def test_record_batches_are_shared_not_copied() -> None:
    cls = require_request_class(0, 9)
    topic_cls = nested(cls, "topic_data")
    partitions = (build(nested(topic_cls, "partition_data"), index=0, records=b"batch"),)
    request = build(cls, topic_data=(build(topic_cls, name="orders", partition_data=partitions),))
    physical, _ = to_physical(0, request, NAMES_A)
    assert physical.topic_data[0].name == "team-a.orders"
    assert physical.topic_data[0].partition_data is partitions


def test_a_message_without_names_is_returned_as_it_is() -> None:
    cls = require_request_class(1, 13)  # Fetch by topic id
    request = build(cls, topics=(build(nested(cls, "topics"), topic_id=uuid.uuid4()),))
    assert to_physical(1, request, NAMES_A)[0] is request
    response_cls = response_type(1, 13)
    response = build(response_cls, responses=(build(nested(response_cls, "responses"), topic_id=uuid.uuid4()),))
    assert to_logical(1, response, Rewrite(), NAMES_A) is response


def test_responses_without_names_stay_opaque() -> None:
    """Fetch v13+ responses name topics by id only: nothing to rename, so the gateway need not decode them."""
    assert renames_response(ApiKey.FETCH, 12) and not renames_response(ApiKey.FETCH, 13)
    assert renames_response(ApiKey.PRODUCE, 9) and renames_response(ApiKey.METADATA, 12)
    assert renames_response(ApiKey.FIND_COORDINATOR, 4)  # its keys, by the request's key type
    assert not renames_response(ApiKey.JOIN_GROUP, 9)  # no names in the answer


# -- alias topics ----------------------------------------------------------------------------------------

ALIASED = VirtualNames(PREFIX, {"orders": "shared.orders", "old-payments": "team-a.payments"})


def _produce(version: int, *topics: str) -> Any:
    cls = require_request_class(0, version)
    return build(cls, acks=1, topic_data=_named(cls, "topic_data", *topics, partition_data=()))


def _produce_response(version: int, *topics: str) -> Any:
    cls = response_type(0, version)
    return build(cls, responses=_named(cls, "responses", *topics, partition_responses=()))


@pytest.mark.parametrize("version", [3, 9, 11])
def test_an_alias_reaches_its_physical_topic_and_its_answer_keeps_the_name_the_client_used(version: int) -> None:
    forwarded, rewrite = to_physical(0, _produce(version, "orders", "payments", "old-payments"), ALIASED)
    assert [t.name for t in forwarded.topic_data] == ["shared.orders", "team-a.payments", "team-a.payments"]
    answered = to_logical(0, _produce_response(version, "shared.orders", "team-a.payments"), rewrite, ALIASED)
    # (a request naming one topic twice, under its name and an alias, gets the alias: the broker merges them)
    assert [t.name for t in answered.responses] == ["orders", "old-payments"]
    _, plain = to_physical(0, _produce(version, "payments"), ALIASED)
    assert [t.name for t in to_logical(0, _produce_response(version, "team-a.payments"), plain, ALIASED).responses] == [
        "payments"
    ]


def test_metadata_for_all_topics_lists_the_aliases_beside_the_tenant_s_topics() -> None:
    request = build(require_request_class(3, 12), topics=None)
    _, rewrite = to_physical(3, request, ALIASED)
    cls = response_type(3, 12)
    response = build(cls, topics=_named(cls, "topics", "team-a.payments", "shared.orders", "team-b.orders"))
    listed = [t.name for t in to_logical(3, response, rewrite, ALIASED).topics]
    assert sorted(listed) == ["old-payments", "orders", "payments"]


def test_a_physical_topic_an_alias_stands_for_is_named_by_its_own_name_else_the_alias() -> None:
    assert ALIASED.logical_topic("team-a.payments") == "payments"
    assert ALIASED.logical_topic("shared.orders") == "orders"  # e.g. a group's committed offsets
    assert ALIASED.logical_topic("team-b.orders") is None
    shadowed = VirtualNames(PREFIX, {"orders": "shared.orders"})
    assert shadowed.topic("orders") == "shared.orders" and shadowed.logical_topic("team-a.orders") is None
