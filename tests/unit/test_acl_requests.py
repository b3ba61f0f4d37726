"""What each request needs (Kafka's per-API authorization) and what a denial answers, on kio messages."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from kanal.authz.enforcer import _with_extra
from kanal.authz.requests import Check, Verdict, check, filter_response
from kanal.protocol.acl_codes import Operation, ResourceType
from kanal.protocol.api import ApiKey, require_request_class
from kanal.protocol.entities import build, nested
from kanal.protocol.messages import decode_response, encode_response, response_type

Op, Res = Operation, ResourceType
TOPIC_DENIED = ErrorCode.topic_authorization_failed
GROUP_DENIED = ErrorCode.group_authorization_failed
CLUSTER_DENIED = ErrorCode.cluster_authorization_failed
TXN_DENIED = ErrorCode.transactional_id_authorization_failed


def request(api_key: int, version: int, **fields: Any) -> Any:
    cls = require_request_class(api_key, version)
    return build(cls, **{name: _entities(cls, name, value) for name, value in fields.items()})


def _entities(cls: type, name: str, value: Any) -> Any:
    """Lists of dicts become tuples of the field's nested entity (recursively)."""
    if isinstance(value, list):
        if value and isinstance(value[0], dict):
            entity = nested(cls, name)
            return tuple(build(entity, **{k: _entities(entity, k, v) for k, v in item.items()}) for item in value)
        return tuple(value)
    return value


def deny(*denied: tuple[Operation, ResourceType, str]) -> Check:
    refused = set(denied)

    def decide(operation: Operation, resource_type: ResourceType, name: str) -> bool:
        return (operation, resource_type, name) not in refused

    return Check(decide, lambda operation, resource_type: True)


def run(api_key: int, body: Any, decide: Check) -> Verdict:
    version = int(body.__version__)
    return check(
        api_key, body, response_type(api_key, version), decide, lambda e: str(getattr(e, "name", None) or e.topic)
    )


def answered(api_key: int, body: Any, verdict: Verdict) -> Any:
    """What the client gets for the denied part: the error entries in an (empty) response,
    through an encode/decode round trip."""
    version = int(body.__version__)
    response = _with_extra(build(response_type(api_key, version)), verdict)
    return decode_response(api_key, version, encode_response(response, 1)[0:])


def topics(*names: str, partitions: Callable[[], list[dict[str, Any]]] | None = None) -> list[dict[str, Any]]:
    return [{"name": n, **({"partitions": partitions()} if partitions else {})} for n in names]


# (case, api key, request, denied action, expected: ("whole", error) or (response field, error, names denied))
PRODUCE = request(
    ApiKey.PRODUCE,
    9,
    acks=-1,
    topic_data=[
        {"name": "a", "partition_data": [{"index": 0, "records": b""}]},
        {"name": "b", "partition_data": [{"index": 1, "records": b""}]},
    ],
)
CASES: list[tuple[str, int, Any, tuple[Operation, ResourceType, str], tuple[Any, ...]]] = [
    ("produce topic", ApiKey.PRODUCE, PRODUCE, (Op.WRITE, Res.TOPIC, "b"), ("responses", TOPIC_DENIED, ["b"])),
    (
        "produce transactional id",
        ApiKey.PRODUCE,
        request(ApiKey.PRODUCE, 9, transactional_id="tx", acks=-1, topic_data=[{"name": "a"}]),
        (Op.WRITE, Res.TRANSACTIONAL_ID, "tx"),
        ("whole", TXN_DENIED),
    ),
    (
        "fetch",
        ApiKey.FETCH,
        request(
            ApiKey.FETCH,
            12,
            replica_id=-1,
            topics=[{"topic": "a", "partitions": [{"partition": 0}]}, {"topic": "b", "partitions": [{"partition": 1}]}],
        ),
        (Op.READ, Res.TOPIC, "a"),
        ("responses", TOPIC_DENIED, ["a"]),
    ),
    (
        "fetch by a follower broker",
        ApiKey.FETCH,
        request(ApiKey.FETCH, 12, replica_id=2, topics=[{"topic": "a"}]),
        (Op.CLUSTER_ACTION, Res.CLUSTER, "kafka-cluster"),
        ("whole", CLUSTER_DENIED),
    ),
    (
        "list offsets",
        ApiKey.LIST_OFFSETS,
        request(
            ApiKey.LIST_OFFSETS, 7, replica_id=-1, topics=topics("a", "b", partitions=lambda: [{"partition_index": 2}])
        ),
        (Op.DESCRIBE, Res.TOPIC, "a"),
        ("topics", TOPIC_DENIED, ["a"]),
    ),
    (
        "metadata by name",
        ApiKey.METADATA,
        request(ApiKey.METADATA, 12, topics=[{"name": "a"}, {"name": "b"}]),
        (Op.DESCRIBE, Res.TOPIC, "b"),
        ("topics", TOPIC_DENIED, ["b"]),
    ),
    (
        "offset commit group",
        ApiKey.OFFSET_COMMIT,
        request(ApiKey.OFFSET_COMMIT, 8, group_id="g", topics=topics("a")),
        (Op.READ, Res.GROUP, "g"),
        ("whole", GROUP_DENIED),
    ),
    (
        "offset commit topic",
        ApiKey.OFFSET_COMMIT,
        request(
            ApiKey.OFFSET_COMMIT, 8, group_id="g", topics=topics("a", "b", partitions=lambda: [{"partition_index": 3}])
        ),
        (Op.READ, Res.TOPIC, "a"),
        ("topics", TOPIC_DENIED, ["a"]),
    ),
    (
        "offset fetch group (v7)",
        ApiKey.OFFSET_FETCH,
        request(ApiKey.OFFSET_FETCH, 7, group_id="g", topics=None),
        (Op.DESCRIBE, Res.GROUP, "g"),
        ("whole", GROUP_DENIED),
    ),
    (
        "offset fetch groups (v8+)",
        ApiKey.OFFSET_FETCH,
        request(ApiKey.OFFSET_FETCH, 9, groups=[{"group_id": "g"}, {"group_id": "h"}]),
        (Op.DESCRIBE, Res.GROUP, "h"),
        ("groups", GROUP_DENIED, ["h"]),
    ),
    (
        "offset delete",
        ApiKey.OFFSET_DELETE,
        request(ApiKey.OFFSET_DELETE, 0, group_id="g", topics=topics("a")),
        (Op.DELETE, Res.GROUP, "g"),
        ("whole", GROUP_DENIED),
    ),
    (
        "find coordinator group (v3)",
        ApiKey.FIND_COORDINATOR,
        request(ApiKey.FIND_COORDINATOR, 3, key="g", key_type=0),
        (Op.DESCRIBE, Res.GROUP, "g"),
        ("whole", GROUP_DENIED),
    ),
    (
        "find coordinator transaction (v4+)",
        ApiKey.FIND_COORDINATOR,
        request(ApiKey.FIND_COORDINATOR, 4, key_type=1, coordinator_keys=["t1", "t2"]),
        (Op.DESCRIBE, Res.TRANSACTIONAL_ID, "t2"),
        ("coordinators", TXN_DENIED, ["t2"]),
    ),
    (
        "join group",
        ApiKey.JOIN_GROUP,
        request(ApiKey.JOIN_GROUP, 9, group_id="g"),
        (Op.READ, Res.GROUP, "g"),
        ("whole", GROUP_DENIED),
    ),
    (
        "sync group",
        ApiKey.SYNC_GROUP,
        request(ApiKey.SYNC_GROUP, 5, group_id="g"),
        (Op.READ, Res.GROUP, "g"),
        ("whole", GROUP_DENIED),
    ),
    (
        "heartbeat",
        ApiKey.HEARTBEAT,
        request(ApiKey.HEARTBEAT, 4, group_id="g"),
        (Op.READ, Res.GROUP, "g"),
        ("whole", GROUP_DENIED),
    ),
    (
        "leave group",
        ApiKey.LEAVE_GROUP,
        request(ApiKey.LEAVE_GROUP, 5, group_id="g"),
        (Op.READ, Res.GROUP, "g"),
        ("whole", GROUP_DENIED),
    ),
    (
        "describe groups",
        ApiKey.DESCRIBE_GROUPS,
        request(ApiKey.DESCRIBE_GROUPS, 5, groups=["g", "h"]),
        (Op.DESCRIBE, Res.GROUP, "g"),
        ("groups", GROUP_DENIED, ["g"]),
    ),
    (
        "delete groups",
        ApiKey.DELETE_GROUPS,
        request(ApiKey.DELETE_GROUPS, 2, groups_names=["g", "h"]),
        (Op.DELETE, Res.GROUP, "h"),
        ("results", GROUP_DENIED, ["h"]),
    ),
    (
        "delete topics (v5)",
        ApiKey.DELETE_TOPICS,
        request(ApiKey.DELETE_TOPICS, 5, topic_names=["a", "b"]),
        (Op.DELETE, Res.TOPIC, "a"),
        ("responses", TOPIC_DENIED, ["a"]),
    ),
    (
        "delete topics (v6)",
        ApiKey.DELETE_TOPICS,
        request(ApiKey.DELETE_TOPICS, 6, topics=[{"name": "a"}, {"name": "b"}]),
        (Op.DELETE, Res.TOPIC, "b"),
        ("responses", TOPIC_DENIED, ["b"]),
    ),
    (
        "describe configs of a topic",
        ApiKey.DESCRIBE_CONFIGS,
        request(
            ApiKey.DESCRIBE_CONFIGS,
            4,
            resources=[{"resource_type": 2, "resource_name": "a"}, {"resource_type": 2, "resource_name": "b"}],
        ),
        (Op.DESCRIBE_CONFIGS, Res.TOPIC, "a"),
        ("results", TOPIC_DENIED, ["a"]),
    ),
    (
        "describe configs of a broker",
        ApiKey.DESCRIBE_CONFIGS,
        request(ApiKey.DESCRIBE_CONFIGS, 4, resources=[{"resource_type": 4, "resource_name": "1"}]),
        (Op.DESCRIBE_CONFIGS, Res.CLUSTER, "kafka-cluster"),
        ("results", CLUSTER_DENIED, ["1"]),
    ),
    (
        "alter configs",
        ApiKey.ALTER_CONFIGS,
        request(ApiKey.ALTER_CONFIGS, 2, resources=[{"resource_type": 2, "resource_name": "a"}]),
        (Op.ALTER_CONFIGS, Res.TOPIC, "a"),
        ("responses", TOPIC_DENIED, ["a"]),
    ),
    (
        "incremental alter configs",
        ApiKey.INCREMENTAL_ALTER_CONFIGS,
        request(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, resources=[{"resource_type": 2, "resource_name": "a"}]),
        (Op.ALTER_CONFIGS, Res.TOPIC, "a"),
        ("responses", TOPIC_DENIED, ["a"]),
    ),
    (
        "create partitions",
        ApiKey.CREATE_PARTITIONS,
        request(ApiKey.CREATE_PARTITIONS, 3, topics=[{"name": "a", "count": 3}]),
        (Op.ALTER, Res.TOPIC, "a"),
        ("results", TOPIC_DENIED, ["a"]),
    ),
    (
        "delete records",
        ApiKey.DELETE_RECORDS,
        request(ApiKey.DELETE_RECORDS, 2, topics=topics("a", partitions=lambda: [{"partition_index": 0, "offset": 5}])),
        (Op.DELETE, Res.TOPIC, "a"),
        ("topics", TOPIC_DENIED, ["a"]),
    ),
    (
        "init producer id, transactional",
        ApiKey.INIT_PRODUCER_ID,
        request(ApiKey.INIT_PRODUCER_ID, 5, transactional_id="tx"),
        (Op.WRITE, Res.TRANSACTIONAL_ID, "tx"),
        ("whole", TXN_DENIED),
    ),
    (
        "add offsets to txn",
        ApiKey.ADD_OFFSETS_TO_TXN,
        request(ApiKey.ADD_OFFSETS_TO_TXN, 4, transactional_id="tx", group_id="g"),
        (Op.READ, Res.GROUP, "g"),
        ("whole", GROUP_DENIED),
    ),
    (
        "txn offset commit",
        ApiKey.TXN_OFFSET_COMMIT,
        request(ApiKey.TXN_OFFSET_COMMIT, 4, transactional_id="tx", group_id="g", topics=topics("a")),
        (Op.WRITE, Res.TRANSACTIONAL_ID, "tx"),
        ("whole", TXN_DENIED),
    ),
    (
        "end txn",
        ApiKey.END_TXN,
        request(ApiKey.END_TXN, 4, transactional_id="tx"),
        (Op.WRITE, Res.TRANSACTIONAL_ID, "tx"),
        ("whole", TXN_DENIED),
    ),
    (
        "describe producers",
        ApiKey.DESCRIBE_PRODUCERS,
        request(ApiKey.DESCRIBE_PRODUCERS, 0, topics=[{"name": "a", "partition_indexes": [0, 1]}]),
        (Op.READ, Res.TOPIC, "a"),
        ("topics", TOPIC_DENIED, ["a"]),
    ),
    (
        "describe transactions",
        ApiKey.DESCRIBE_TRANSACTIONS,
        request(ApiKey.DESCRIBE_TRANSACTIONS, 0, transactional_ids=["t1", "t2"]),
        (Op.DESCRIBE, Res.TRANSACTIONAL_ID, "t1"),
        ("transaction_states", TXN_DENIED, ["t1"]),
    ),
    (
        "consumer group heartbeat",
        ApiKey.CONSUMER_GROUP_HEARTBEAT,
        request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, group_id="g", subscribed_topic_names=["a"]),
        (Op.DESCRIBE, Res.TOPIC, "a"),
        ("whole", TOPIC_DENIED),
    ),
    (
        "consumer group describe",
        ApiKey.CONSUMER_GROUP_DESCRIBE,
        request(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, group_ids=["g"]),
        (Op.DESCRIBE, Res.GROUP, "g"),
        ("groups", GROUP_DENIED, ["g"]),
    ),
    (
        "describe topic partitions",
        ApiKey.DESCRIBE_TOPIC_PARTITIONS,
        request(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, topics=[{"name": "a"}]),
        (Op.DESCRIBE, Res.TOPIC, "a"),
        ("topics", TOPIC_DENIED, ["a"]),
    ),
    (
        "describe log dirs",
        ApiKey.DESCRIBE_LOG_DIRS,
        request(ApiKey.DESCRIBE_LOG_DIRS, 4, topics=None),
        (Op.DESCRIBE, Res.CLUSTER, "kafka-cluster"),
        ("whole", CLUSTER_DENIED),
    ),
    (
        "elect leaders",
        ApiKey.ELECT_LEADERS,
        request(ApiKey.ELECT_LEADERS, 2),
        (Op.ALTER, Res.CLUSTER, "kafka-cluster"),
        ("whole", CLUSTER_DENIED),
    ),
    (
        "alter client quotas",
        ApiKey.ALTER_CLIENT_QUOTAS,
        request(ApiKey.ALTER_CLIENT_QUOTAS, 1),
        (Op.ALTER_CONFIGS, Res.CLUSTER, "kafka-cluster"),
        ("whole", CLUSTER_DENIED),
    ),
    (
        "an inter-broker API",
        4,  # LeaderAndIsr
        None,
        (Op.CLUSTER_ACTION, Res.CLUSTER, "kafka-cluster"),
        ("whole", CLUSTER_DENIED),
    ),
]


def _names(entries: Any) -> list[str]:
    out = []
    for entry in entries:
        for field_name in ("name", "topic", "group_id", "key", "transactional_id", "resource_name"):
            if hasattr(entry, field_name):
                out.append(str(getattr(entry, field_name)))
                break
    return out


@pytest.mark.parametrize(("case", "api_key", "body", "denied", "expected"), CASES, ids=[c[0] for c in CASES])
def test_each_api_needs_what_kafka_requires_and_answers_the_denied_part(
    case: str, api_key: int, body: Any, denied: tuple[Operation, ResourceType, str], expected: tuple[Any, ...]
) -> None:
    if body is None:  # an API the gateway never decodes: only the rule matters
        verdict = check(api_key, None, type(None), deny(denied), str)
        assert verdict.error == expected[1] and verdict.denied[0].operation == denied[0]
        return
    everything = run(api_key, body, deny())
    assert everything.error is None and not everything.extra and not everything.denied
    assert everything.request is body
    verdict = run(api_key, body, deny(denied))
    assert [(d.operation, d.resource_type, d.name) for d in verdict.denied] == [denied]
    if expected[0] == "whole":
        assert verdict.error == expected[1]
        return
    field_name, error_code, names = expected
    assert verdict.error is None
    assert [field for field, _ in verdict.extra] == [field_name] * len(names)
    response = answered(api_key, body, verdict)
    entries = getattr(response, field_name)
    assert _names(entries) == names
    assert _errors(entries) == {error_code}
    if verdict.request is not None:  # the allowed part goes on without the denied entries
        assert not set(names) & set(_request_names(verdict.request))


def _errors(entries: Any) -> set[int]:
    """The error codes of response entries: their own, or their partitions'."""
    found: set[int] = set()
    for entry in entries:
        if hasattr(entry, "error_code"):
            found.add(entry.error_code)
            continue
        for value in vars_of(entry):
            if isinstance(value, tuple):
                found |= _errors(value)
    return found


def vars_of(entry: Any) -> list[Any]:
    return [getattr(entry, name) for name in entry.__dataclass_fields__]


def _request_names(body: Any) -> list[str]:
    for field_name in (
        "topic_data",
        "topics",
        "groups",
        "groups_names",
        "coordinator_keys",
        "resources",
        "transactional_ids",
        "group_ids",
        "topic_names",
    ):
        value = getattr(body, field_name, None)
        if value is not None:
            return [v if isinstance(v, str) else _names([v])[0] for v in value]
    return []


def test_produce_partitions_of_a_denied_topic_each_get_the_error() -> None:
    body = request(
        ApiKey.PRODUCE,
        9,
        acks=-1,
        topic_data=[{"name": "a", "partition_data": [{"index": 0, "records": b""}, {"index": 4, "records": b""}]}],
    )
    verdict = run(ApiKey.PRODUCE, body, deny((Op.WRITE, Res.TOPIC, "a")))
    response = answered(ApiKey.PRODUCE, body, verdict)
    partitions = response.responses[0].partition_responses
    assert [(p.index, p.error_code, p.base_offset) for p in partitions] == [
        (0, TOPIC_DENIED, -1),
        (4, TOPIC_DENIED, -1),
    ]


def test_metadata_of_all_topics_leaves_out_what_may_not_be_described() -> None:
    body = request(ApiKey.METADATA, 12, topics=None, include_topic_authorized_operations=True)
    verdict = run(ApiKey.METADATA, body, deny())
    assert verdict.filtered and verdict.request is body
    response_cls = response_type(ApiKey.METADATA, 12)
    response = build(response_cls, topics=_entities(response_cls, "topics", [{"name": "a"}, {"name": "secret"}]))
    denied = deny((Op.DESCRIBE, Res.TOPIC, "secret"), (Op.DELETE, Res.TOPIC, "a"))
    filtered = filter_response(ApiKey.METADATA, body, response, denied.decide)
    assert [t.name for t in filtered.topics] == ["a"]
    allowed = {op for op in Operation if filtered.topics[0].topic_authorized_operations & (1 << op)}
    assert Op.READ in allowed and Op.DESCRIBE in allowed and Op.DELETE not in allowed


def test_metadata_auto_creation_needs_create() -> None:
    body = request(ApiKey.METADATA, 12, topics=[{"name": "new"}], allow_auto_topic_creation=True)
    assert run(ApiKey.METADATA, body, deny()).request.allow_auto_topic_creation
    verdict = run(ApiKey.METADATA, body, deny((Op.CREATE, Res.TOPIC, "new"), (Op.CREATE, Res.CLUSTER, "kafka-cluster")))
    assert not verdict.request.allow_auto_topic_creation and [t.name for t in verdict.request.topics] == ["new"]


def test_list_groups_is_filtered_unless_the_cluster_may_be_described() -> None:
    body = request(ApiKey.LIST_GROUPS, 5)
    response_cls = response_type(ApiKey.LIST_GROUPS, 5)
    response = build(response_cls, groups=_entities(response_cls, "groups", [{"group_id": "g"}, {"group_id": "h"}]))
    denied = deny((Op.DESCRIBE, Res.GROUP, "h"))
    assert filter_response(ApiKey.LIST_GROUPS, body, response, denied.decide) is response  # DESCRIBE on the cluster
    denied = deny((Op.DESCRIBE, Res.GROUP, "h"), (Op.DESCRIBE, Res.CLUSTER, "kafka-cluster"))
    assert [g.group_id for g in filter_response(ApiKey.LIST_GROUPS, body, response, denied.decide).groups] == ["g"]


def test_add_partitions_to_txn_fails_whole_naming_the_denied_topics() -> None:
    body = request(
        ApiKey.ADD_PARTITIONS_TO_TXN,
        3,
        v3_and_below_transactional_id="tx",
        v3_and_below_topics=[{"name": "a", "partitions": [0]}, {"name": "b", "partitions": [1]}],
    )
    verdict = run(ApiKey.ADD_PARTITIONS_TO_TXN, body, deny((Op.WRITE, Res.TOPIC, "b")))
    assert verdict.request is None
    response = answered(ApiKey.ADD_PARTITIONS_TO_TXN, body, verdict)
    errors = {t.name: t.results_by_partition[0].partition_error_code for t in response.results_by_topic_v3_and_below}
    assert errors == {"a": ErrorCode.operation_not_attempted, "b": TOPIC_DENIED}


def test_idempotence_needs_idempotent_write_or_write_on_some_topic() -> None:
    body = request(ApiKey.INIT_PRODUCER_ID, 5, transactional_id=None)
    no_write = Check(lambda *action: action[0] != Op.IDEMPOTENT_WRITE, lambda operation, resource_type: False)
    assert run(ApiKey.INIT_PRODUCER_ID, body, no_write).error == CLUSTER_DENIED
    some_write = Check(lambda *action: action[0] != Op.IDEMPOTENT_WRITE, lambda operation, resource_type: True)
    assert run(ApiKey.INIT_PRODUCER_ID, body, some_write).error is None


def test_create_topics_needs_create_on_the_cluster_or_on_each_topic() -> None:
    body = request(
        ApiKey.CREATE_TOPICS, 7, topics=[{"name": "a", "num_partitions": 1}, {"name": "b", "num_partitions": 1}]
    )
    assert run(ApiKey.CREATE_TOPICS, body, deny((Op.CREATE, Res.TOPIC, "a"))).request is body  # the cluster's
    verdict = run(
        ApiKey.CREATE_TOPICS, body, deny((Op.CREATE, Res.CLUSTER, "kafka-cluster"), (Op.CREATE, Res.TOPIC, "a"))
    )
    assert [t.name for t in verdict.request.topics] == ["b"]
    response = answered(ApiKey.CREATE_TOPICS, body, verdict)
    assert [(t.name, t.error_code) for t in response.topics] == [("a", TOPIC_DENIED)]
