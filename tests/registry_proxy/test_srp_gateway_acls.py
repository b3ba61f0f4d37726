"""topic-acl with the hosting gateway's own ACLs (GATEWAY_ACL_ENABLED): one source of truth."""

from __future__ import annotations

import base64
import secrets

import trio
from kanal_registry_proxy.authorization import Authorization, GatewayAclMode

from kanal.admin.store import MemoryLog, ResourceStore
from kanal.api.resources import KindRegistry
from kanal.authz.acl import AclBinding
from kanal.config.settings import build_settings
from kanal.gateway import Gateway
from kanal.pipeline.registry import PluginRegistry
from kanal.protocol.acl_codes import Operation, PatternType, Permission, ResourceType


def _gateway(**env: str) -> Gateway:
    settings = build_settings(
        {
            "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9",
            "GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "GATEWAY_USER_POOL_SECRET_KEY": base64.b64encode(secrets.token_bytes(32)).decode(),
            **env,
        }
    )
    return Gateway(settings, PluginRegistry())


def _acl(principal: str, operation: Operation, name: str, permission: Permission = Permission.ALLOW) -> AclBinding:
    return AclBinding(ResourceType.TOPIC, name, PatternType.PREFIXED, principal, "*", operation, permission)


def test_plugins_see_the_acls_the_gateway_enforces_and_only_then() -> None:
    assert _gateway().services_for("registry-proxy").acls is None  # the cluster's own ACLs count
    gateway = _gateway(GATEWAY_ACL_ENABLED="true", GATEWAY_SUPER_USERS="ops")
    acls = gateway.services_for("registry-proxy").acls
    assert acls is not None
    kinds = KindRegistry()
    kinds.add(gateway.acls.kind)
    store = ResourceStore(kinds, MemoryLog())
    gateway.acls.writes = store  # (the gateway's own writes to its ACL topic, in memory here)
    mode = Authorization(GatewayAclMode(acls))
    stored = [
        _acl("User:alice", Operation.READ, "orders"),
        _acl("User:*", Operation.READ, "orders-secret", Permission.DENY),
    ]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)
            await gateway.acls.create(stored)
            assert await mode.check("alice", "Read", "orders-value")
            assert not await mode.check("alice", "Write", "orders-value")  # READ does not imply WRITE
            assert not await mode.check("alice", "Read", "orders-secret-value")  # DENY beats ALLOW
            assert not await mode.check("bob", "Read", "orders-value")  # no ACL, no access
            assert not await mode.check("alice", "Read", "com.acme.Order")  # no topic for the subject
            assert await mode.check("ops", "Write", "anything-value")  # a gateway super user
            nursery.cancel_scope.cancel()

    trio.run(main)
