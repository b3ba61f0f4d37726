"""Where each renamed API carries topic names, group ids and transactional ids.

One entry per API, for every version the gateway decodes (see :mod:`kanal.tenancy.walk`); the
field names are kio's. Left out on purpose:

* Topic ids (Produce and Fetch v13+, OffsetCommit and OffsetFetch v10, DeleteTopics v6, the
  KIP-848 assignments) stay as they are: an id names one physical topic, whoever asks.
* Member ids and group instance ids (JoinGroup, SyncGroup, LeaveGroup v3+ ``members``) belong to a
  group that is already scoped; they are not names of the cluster.
* JoinGroup protocol metadata and SyncGroup assignments (and their copies in DescribeGroups) are
  opaque bytes to the broker: the group leader, a client that sees only logical names, writes the
  assignment for the other members from the subscriptions they sent, so the bytes hold logical
  names from end to end and nothing upstream needs to read them. (A KIP-848 group coordinator does
  read them when classic members join a consumer group during an online upgrade: such mixed groups
  would see logical names and are not supported yet.)
* Config names and values, error messages and free-text metadata.

FindCoordinator's v4+ response keys carry no key type of their own: they are mapped back by
:mod:`kanal.tenancy.rewrite` with the request's key type.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from kio.schema.index import api_key_map

from kanal.tenancy.walk import REGEX, ByField, Each, Kind, Many, One, Spec, each, one

_KEY: Final = {name: key for key, name in api_key_map.items()}

T: Final = Kind.TOPIC
G: Final = Kind.GROUP
X: Final = Kind.TRANSACTIONAL_ID

#: FindCoordinator's key types: 0 a group, 1 a transactional id (v0 has no key type: a group).
#: Other key types (share-group state partitions, KIP-932) are for brokers and stay as they are.
COORDINATOR_KEY: Final = ByField("key_type", {0: G, 1: X}, missing=G)
#: Config resource types: 2 a topic, 32 a group (KIP-848 group configs). Brokers (4), broker
#: loggers (8) and client-metrics subscriptions (16) are no tenant's names and stay as they are.
CONFIG_RESOURCE: Final = ByField("resource_type", {2: T, 32: G})


@dataclass(frozen=True, slots=True)
class ApiNames:
    """Where the names are in an API's requests and in its responses."""

    request: Spec
    response: Spec


_topics_by_name: Final = {"topics": each(name=T)}

_BY_NAME: Final[dict[str, ApiNames]] = {
    "produce": ApiNames(
        request={"transactional_id": X, "topic_data": each(name=T)},
        response={"responses": each(name=T)},
    ),
    "fetch": ApiNames(
        request={"topics": each(topic=T), "forgotten_topics_data": each(topic=T)},
        response={"responses": each(topic=T)},
    ),
    "list_offsets": ApiNames(request=_topics_by_name, response=_topics_by_name),
    "metadata": ApiNames(request=_topics_by_name, response=_topics_by_name),  # null topics: all
    "offset_commit": ApiNames(
        request={"group_id": G, "topics": each(name=T)},
        response=_topics_by_name,
    ),
    "offset_fetch": ApiNames(
        request={"group_id": G, "topics": each(name=T), "groups": each(group_id=G, topics=each(name=T))},
        response={"topics": each(name=T), "groups": each(group_id=G, topics=each(name=T))},
    ),
    "find_coordinator": ApiNames(
        request={"key": COORDINATOR_KEY, "coordinator_keys": COORDINATOR_KEY},
        response={},
    ),
    "join_group": ApiNames(request={"group_id": G}, response={}),
    "heartbeat": ApiNames(request={"group_id": G}, response={}),
    "leave_group": ApiNames(request={"group_id": G}, response={}),
    "sync_group": ApiNames(request={"group_id": G}, response={}),
    "describe_groups": ApiNames(request={"groups": Many(G)}, response={"groups": each(group_id=G)}),
    "list_groups": ApiNames(request={}, response={"groups": each(group_id=G)}),
    "create_topics": ApiNames(request=_topics_by_name, response=_topics_by_name),
    "delete_topics": ApiNames(
        request={"topic_names": Many(T), "topics": each(name=T)},
        response={"responses": each(name=T)},
    ),
    "delete_records": ApiNames(request=_topics_by_name, response=_topics_by_name),
    "init_producer_id": ApiNames(request={"transactional_id": X}, response={}),
    "offset_for_leader_epoch": ApiNames(request={"topics": each(topic=T)}, response={"topics": each(topic=T)}),
    "add_partitions_to_txn": ApiNames(
        request={
            "v3_and_below_transactional_id": X,
            "v3_and_below_topics": each(name=T),
            "transactions": each(transactional_id=X, topics=each(name=T)),
        },
        response={
            "results_by_topic_v3_and_below": each(name=T),
            "results_by_transaction": each(transactional_id=X, topic_results=each(name=T)),
        },
    ),
    "add_offsets_to_txn": ApiNames(request={"transactional_id": X, "group_id": G}, response={}),
    "end_txn": ApiNames(request={"transactional_id": X}, response={}),
    "txn_offset_commit": ApiNames(
        request={"transactional_id": X, "group_id": G, "topics": each(name=T)},
        response=_topics_by_name,
    ),
    "describe_configs": ApiNames(
        request={"resources": each(resource_name=CONFIG_RESOURCE)},
        response={"results": each(resource_name=CONFIG_RESOURCE)},
    ),
    "alter_configs": ApiNames(
        request={"resources": each(resource_name=CONFIG_RESOURCE)},
        response={"responses": each(resource_name=CONFIG_RESOURCE)},
    ),
    "incremental_alter_configs": ApiNames(
        request={"resources": each(resource_name=CONFIG_RESOURCE)},
        response={"responses": each(resource_name=CONFIG_RESOURCE)},
    ),
    "create_partitions": ApiNames(request=_topics_by_name, response={"results": each(name=T)}),
    "delete_groups": ApiNames(request={"groups_names": Many(G)}, response={"results": each(group_id=G)}),
    "offset_delete": ApiNames(request={"group_id": G, "topics": each(name=T)}, response=_topics_by_name),
    "describe_producers": ApiNames(request=_topics_by_name, response=_topics_by_name),
    "describe_transactions": ApiNames(
        request={"transactional_ids": Many(X)},
        response={"transaction_states": each(transactional_id=X, topics=each(topic=T))},
    ),
    "list_transactions": ApiNames(
        request={"transactional_id_pattern": REGEX},
        response={"transaction_states": each(transactional_id=X)},
    ),
    "consumer_group_heartbeat": ApiNames(
        request={"group_id": G, "subscribed_topic_names": Many(T), "subscribed_topic_regex": REGEX},
        response={},
    ),
    "consumer_group_describe": ApiNames(
        request={"group_ids": Many(G)},
        response={
            "groups": each(
                group_id=G,
                members=each(
                    subscribed_topic_names=Many(T),
                    subscribed_topic_regex=REGEX,
                    assignment=one(topic_partitions=each(topic_name=T)),
                    target_assignment=one(topic_partitions=each(topic_name=T)),
                ),
            )
        },
    ),
    "describe_topic_partitions": ApiNames(
        request={"topics": each(name=T), "cursor": one(topic_name=T)},
        response={"topics": each(name=T), "next_cursor": one(topic_name=T)},
    ),
}

#: Where the names are, by API key.
NAMES: Final[Mapping[int, ApiNames]] = {_KEY[name]: where for name, where in _BY_NAME.items()}


def _names_topics(spec: Spec) -> bool:
    for rule in spec.values():
        if rule is T or rule is REGEX or (isinstance(rule, Many) and rule.kind is T):
            return True
        if isinstance(rule, ByField) and T in rule.kinds.values():
            return True
        if isinstance(rule, Each | One) and _names_topics(rule.fields):
            return True
    return False


#: The APIs whose requests or responses can name a topic (the passthrough cluster's aliases).
TOPIC_APIS: Final = frozenset(
    key for key, where in NAMES.items() if _names_topics(where.request) or _names_topics(where.response)
)


def api_key(name: str) -> int:
    """The API key of kio's name for an API (``"create_topics"``)."""
    return _KEY[name]


def api_keys(*names: str) -> frozenset[int]:
    """The API keys of kio's API names (``"elect_leaders"``)."""
    return frozenset(_KEY[name] for name in names)
