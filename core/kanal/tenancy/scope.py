"""Which APIs a virtual cluster renames, passes, refuses, or leaves to the gateway's ACLs.

Every API a client sends inside a virtual cluster gets one :class:`Disposition`:

* ``RENAME``: its topic names, group ids or transactional ids are scoped both ways
  (:func:`kanal.tenancy.rewrite.to_physical` / ``to_logical``).
* ``PASS``: it names nothing of the cluster and is forwarded as it is.
* ``ACL``: DescribeAcls, CreateAcls, DeleteAcls are answered by the gateway from its own ACL store,
  never forwarded: the physical cluster's ACLs are the operator's, not the tenant's.
* ``REFUSE``: everything else. Foremost :data:`REFUSED_APIS`: APIs that act on the physical cluster
  as a whole (replica placement, log directories, quotas, SCRAM credentials, delegation tokens,
  features, the KRaft quorum) and cannot be scoped to a tenant's names, since what they change or
  show is shared by every tenant. Also refused, by default: APIs the gateway cannot scope yet
  (share groups, streams groups, which name groups and topics but are not renamed) and the
  broker-to-broker and controller APIs no client sends. Failing closed means an API added to Kafka
  later is refused until someone decides how to scope it.

Topic ids are not scoped (see :mod:`kanal.tenancy.apis`): a client that knows another tenant's topic
id can name it in the id-based versions of Produce, Fetch, DeleteTopics and the offset APIs.
Responses never show other tenants' names or ids, which keeps such ids from being learnt here.
"""

from __future__ import annotations

from enum import Enum
from typing import Final

from kanal.protocol import acl_codes
from kanal.tenancy.apis import NAMES, api_keys


class Disposition(Enum):
    RENAME = "rename"
    PASS = "pass"
    ACL = "acl"
    REFUSE = "refuse"


#: APIs whose names are scoped both ways.
RENAMED_APIS: Final = frozenset(NAMES)

#: APIs that name nothing of the cluster: version negotiation, authentication, the cluster's
#: brokers (their addresses are rewritten elsewhere), client telemetry.
PASSED_APIS: Final = api_keys(
    "api_versions",
    "sasl_handshake",
    "sasl_authenticate",
    "describe_cluster",
    "get_telemetry_subscriptions",
    "push_telemetry",
)

#: The ACL APIs: answered by the gateway (its own ACL store), not forwarded and not renamed here.
ACL_APIS: Final = acl_codes.ACL_APIS

#: APIs clients send that act on the physical cluster as a whole: refused in a virtual cluster.
REFUSED_APIS: Final = api_keys(
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
    "describe_quorum",
    "add_raft_voter",
    "remove_raft_voter",
    "unregister_broker",
    "list_config_resources",  # every config resource of the cluster (could later be filtered)
)


def disposition(api_key: int) -> Disposition:
    """What a virtual cluster does with requests of this API."""
    if api_key in RENAMED_APIS:
        return Disposition.RENAME
    if api_key in PASSED_APIS:
        return Disposition.PASS
    if api_key in ACL_APIS:
        return Disposition.ACL
    return Disposition.REFUSE
