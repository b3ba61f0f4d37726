"""Kafka ACLs and the rules Kafka's authorizer decides them by, indexed for the per-request path.

The rules (Kafka's ``AclAuthorizer`` and ``StandardAuthorizer`` agree on them):

* an ACL applies to a principal when it names it (``User:alice``) or names every user (``User:*``),
  and to a client host when it names that address or ``*``;
* it applies to a resource of its type when its pattern is LITERAL and names the resource or is
  ``*``, or is PREFIXED and the resource's name starts with it;
* it applies to an operation when it names it or ALL; an ALLOW of READ, WRITE, DELETE or ALTER also
  allows DESCRIBE, and an ALLOW of ALTER_CONFIGS allows DESCRIBE_CONFIGS (a DENY implies nothing);
* super users are allowed everything; otherwise any applicable DENY denies, else any applicable
  ALLOW allows, else the request is denied (no ACL, no access).

:class:`Acls` answers one decision from a few dict lookups (ACLs by resource type, name and principal,
prefixes by length); :class:`Authorizer` adds super users and remembers decisions, as a client asks
the same question on every request.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kanal.protocol.acl_codes import (
    CLUSTER_NAME,
    WILDCARD,
    WILDCARD_PRINCIPAL,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)

__all__ = [
    "CLUSTER_NAME",
    "WILDCARD",
    "WILDCARD_PRINCIPAL",
    "AclBinding",
    "AclFilter",
    "Acls",
    "Authorizer",
    "Operation",
    "PatternType",
    "Permission",
    "ResourceType",
    "user_principal",
]


_ANY_HOST = "*"

# The operations an ALLOW of which also allows the key (Kafka's implied operations).
_ALLOWED_BY: dict[Operation, tuple[Operation, ...]] = {
    Operation.DESCRIBE: (Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER),
    Operation.DESCRIBE_CONFIGS: (Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS),
}


def user_principal(name: str) -> str:
    """``alice`` -> ``User:alice`` (a name that already has a type is kept)."""
    return name if name.startswith("User:") else f"User:{name}"


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL: a resource pattern and an access control entry."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    def problem(self) -> str | None:
        """Why this ACL cannot be stored (what Kafka refuses with INVALID_REQUEST), or None."""
        if self.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
            return f"resource type {self.resource_type.name} is not allowed in an ACL"
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            return f"pattern type {self.pattern_type.name} is not allowed in an ACL"
        if self.operation in (Operation.UNKNOWN, Operation.ANY):
            return f"operation {self.operation.name} is not allowed in an ACL"
        if self.permission not in (Permission.ALLOW, Permission.DENY):
            return f"permission type {self.permission.name} is not allowed in an ACL"
        if not self.resource_name:
            return "the resource name must not be empty"
        if self.resource_type == ResourceType.CLUSTER and (
            self.pattern_type != PatternType.LITERAL or self.resource_name != CLUSTER_NAME
        ):
            return f"a CLUSTER ACL must name the LITERAL resource {CLUSTER_NAME!r}"
        kind, colon, name = self.principal.partition(":")
        if not colon or not kind or not name:
            return f"principal {self.principal!r} is not of the form Type:name"
        if not self.host:
            return "the host must not be empty (use '*' for any host)"
        return None


@dataclass(frozen=True, slots=True)
class AclFilter:
    """What DescribeAcls and DeleteAcls select: None (or ANY) for a field matches every value.

    With pattern type MATCH, the filter selects the ACLs that would apply to the named resource
    (LITERAL of that name or ``*``, PREFIXED of a prefix of it), as Kafka does."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: Operation = Operation.ANY
    permission: Permission = Permission.ANY

    def matches(self, acl: AclBinding) -> bool:
        if self.resource_type != ResourceType.ANY and acl.resource_type != self.resource_type:
            return False
        if not self._matches_pattern(acl):
            return False
        if self.principal is not None and acl.principal != self.principal:
            return False
        if self.host is not None and acl.host != self.host:
            return False
        if self.operation != Operation.ANY and acl.operation != self.operation:
            return False
        return self.permission == Permission.ANY or acl.permission == self.permission

    def _matches_pattern(self, acl: AclBinding) -> bool:
        name = self.resource_name
        if self.pattern_type == PatternType.MATCH:
            if name is None:
                return True
            if acl.pattern_type == PatternType.LITERAL:
                return acl.resource_name in (name, WILDCARD)
            return name.startswith(acl.resource_name)
        if self.pattern_type not in (PatternType.ANY, acl.pattern_type):
            return False
        return name is None or acl.resource_name == name


class Acls:
    """An immutable set of ACLs, indexed for :meth:`applies`."""

    __slots__ = ("_literal", "_prefix_lengths", "_prefixed", "bindings")

    def __init__(self, bindings: Iterable[AclBinding] = ()) -> None:
        self.bindings: tuple[AclBinding, ...] = tuple(dict.fromkeys(bindings))
        # (resource type, name) -> the ACLs of that LITERAL name (``*`` included as a name)
        self._literal: dict[tuple[ResourceType, str], list[AclBinding]] = {}
        self._prefixed: dict[tuple[ResourceType, str], list[AclBinding]] = {}
        lengths: dict[ResourceType, set[int]] = {}
        for acl in self.bindings:
            key = (acl.resource_type, acl.resource_name)
            if acl.pattern_type == PatternType.PREFIXED:
                self._prefixed.setdefault(key, []).append(acl)
                lengths.setdefault(acl.resource_type, set()).add(len(acl.resource_name))
            else:
                self._literal.setdefault(key, []).append(acl)
        self._prefix_lengths = {kind: sorted(found) for kind, found in lengths.items()}

    def __len__(self) -> int:
        return len(self.bindings)

    def for_resource(self, resource_type: ResourceType, name: str) -> list[AclBinding]:
        """The ACLs whose pattern matches the resource (of every principal, host and operation)."""
        found = list(self._literal.get((resource_type, name), ()))
        if name != WILDCARD:
            found += self._literal.get((resource_type, WILDCARD), ())
        for length in self._prefix_lengths.get(resource_type, ()):
            if length > len(name):
                break
            found += self._prefixed.get((resource_type, name[:length]), ())
        return found

    def allows(self, principal: str, host: str, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        """Kafka's decision for a principal that is not a super user (see the module docstring)."""
        allowed = False
        ops = _ALLOWED_BY.get(operation, (operation,))
        for acl in self.for_resource(resource_type, name):
            if acl.principal not in (principal, WILDCARD_PRINCIPAL) or acl.host not in (host, _ANY_HOST):
                continue
            if acl.permission == Permission.DENY:
                if acl.operation in (operation, Operation.ALL):
                    return False
            elif acl.operation == Operation.ALL or acl.operation in ops:
                allowed = True
        return allowed

    def allows_any(self, principal: str, host: str, operation: Operation, resource_type: ResourceType) -> bool:
        """Whether some resource of the type is allowed the operation (Kafka's
        ``authorizeByResourceType``: InitProducerId without a transactional id needs IDEMPOTENT_WRITE on
        the cluster or WRITE on some topic): an ALLOW of that operation (or ALL; nothing is implied here)
        that no DENY covers. A DENY covers a LITERAL ALLOW of the same name, or any ALLOW under a
        PREFIXED DENY; a LITERAL ``*`` DENY covers all."""
        denied_literal: set[str] = set()
        denied_prefixes: list[str] = []
        allowed: list[AclBinding] = []
        for acl in self.bindings:
            if acl.resource_type != resource_type:
                continue
            if acl.principal not in (principal, WILDCARD_PRINCIPAL) or acl.host not in (host, _ANY_HOST):
                continue
            if acl.permission == Permission.DENY:
                if acl.operation not in (operation, Operation.ALL):
                    continue
                if acl.pattern_type == PatternType.LITERAL:
                    if acl.resource_name == WILDCARD:
                        return False
                    denied_literal.add(acl.resource_name)
                else:
                    denied_prefixes.append(acl.resource_name)
            elif acl.operation in (operation, Operation.ALL):
                allowed.append(acl)
        for acl in allowed:
            if any(acl.resource_name.startswith(prefix) for prefix in denied_prefixes):
                continue
            if acl.pattern_type == PatternType.LITERAL and acl.resource_name in denied_literal:
                continue
            return True
        return False

    def matching(self, selector: AclFilter) -> list[AclBinding]:
        return [acl for acl in self.bindings if selector.matches(acl)]


class Authorizer:
    """Decides requests for one ACL set and set of super users, remembering each decision."""

    __slots__ = ("_decisions", "acls", "super_users")

    _LIMIT = 100_000  # decisions remembered; past it the memory starts over

    def __init__(self, acls: Acls, super_users: Iterable[str] = ()) -> None:
        self.acls = acls
        self.super_users = frozenset(user_principal(user) for user in super_users)
        self._decisions: dict[tuple[str, str, Operation, ResourceType, str], bool] = {}

    def is_super_user(self, principal: str) -> bool:
        return principal in self.super_users

    def allows(self, principal: str, host: str, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        """Whether ``principal`` (``User:alice``) connecting from ``host`` may do ``operation`` on the resource."""
        key = (principal, host, operation, resource_type, name)
        decision = self._decisions.get(key)
        if decision is None:
            decision = principal in self.super_users or self.acls.allows(
                principal, host, operation, resource_type, name
            )
            if len(self._decisions) >= self._LIMIT:
                self._decisions.clear()
            self._decisions[key] = decision
        return decision

    def allows_any(self, principal: str, host: str, operation: Operation, resource_type: ResourceType) -> bool:
        return principal in self.super_users or self.acls.allows_any(principal, host, operation, resource_type)
