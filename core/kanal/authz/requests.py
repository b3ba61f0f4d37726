"""What each Kafka request needs to be allowed, and how a denial reaches the client: Kafka's own rules.

Kafka's brokers authorize request by request (``KafkaApis``): a Produce needs WRITE on each topic
and fails just the denied topics' partitions with TOPIC_AUTHORIZATION_FAILED; a group call needs
READ on the group and fails whole with GROUP_AUTHORIZATION_FAILED; a transactional call needs WRITE
on the transactional id; cluster-wide calls need an operation on the cluster. This module states
those rules per API on a decoded request, sans-I/O, and says what to do:

* forward the request as it is (everything allowed);
* refuse it whole with an error code (the client's library raises its authorization exception);
* forward only the allowed entries and add an error entry for each denied one to the response,
  so the client gets an answer for everything it asked (:func:`error_entry` mirrors the request's
  entry: same name, same partitions);
* filter a response (Metadata for all topics, ListGroups, ListTransactions, OffsetFetch of all
  topics): what the principal may not describe is left out, as Kafka leaves it out.

An API the table does not know needs CLUSTER_ACTION on the cluster (what brokers ask of each other),
so a new API never slips through unchecked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kio.schema.errors import ErrorCode

from kanal.protocol.acl_codes import CLUSTER_NAME, Operation, ResourceType
from kanal.protocol.api import ApiKey
from kanal.protocol.entities import build, has_field, nested
from kanal.protocol.error_responses import error_entry

__all__ = ["Check", "Decide", "Denial", "Verdict", "authorized_operations", "check", "filter_response"]

Op, Res = Operation, ResourceType
#: Whether the connection's principal may do an operation on a resource (the enforcer's decision).
Decide = Callable[[Operation, ResourceType, str], bool]
#: Whether the principal may do an operation on some resource of a type (Kafka's authorizeByResourceType).
DecideAny = Callable[[Operation, ResourceType], bool]

TOPIC_DENIED = ErrorCode.topic_authorization_failed
GROUP_DENIED = ErrorCode.group_authorization_failed
CLUSTER_DENIED = ErrorCode.cluster_authorization_failed
TXN_DENIED = ErrorCode.transactional_id_authorization_failed


@dataclass(frozen=True, slots=True)
class Denial:
    """One action refused: for the AUTHORIZATION audit event."""

    operation: Operation
    resource_type: ResourceType
    name: str


@dataclass(slots=True)
class Verdict:
    """What the request may do. ``request`` is what to forward (None: nothing; the client then gets
    an answer built from ``extra`` alone, or ``error``); ``error`` refuses the whole request;
    ``extra`` are (response field, entry) pairs to add to the response; ``filtered`` says the
    response must go through :func:`filter_response`."""

    request: Any
    error: ErrorCode | None = None
    extra: list[tuple[str, Any]] = field(default_factory=list)
    denied: list[Denial] = field(default_factory=list)
    filtered: bool = False

    @property
    def allowed(self) -> bool:
        return self.error is None and not self.extra and not self.filtered and not self.denied


@dataclass(slots=True)
class Check:
    """The decisions of one request: remembers what was denied."""

    decide: Decide
    decide_any: DecideAny
    denied: list[Denial] = field(default_factory=list)

    def __call__(self, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        if self.decide(operation, resource_type, name):
            return True
        self.denied.append(Denial(operation, resource_type, name))
        return False


# -- the rules, per API ----------------------------------------------------------------------------


def _entries(
    verdict: Verdict,
    request: Any,
    request_field: str,
    response_cls: type,
    response_field: str,
    refusal: Callable[[Any], ErrorCode | None],
) -> Any:
    """Keeps the entries of ``request_field`` that ``refusal`` lets go (None); answers the others in
    ``response_field`` with the error it gives."""
    entries = getattr(request, request_field)
    if entries is None:
        return request
    kept = []
    entry_cls = nested(response_cls, response_field)
    for entry in entries:
        error_code = refusal(entry)
        if error_code is None:
            kept.append(entry)
        else:
            verdict.extra.append((response_field, error_entry(entry_cls, entry, error_code)))
    if len(kept) == len(entries):
        return request
    return replace(request, **{request_field: tuple(kept)})


def _per_entry(
    request_field: str,
    response_field: str,
    operation: Operation,
    resource_type: ResourceType,
    error_code: ErrorCode,
    name_field: str | None = None,
) -> Callable[[Any, type, Check, Callable[[Any], str], Verdict], Any]:
    def apply(
        request: Any, response_cls: type, check: Check, topic_name: Callable[[Any], str], verdict: Verdict
    ) -> Any:
        def name_of(entry: Any) -> str:
            if isinstance(entry, str):
                return entry
            if resource_type == Res.TOPIC:
                return topic_name(entry)
            return str(getattr(entry, name_field or "name"))

        def refusal(entry: Any) -> ErrorCode | None:
            return None if check(operation, resource_type, name_of(entry)) else error_code

        return _entries(verdict, request, request_field, response_cls, response_field, refusal)

    return apply


def _whole(operation: Operation, resource_type: ResourceType, name_field: str, error_code: ErrorCode) -> Any:
    def rule(request: Any, check: Check) -> ErrorCode | None:
        name = getattr(request, name_field, None)
        if name is None:
            return None
        return None if check(operation, resource_type, str(name)) else error_code

    return rule


_GROUP_READ = _whole(Op.READ, Res.GROUP, "group_id", GROUP_DENIED)
_TXN_WRITE = _whole(Op.WRITE, Res.TRANSACTIONAL_ID, "transactional_id", TXN_DENIED)

# API -> (whole-request rules, per-entry rules); the response class is the request version's.
_TOPIC_ENTRIES: dict[int, tuple[tuple[Any, ...], tuple[Any, ...]]] = {
    ApiKey.PRODUCE: ((_TXN_WRITE,), (_per_entry("topic_data", "responses", Op.WRITE, Res.TOPIC, TOPIC_DENIED),)),
    ApiKey.LIST_OFFSETS: ((), (_per_entry("topics", "topics", Op.DESCRIBE, Res.TOPIC, TOPIC_DENIED),)),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: ((), (_per_entry("topics", "topics", Op.DESCRIBE, Res.TOPIC, TOPIC_DENIED),)),
    ApiKey.OFFSET_COMMIT: ((_GROUP_READ,), (_per_entry("topics", "topics", Op.READ, Res.TOPIC, TOPIC_DENIED),)),
    ApiKey.TXN_OFFSET_COMMIT: (
        (_TXN_WRITE, _GROUP_READ),
        (_per_entry("topics", "topics", Op.READ, Res.TOPIC, TOPIC_DENIED),),
    ),
    ApiKey.OFFSET_DELETE: (
        (_whole(Op.DELETE, Res.GROUP, "group_id", GROUP_DENIED),),
        (_per_entry("topics", "topics", Op.READ, Res.TOPIC, TOPIC_DENIED),),
    ),
    ApiKey.JOIN_GROUP: ((_GROUP_READ,), ()),
    ApiKey.SYNC_GROUP: ((_GROUP_READ,), ()),
    ApiKey.HEARTBEAT: ((_GROUP_READ,), ()),
    ApiKey.LEAVE_GROUP: ((_GROUP_READ,), ()),
    ApiKey.DESCRIBE_GROUPS: ((), (_per_entry("groups", "groups", Op.DESCRIBE, Res.GROUP, GROUP_DENIED),)),
    ApiKey.DELETE_GROUPS: ((), (_per_entry("groups_names", "results", Op.DELETE, Res.GROUP, GROUP_DENIED),)),
    ApiKey.CREATE_PARTITIONS: ((), (_per_entry("topics", "results", Op.ALTER, Res.TOPIC, TOPIC_DENIED),)),
    ApiKey.DELETE_RECORDS: ((), (_per_entry("topics", "topics", Op.DELETE, Res.TOPIC, TOPIC_DENIED),)),
    ApiKey.END_TXN: ((_TXN_WRITE,), ()),
    ApiKey.ADD_OFFSETS_TO_TXN: ((_TXN_WRITE, _GROUP_READ), ()),
    ApiKey.DESCRIBE_PRODUCERS: ((), (_per_entry("topics", "topics", Op.READ, Res.TOPIC, TOPIC_DENIED),)),
    ApiKey.DESCRIBE_TRANSACTIONS: (
        (),
        (_per_entry("transactional_ids", "transaction_states", Op.DESCRIBE, Res.TRANSACTIONAL_ID, TXN_DENIED),),
    ),
    ApiKey.CONSUMER_GROUP_DESCRIBE: (
        (),
        (_per_entry("group_ids", "groups", Op.DESCRIBE, Res.GROUP, GROUP_DENIED),),
    ),
    ApiKey.DESCRIBE_TOPIC_PARTITIONS: ((), (_per_entry("topics", "topics", Op.DESCRIBE, Res.TOPIC, TOPIC_DENIED),)),
}

#: APIs any authenticated client may call: no resource, or nothing a broker checks.
OPEN = frozenset(
    {
        ApiKey.API_VERSIONS,
        ApiKey.SASL_HANDSHAKE,
        ApiKey.SASL_AUTHENTICATE,
        ApiKey.DESCRIBE_CLUSTER,
        ApiKey.GET_TELEMETRY_SUBSCRIPTIONS,
        ApiKey.PUSH_TELEMETRY,
    }
)

#: APIs on the cluster as a whole: the operation they need on the CLUSTER resource.
_CLUSTER_OPERATIONS: dict[int, Operation] = {
    ApiKey.DESCRIBE_LOG_DIRS: Op.DESCRIBE,
    ApiKey.ALTER_REPLICA_LOG_DIRS: Op.ALTER,
    ApiKey.ELECT_LEADERS: Op.ALTER,
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: Op.ALTER,
    ApiKey.LIST_PARTITION_REASSIGNMENTS: Op.DESCRIBE,
    ApiKey.DESCRIBE_CLIENT_QUOTAS: Op.DESCRIBE_CONFIGS,
    ApiKey.ALTER_CLIENT_QUOTAS: Op.ALTER_CONFIGS,
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: Op.DESCRIBE,
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: Op.ALTER,
    ApiKey.DESCRIBE_QUORUM: Op.DESCRIBE,
    ApiKey.UPDATE_FEATURES: Op.ALTER,
    ApiKey.DESCRIBE_ACLS: Op.DESCRIBE,
    ApiKey.CREATE_ACLS: Op.ALTER,
    ApiKey.DELETE_ACLS: Op.ALTER,
}

# Config resource types (DescribeConfigs, AlterConfigs) -> ACL resource type and error.
_CONFIG_RESOURCES = {2: (Res.TOPIC, TOPIC_DENIED), 32: (Res.GROUP, GROUP_DENIED)}
_COORDINATOR_KEYS = {0: (Res.GROUP, GROUP_DENIED), 1: (Res.TRANSACTIONAL_ID, TXN_DENIED)}


def check(api_key: int, request: Any, response_cls: type, decide: Check, topic_name: Callable[[Any], str]) -> Verdict:
    """What ``request`` may do. ``topic_name`` names a request's topic entry (by id if need be)."""
    verdict = Verdict(request)
    special = _SPECIAL.get(api_key)
    if special is not None:
        special(verdict, request, response_cls, decide, topic_name)
    elif api_key in _TOPIC_ENTRIES:
        wholes, entries = _TOPIC_ENTRIES[api_key]
        for rule in wholes:
            verdict.error = rule(request, decide)
            if verdict.error is not None:
                break
        else:
            for apply in entries:
                verdict.request = apply(verdict.request, response_cls, decide, topic_name, verdict)
    elif api_key not in OPEN:
        operation = _CLUSTER_OPERATIONS.get(api_key, Op.CLUSTER_ACTION)
        if not decide(operation, Res.CLUSTER, CLUSTER_NAME):
            verdict.error = CLUSTER_DENIED
    verdict.denied = decide.denied
    return verdict


def _fetch(verdict: Verdict, request: Any, response_cls: type, decide: Check, topic_name: Callable[[Any], str]) -> None:
    if (
        getattr(request, "replica_id", -1) >= 0
        or getattr(getattr(request, "replica_state", None), "replica_id", -1) >= 0
    ):
        if not decide(Op.CLUSTER_ACTION, Res.CLUSTER, CLUSTER_NAME):  # a follower broker's fetch
            verdict.error = CLUSTER_DENIED
        return
    verdict.request = _per_entry("topics", "responses", Op.READ, Res.TOPIC, TOPIC_DENIED)(
        request, response_cls, decide, topic_name, verdict
    )


def _metadata(
    verdict: Verdict, request: Any, response_cls: type, decide: Check, topic_name: Callable[[Any], str]
) -> None:
    verdict.filtered = True  # all topics: leave out what may not be described; ids: checked by name there
    if request.topics is None:
        return
    named = [t for t in request.topics if getattr(t, "name", None)]
    verdict.request = _per_entry("topics", "topics", Op.DESCRIBE, Res.TOPIC, TOPIC_DENIED)(
        request, response_cls, decide, topic_name, verdict
    )
    if getattr(request, "allow_auto_topic_creation", False) and named:
        creatable = decide.decide(Op.CREATE, Res.CLUSTER, CLUSTER_NAME) or all(
            decide.decide(Op.CREATE, Res.TOPIC, str(t.name)) for t in named
        )
        if not creatable:
            verdict.request = replace(verdict.request, allow_auto_topic_creation=False)


def _offset_fetch(
    verdict: Verdict, request: Any, response_cls: type, decide: Check, topic_name: Callable[[Any], str]
) -> None:
    verdict.filtered = True  # all topics of a group: those the principal may not describe are left out
    if not has_field(type(request), "groups"):
        if not decide(Op.DESCRIBE, Res.GROUP, str(request.group_id)):
            verdict.error = GROUP_DENIED
            return
        verdict.request = _per_entry("topics", "topics", Op.DESCRIBE, Res.TOPIC, TOPIC_DENIED)(
            request, response_cls, decide, topic_name, verdict
        )
        return
    verdict.request = _per_entry("groups", "groups", Op.DESCRIBE, Res.GROUP, GROUP_DENIED, "group_id")(
        request, response_cls, decide, topic_name, verdict
    )


def _find_coordinator(
    verdict: Verdict, request: Any, response_cls: type, decide: Check, topic_name: Callable[[Any], str]
) -> None:
    resource = _COORDINATOR_KEYS.get(int(request.key_type))
    if resource is None:
        return
    resource_type, error_code = resource
    if has_field(type(request), "coordinator_keys"):
        verdict.request = _per_entry("coordinator_keys", "coordinators", Op.DESCRIBE, resource_type, error_code)(
            request, response_cls, decide, topic_name, verdict
        )
    elif not decide(Op.DESCRIBE, resource_type, str(request.key)):
        verdict.error = error_code


def _list_filtered(
    verdict: Verdict, request: Any, response_cls: type, decide: Check, topic_name: Callable[[Any], str]
) -> None:
    verdict.filtered = True


def _create_topics(
    verdict: Verdict, request: Any, response_cls: type, decide: Check, topic_name: Callable[[Any], str]
) -> None:
    if decide.decide(Op.CREATE, Res.CLUSTER, CLUSTER_NAME):
        return
    verdict.request = _per_entry("topics", "topics", Op.CREATE, Res.TOPIC, TOPIC_DENIED)(
        request, response_cls, decide, topic_name, verdict
    )


def _delete_topics(
    verdict: Verdict, request: Any, response_cls: type, decide: Check, topic_name: Callable[[Any], str]
) -> None:
    field_name = "topics" if has_field(type(request), "topics") else "topic_names"
    verdict.request = _per_entry(field_name, "responses", Op.DELETE, Res.TOPIC, TOPIC_DENIED)(
        request, response_cls, decide, topic_name, verdict
    )


def _configs(operation: Operation) -> Any:
    def rule(
        verdict: Verdict, request: Any, response_cls: type, decide: Check, topic_name: Callable[[Any], str]
    ) -> None:
        response_field = "results" if has_field(response_cls, "results") else "responses"

        def refusal(entry: Any) -> ErrorCode | None:
            resource = _CONFIG_RESOURCES.get(int(entry.resource_type))
            if resource is None:  # brokers, broker loggers, client metrics: the cluster's
                return None if decide(operation, Res.CLUSTER, CLUSTER_NAME) else CLUSTER_DENIED
            return None if decide(operation, resource[0], str(entry.resource_name)) else resource[1]

        verdict.request = _entries(verdict, request, "resources", response_cls, response_field, refusal)

    return rule


def _init_producer_id(
    verdict: Verdict, request: Any, response_cls: type, decide: Check, topic_name: Callable[[Any], str]
) -> None:
    transactional_id = request.transactional_id
    if transactional_id is not None:
        if not decide(Op.WRITE, Res.TRANSACTIONAL_ID, str(transactional_id)):
            verdict.error = TXN_DENIED
        return
    # Idempotence: IDEMPOTENT_WRITE on the cluster, or WRITE on some topic or transactional id (KIP-679).
    if decide.decide(Op.IDEMPOTENT_WRITE, Res.CLUSTER, CLUSTER_NAME):
        return
    if decide.decide_any(Op.WRITE, Res.TOPIC) or decide.decide_any(Op.WRITE, Res.TRANSACTIONAL_ID):
        return
    decide.denied.append(Denial(Op.IDEMPOTENT_WRITE, Res.CLUSTER, CLUSTER_NAME))
    verdict.error = CLUSTER_DENIED


def _add_partitions_to_txn(
    verdict: Verdict, request: Any, response_cls: type, decide: Check, topic_name: Callable[[Any], str]
) -> None:
    if has_field(type(request), "transactions"):  # v4+: several transactions, all or nothing here
        for transaction in request.transactions:
            if not decide(Op.WRITE, Res.TRANSACTIONAL_ID, str(transaction.transactional_id)):
                verdict.error = TXN_DENIED
                return
            for topic in transaction.topics:
                if not decide(Op.WRITE, Res.TOPIC, str(topic.name)):
                    verdict.error = TOPIC_DENIED
                    return
        return
    if not decide(Op.WRITE, Res.TRANSACTIONAL_ID, str(request.v3_and_below_transactional_id)):
        verdict.error = TXN_DENIED
        return
    topics = request.v3_and_below_topics
    denied = {str(t.name) for t in topics if not decide(Op.WRITE, Res.TOPIC, str(t.name))}
    if not denied:
        return
    # Kafka fails the whole request: the denied topics with TOPIC_AUTHORIZATION_FAILED, the others
    # with OPERATION_NOT_ATTEMPTED.
    result_cls = nested(response_cls, "results_by_topic_v3_and_below")
    for topic in topics:
        error_code = TOPIC_DENIED if str(topic.name) in denied else ErrorCode.operation_not_attempted
        verdict.extra.append(("results_by_topic_v3_and_below", error_entry(result_cls, topic, error_code)))
    verdict.request = None


def _consumer_group_heartbeat(
    verdict: Verdict, request: Any, response_cls: type, decide: Check, topic_name: Callable[[Any], str]
) -> None:
    if not decide(Op.READ, Res.GROUP, str(request.group_id)):
        verdict.error = GROUP_DENIED
        return
    for name in request.subscribed_topic_names or ():
        if not decide(Op.DESCRIBE, Res.TOPIC, str(name)):
            verdict.error = TOPIC_DENIED
            return


_SPECIAL: dict[int, Callable[[Verdict, Any, type, Check, Callable[[Any], str]], None]] = {
    ApiKey.FETCH: _fetch,
    ApiKey.METADATA: _metadata,
    ApiKey.OFFSET_FETCH: _offset_fetch,
    ApiKey.FIND_COORDINATOR: _find_coordinator,
    ApiKey.LIST_GROUPS: _list_filtered,
    ApiKey.LIST_TRANSACTIONS: _list_filtered,
    ApiKey.CREATE_TOPICS: _create_topics,
    ApiKey.DELETE_TOPICS: _delete_topics,
    ApiKey.DESCRIBE_CONFIGS: _configs(Op.DESCRIBE_CONFIGS),
    ApiKey.ALTER_CONFIGS: _configs(Op.ALTER_CONFIGS),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: _configs(Op.ALTER_CONFIGS),
    ApiKey.INIT_PRODUCER_ID: _init_producer_id,
    ApiKey.ADD_PARTITIONS_TO_TXN: _add_partitions_to_txn,
    ApiKey.CONSUMER_GROUP_HEARTBEAT: _consumer_group_heartbeat,
}

# -- responses -------------------------------------------------------------------------------------

# Bits of the authorized-operations fields (Metadata, DescribeGroups...): 1 << operation code.
_TOPIC_OPERATIONS = (
    Op.READ,
    Op.WRITE,
    Op.CREATE,
    Op.DELETE,
    Op.ALTER,
    Op.DESCRIBE,
    Op.DESCRIBE_CONFIGS,
    Op.ALTER_CONFIGS,
)
_CLUSTER_OPERATIONS_BITS = (
    Op.CREATE,
    Op.ALTER,
    Op.DESCRIBE,
    Op.CLUSTER_ACTION,
    Op.DESCRIBE_CONFIGS,
    Op.ALTER_CONFIGS,
    Op.IDEMPOTENT_WRITE,
)
_NOT_REQUESTED = -(2**31)


def authorized_operations(decide: Decide, resource_type: ResourceType, name: str) -> int:
    """The bit set Kafka answers for ``include_*_authorized_operations``."""
    operations = _CLUSTER_OPERATIONS_BITS if resource_type == Res.CLUSTER else _TOPIC_OPERATIONS
    bits = 0
    for operation in operations:
        if decide(operation, resource_type, name):
            bits |= 1 << operation
    return bits


def filter_response(api_key: int, request: Any, response: Any, decide: Decide) -> Any:
    """The response without what the principal may not describe (see the module docstring), with the
    authorized-operations bit sets it asked for computed from the gateway's ACLs."""
    if api_key == ApiKey.METADATA:
        return _metadata_response(request, response, decide)
    if api_key == ApiKey.LIST_GROUPS:
        if decide(Op.DESCRIBE, Res.CLUSTER, CLUSTER_NAME):
            return response
        groups = tuple(g for g in response.groups if decide(Op.DESCRIBE, Res.GROUP, str(g.group_id)))
        return response if len(groups) == len(response.groups) else replace(response, groups=groups)
    if api_key == ApiKey.LIST_TRANSACTIONS:
        states = tuple(
            s for s in response.transaction_states if decide(Op.DESCRIBE, Res.TRANSACTIONAL_ID, str(s.transactional_id))
        )
        return (
            response
            if len(states) == len(response.transaction_states)
            else replace(response, transaction_states=states)
        )
    if api_key == ApiKey.OFFSET_FETCH:
        return _offset_fetch_response(response, decide)
    return response


def _describable(topics: tuple[Any, ...], decide: Decide) -> tuple[Any, ...]:
    return tuple(t for t in topics if decide(Op.DESCRIBE, Res.TOPIC, str(t.name)))


def _offset_fetch_response(response: Any, decide: Decide) -> Any:
    if not has_field(type(response), "groups"):
        topics = _describable(response.topics, decide)
        return response if len(topics) == len(response.topics) else replace(response, topics=topics)
    groups = []
    changed = False
    for group in response.groups:
        topics = _describable(group.topics, decide)
        if len(topics) != len(group.topics):
            group = replace(group, topics=topics)
            changed = True
        groups.append(group)
    return replace(response, groups=tuple(groups)) if changed else response


def _metadata_response(request: Any, response: Any, decide: Decide) -> Any:
    with_operations = getattr(request, "include_topic_authorized_operations", False)
    asked = None if request.topics is None else {str(t.name) for t in request.topics if getattr(t, "name", None)}
    topic_cls = nested(type(response), "topics")
    topics = []
    changed = False
    for topic in response.topics:
        name = "" if topic.name is None else str(topic.name)
        if topic.error_code == TOPIC_DENIED or decide(Op.DESCRIBE, Res.TOPIC, name):
            if with_operations and topic.error_code != TOPIC_DENIED:
                topic = replace(topic, topic_authorized_operations=authorized_operations(decide, Res.TOPIC, name))
                changed = True
            topics.append(topic)
        elif asked is None or name not in asked:
            changed = True  # not asked for by name (all topics, or by id): left out
        else:
            ids = {"topic_id": topic.topic_id} if has_field(topic_cls, "topic_id") else {}
            topics.append(build(topic_cls, name=topic.name, error_code=TOPIC_DENIED, **ids))
            changed = True
    if changed:
        response = replace(response, topics=tuple(topics))
    if getattr(request, "include_cluster_authorized_operations", False) and has_field(
        type(response), "cluster_authorized_operations"
    ):
        response = replace(
            response, cluster_authorized_operations=authorized_operations(decide, Res.CLUSTER, CLUSTER_NAME)
        )
    return response
