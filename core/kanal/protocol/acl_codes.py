"""Kafka's ACL vocabulary with its wire codes (CreateAcls, DescribeAcls, DeleteAcls and the
authorized-operations bit sets of Metadata and DescribeGroups carry these numbers)."""

from __future__ import annotations

from enum import IntEnum

from kanal.protocol.api import ApiKey

__all__ = [
    "ACL_APIS",
    "CLUSTER_NAME",
    "WILDCARD",
    "WILDCARD_PRINCIPAL",
    "Operation",
    "PatternType",
    "Permission",
    "ResourceType",
]


class ResourceType(IntEnum):
    """Kafka's resource types, with their wire codes."""

    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(IntEnum):
    """How an ACL's resource name matches: LITERAL and PREFIXED in ACLs; ANY and MATCH only in filters."""

    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(IntEnum):
    """Kafka's ACL operations, with their wire codes (ANY only in filters)."""

    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14
    TWO_PHASE_COMMIT = 15


class Permission(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


#: The one CLUSTER resource's name.
CLUSTER_NAME = "kafka-cluster"
#: A LITERAL resource name matching every resource of its type.
WILDCARD = "*"
#: The principal of an ACL for every user.
WILDCARD_PRINCIPAL = "User:*"

#: The Kafka Admin API's ACL APIs: answered by the gateway where it enforces ACLs, never forwarded
#: from a virtual cluster.
ACL_APIS = frozenset({ApiKey.DESCRIBE_ACLS, ApiKey.CREATE_ACLS, ApiKey.DELETE_ACLS})
