"""Authorization: Read and Write per subject, decided by one of three modes; super users bypass all.

- ``reactive``: permissions of application instances received over Kafka
  (:mod:`kanal_registry_proxy.reactive`), applied live;
- ``topic-acl``: the backing cluster's topic ACLs (:mod:`kanal_registry_proxy.acl`), or, when the
  hosting gateway enforces ACLs itself (``GATEWAY_ACL_ENABLED``), the gateway's (one source of truth);
  the subject maps to its topic by the topic name strategy, and a subject that maps to no topic is denied;
- ``read-only``: every authenticated read passes, every write is denied; no Kafka connection.

``AUTHORIZATION_SUPER_USERS`` pass every check in every mode.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Literal, Protocol

import trio

from kanal.api import AclOperation, AclResourceType, GatewayAcls
from kanal_registry_proxy.acl import OP_READ, OP_WRITE, AclLookup, AclLookupError, decide, topic_of
from kanal_registry_proxy.metrics import ProxyMetrics
from kanal_registry_proxy.reactive import PermissionStore, ReactiveSync

log = logging.getLogger(__name__)

Permission = Literal["Read", "Write"]
READ: Permission = "Read"
WRITE: Permission = "Write"


class Mode(Protocol):
    name: str

    async def allowed(self, principal: str, permission: Permission, subject: str) -> bool: ...

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None: ...


class ReadOnlyMode:
    name = "read-only"

    async def allowed(self, principal: str, permission: Permission, subject: str) -> bool:
        return permission == READ

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()


class TopicAclMode:
    name = "topic-acl"

    def __init__(self, lookup: AclLookup) -> None:
        self.lookup = lookup

    async def allowed(self, principal: str, permission: Permission, subject: str) -> bool:
        topic = topic_of(subject)
        if topic is None:
            log.info("subject %r maps to no topic (topic name strategy): denied", subject)
            return False
        try:
            bindings = await self.lookup.bindings(topic)
        except AclLookupError as exc:
            log.warning("ACL lookup failed, denying: %s", exc, extra={"event": "acl_lookup_failed", "topic": topic})
            return False
        return decide(bindings, principal, topic, OP_READ if permission == READ else OP_WRITE)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # nothing to run: the Kafka client belongs to whoever gave it (see ProxyService.serve)
        task_status.started()


class GatewayAclMode:
    """topic-acl with the hosting gateway's ACLs: Kafka's rules as the gateway applies them to its
    clients, decided in memory (no lookups, nothing cached: a change applies at once)."""

    name = "topic-acl"

    def __init__(self, acls: GatewayAcls) -> None:
        self.acls = acls

    async def allowed(self, principal: str, permission: Permission, subject: str) -> bool:
        topic = topic_of(subject)
        if topic is None:
            log.info("subject %r maps to no topic (topic name strategy): denied", subject)
            return False
        operation = AclOperation.READ if permission == READ else AclOperation.WRITE
        return self.acls.allows(principal, operation, AclResourceType.TOPIC, topic)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()


class ReactiveMode:
    name = "reactive"

    def __init__(self, store: PermissionStore, sync: ReactiveSync | None) -> None:
        self.store = store
        self.sync = sync

    async def allowed(self, principal: str, permission: Permission, subject: str) -> bool:
        return self.store.allowed(principal, permission, subject)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self.sync is None:
            task_status.started()
            await trio.sleep_forever()
        else:
            await self.sync.run(task_status=task_status)


class Authorization:
    """One mode plus the super users, with every decision counted."""

    def __init__(self, mode: Mode, super_users: Iterable[str] = (), metrics: ProxyMetrics | None = None) -> None:
        self.mode = mode
        self.super_users = frozenset(super_users)
        self.metrics = metrics

    def is_super_user(self, principal: str) -> bool:
        return principal in self.super_users

    async def check(self, principal: str, permission: Permission, subject: str) -> bool:
        if principal in self.super_users:
            self._count(permission, "super_user")
            return True
        allowed = await self.mode.allowed(principal, permission, subject)
        self._count(permission, "allow" if allowed else "deny")
        return allowed

    async def check_any(self, principal: str, permission: Permission, subjects: Iterable[str]) -> bool:
        """Whether the principal has the permission on at least one of the subjects."""
        if principal in self.super_users:
            self._count(permission, "super_user")
            return True
        for subject in subjects:
            if await self.mode.allowed(principal, permission, subject):
                self._count(permission, "allow")
                return True
        self._count(permission, "deny")
        return False

    async def readable(self, principal: str, subjects: Iterable[str]) -> set[str]:
        """The subjects among ``subjects`` the principal may read (lookups run concurrently)."""
        unique = set(subjects)
        if principal in self.super_users:
            self._count(READ, "super_user")
            return unique
        result: set[str] = set()

        async def one(subject: str) -> None:
            if await self.mode.allowed(principal, READ, subject):
                result.add(subject)

        if len(unique) == 1 or not isinstance(self.mode, TopicAclMode):
            for subject in unique:
                await one(subject)
        else:
            async with trio.open_nursery() as nursery:
                for subject in unique:
                    nursery.start_soon(one, subject)
        self._count(READ, "filter")
        return result

    def _count(self, permission: str, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.authorized(self.mode.name, permission, outcome)
