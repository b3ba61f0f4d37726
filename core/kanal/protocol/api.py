"""What the gateway knows about each Kafka API: names, versions, header versions.

Everything here is looked up once per (api key, version) and cached, because kio's own lookups
cost microseconds and sit on the per-frame path.
"""

from __future__ import annotations

from enum import IntEnum
from functools import cache
from typing import Any

from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema, load_response_schema
from kio.schema.index import api_key_map, schema_name_map


class ApiKey(IntEnum):
    """The API keys the core and first-party plugins refer to by name."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    ALTER_REPLICA_LOG_DIRS = 34
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    INCREMENTAL_ALTER_CONFIGS = 44
    ALTER_PARTITION_REASSIGNMENTS = 45
    LIST_PARTITION_REASSIGNMENTS = 46
    OFFSET_DELETE = 47
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    DESCRIBE_QUORUM = 55
    UPDATE_FEATURES = 57
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69
    GET_TELEMETRY_SUBSCRIPTIONS = 71
    PUSH_TELEMETRY = 72
    DESCRIBE_TOPIC_PARTITIONS = 75


def api_name(api_key: int) -> str:
    """The Kafka name of an API key (``Produce``), or ``Unknown(<key>)``."""
    name = api_key_map.get(api_key)
    if name is None:
        return f"Unknown({api_key})"
    return "".join(part.capitalize() for part in str(name).split("_"))


@cache
def supported_versions(api_key: int) -> tuple[int, int] | None:
    """The (min, max) versions the gateway can decode for an API key, or None."""
    name = api_key_map.get(api_key)
    if name is None:
        return None
    versions = sorted(schema_name_map[name])
    return versions[0], versions[-1]


@cache
def request_class(api_key: int, version: int) -> Any | None:
    """The kio request class for (api key, version), or None when kio does not know it."""
    try:
        return load_request_schema(api_key, version)
    except (UnknownAPIKey, UnknownEntity):
        return None


@cache
def response_class(api_key: int, version: int) -> Any | None:
    """The kio response class for (api key, version), or None when kio does not know it."""
    try:
        return load_response_schema(api_key, version)
    except (UnknownAPIKey, UnknownEntity):
        return None


def require_request_class(api_key: int, version: int) -> Any:
    """The kio request class, for the gateway's own requests (whose versions it chooses)."""
    cls = request_class(api_key, version)
    if cls is None:
        raise LookupError(f"no request schema for api key {api_key} version {version}")
    return cls


@cache
def request_header_version(api_key: int, version: int) -> int:
    """Request header version: 2 for flexible versions, 1 otherwise (0 only for ControlledShutdown v0)."""
    if api_key == 7 and version == 0:
        return 0
    cls = request_class(api_key, version)
    if cls is None:
        return 1
    return int(cls.__header_schema__.__version__)


@cache
def response_header_version(api_key: int, version: int) -> int:
    """Response header version: 1 for flexible versions, 0 otherwise; ApiVersions is always 0."""
    cls = response_class(api_key, version)
    if cls is None:
        return 0
    return int(cls.__header_schema__.__version__)


def produce_expects_response(acks: int) -> bool:
    """Produce with acks=0 gets no response at all from the broker."""
    return acks != 0


# APIs on every client's path: their schemas are loaded at startup, not on a first request.
HOT_APIS = (
    ApiKey.PRODUCE,
    ApiKey.FETCH,
    ApiKey.LIST_OFFSETS,
    ApiKey.METADATA,
    ApiKey.OFFSET_COMMIT,
    ApiKey.OFFSET_FETCH,
    ApiKey.FIND_COORDINATOR,
    ApiKey.JOIN_GROUP,
    ApiKey.HEARTBEAT,
    ApiKey.SYNC_GROUP,
    ApiKey.API_VERSIONS,
)


def preload(upstream_versions: dict[int, tuple[int, int]], api_keys: tuple[int, ...] = HOT_APIS) -> int:
    """Imports the kio schemas of the version clients will pick for these APIs (the highest both
    the gateway and the upstream speak); returns how many were loaded.

    kio imports a schema module on first use, which stalls the event loop for tens of
    milliseconds: a gateway pays that once at startup instead of on a client's first requests.
    """
    loaded = 0
    for key in api_keys:
        ours = supported_versions(key)
        theirs = upstream_versions.get(key)
        if ours is None or theirs is None or max(ours[0], theirs[0]) > min(ours[1], theirs[1]):
            continue
        version = min(ours[1], theirs[1])
        loaded += request_class(key, version) is not None
        loaded += response_class(key, version) is not None
    return loaded
