"""The gateway's ACL decisions against Kafka's documented authorizer rules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kanal.authz.acl import (
    AclBinding,
    AclFilter,
    Acls,
    Authorizer,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    user_principal,
)

TOPIC, GROUP, CLUSTER, TXN = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY
Op = Operation
ALICE = "User:alice"
HOST = "10.0.0.1"


def acl(
    operation: Operation,
    name: str = "orders",
    *,
    kind: ResourceType = TOPIC,
    pattern: PatternType = LITERAL,
    principal: str = ALICE,
    host: str = "*",
    permission: Permission = ALLOW,
) -> AclBinding:
    return AclBinding(kind, name, pattern, principal, host, operation, permission)


# (why, ACLs, operation, resource type, resource name, decision) for User:alice from 10.0.0.1
CASES = [
    ("no ACL: denied", [], Op.READ, TOPIC, "orders", False),
    ("a LITERAL ALLOW of the name", [acl(Op.READ)], Op.READ, TOPIC, "orders", True),
    ("LITERAL names match exactly", [acl(Op.READ)], Op.READ, TOPIC, "orders2", False),
    ("LITERAL names are case-sensitive", [acl(Op.READ)], Op.READ, TOPIC, "Orders", False),
    ("the LITERAL name * matches every name", [acl(Op.READ, "*")], Op.READ, TOPIC, "anything", True),
    ("a PREFIXED ALLOW", [acl(Op.READ, "ord", pattern=PREFIXED)], Op.READ, TOPIC, "orders", True),
    (
        "a PREFIXED pattern is a prefix, not a substring",
        [acl(Op.READ, "ders", pattern=PREFIXED)],
        Op.READ,
        TOPIC,
        "orders",
        False,
    ),
    (
        "a PREFIXED * is the character *, not a wildcard",
        [acl(Op.READ, "*", pattern=PREFIXED)],
        Op.READ,
        TOPIC,
        "orders",
        False,
    ),
    (
        "a PREFIXED pattern matches its own name",
        [acl(Op.READ, "orders", pattern=PREFIXED)],
        Op.READ,
        TOPIC,
        "orders",
        True,
    ),
    ("another resource type does not apply", [acl(Op.READ, kind=GROUP)], Op.READ, TOPIC, "orders", False),
    ("another principal does not apply", [acl(Op.READ, principal="User:bob")], Op.READ, TOPIC, "orders", False),
    ("User:* applies to every user", [acl(Op.READ, principal="User:*")], Op.READ, TOPIC, "orders", True),
    ("an ACL for the client's host", [acl(Op.READ, host=HOST)], Op.READ, TOPIC, "orders", True),
    ("an ACL for another host does not apply", [acl(Op.READ, host="10.0.0.2")], Op.READ, TOPIC, "orders", False),
    ("another operation does not apply", [acl(Op.WRITE)], Op.READ, TOPIC, "orders", False),
    ("ALL allows every operation", [acl(Op.ALL)], Op.DELETE, TOPIC, "orders", True),
    ("READ implies DESCRIBE", [acl(Op.READ)], Op.DESCRIBE, TOPIC, "orders", True),
    ("WRITE implies DESCRIBE", [acl(Op.WRITE)], Op.DESCRIBE, TOPIC, "orders", True),
    ("DELETE implies DESCRIBE", [acl(Op.DELETE)], Op.DESCRIBE, TOPIC, "orders", True),
    ("ALTER implies DESCRIBE", [acl(Op.ALTER)], Op.DESCRIBE, TOPIC, "orders", True),
    ("CREATE does not imply DESCRIBE", [acl(Op.CREATE)], Op.DESCRIBE, TOPIC, "orders", False),
    ("DESCRIBE does not imply READ", [acl(Op.DESCRIBE)], Op.READ, TOPIC, "orders", False),
    ("ALTER_CONFIGS implies DESCRIBE_CONFIGS", [acl(Op.ALTER_CONFIGS)], Op.DESCRIBE_CONFIGS, TOPIC, "orders", True),
    (
        "DESCRIBE_CONFIGS does not imply ALTER_CONFIGS",
        [acl(Op.DESCRIBE_CONFIGS)],
        Op.ALTER_CONFIGS,
        TOPIC,
        "orders",
        False,
    ),
    ("ALTER does not imply ALTER_CONFIGS", [acl(Op.ALTER)], Op.ALTER_CONFIGS, TOPIC, "orders", False),
    ("DENY beats ALLOW", [acl(Op.READ), acl(Op.READ, permission=DENY)], Op.READ, TOPIC, "orders", False),
    (
        "a PREFIXED DENY beats a LITERAL ALLOW",
        [acl(Op.READ), acl(Op.READ, "ord", pattern=PREFIXED, permission=DENY)],
        Op.READ,
        TOPIC,
        "orders",
        False,
    ),
    (
        "a DENY for every user beats the user's ALLOW",
        [acl(Op.READ), acl(Op.READ, principal="User:*", permission=DENY)],
        Op.READ,
        TOPIC,
        "orders",
        False,
    ),
    (
        "a DENY of ALL denies every operation",
        [acl(Op.READ), acl(Op.ALL, permission=DENY)],
        Op.READ,
        TOPIC,
        "orders",
        False,
    ),
    (
        "a DENY of READ does not deny DESCRIBE",
        [acl(Op.READ), acl(Op.READ, permission=DENY)],
        Op.DESCRIBE,
        TOPIC,
        "orders",
        True,
    ),
    (
        "a DENY of DESCRIBE does not deny READ",
        [acl(Op.READ), acl(Op.DESCRIBE, permission=DENY)],
        Op.READ,
        TOPIC,
        "orders",
        True,
    ),
    (
        "a DENY for another host does not apply",
        [acl(Op.READ), acl(Op.READ, host="10.0.0.2", permission=DENY)],
        Op.READ,
        TOPIC,
        "orders",
        True,
    ),
    ("a lone DENY denies", [acl(Op.READ, "other", permission=DENY)], Op.READ, TOPIC, "orders", False),
    ("group READ", [acl(Op.READ, "app", kind=GROUP)], Op.READ, GROUP, "app", True),
    ("transactional id WRITE", [acl(Op.WRITE, "tx-", kind=TXN, pattern=PREFIXED)], Op.WRITE, TXN, "tx-1", True),
    ("cluster CREATE", [acl(Op.CREATE, "kafka-cluster", kind=CLUSTER)], Op.CREATE, CLUSTER, "kafka-cluster", True),
    (
        "cluster IDEMPOTENT_WRITE",
        [acl(Op.IDEMPOTENT_WRITE, "kafka-cluster", kind=CLUSTER)],
        Op.IDEMPOTENT_WRITE,
        CLUSTER,
        "kafka-cluster",
        True,
    ),
]


@pytest.mark.parametrize(("why", "acls", "operation", "kind", "name", "expected"), CASES, ids=[c[0] for c in CASES])
def test_kafka_rules(
    why: str, acls: list[AclBinding], operation: Operation, kind: ResourceType, name: str, expected: bool
) -> None:
    assert Authorizer(Acls(acls)).allows(ALICE, HOST, operation, kind, name) is expected


def test_super_users_are_allowed_everything_even_when_denied() -> None:
    authorizer = Authorizer(Acls([acl(Op.ALL, "*", principal="User:*", permission=DENY)]), super_users=["alice"])
    assert authorizer.allows(ALICE, HOST, Op.DELETE, TOPIC, "orders")
    assert not authorizer.allows("User:bob", HOST, Op.DESCRIBE, TOPIC, "orders")


def test_user_principal_adds_the_type_once() -> None:
    assert user_principal("alice") == "User:alice"
    assert user_principal("User:alice") == "User:alice"


# (why, ACLs, decision) of "may alice WRITE some topic" (Kafka's authorizeByResourceType)
ANY_CASES = [
    ("no ACL", [], False),
    ("a LITERAL ALLOW", [acl(Op.WRITE)], True),
    ("ALL", [acl(Op.ALL, "x", pattern=PREFIXED)], True),
    ("READ does not count", [acl(Op.READ)], False),
    ("the same LITERAL denied", [acl(Op.WRITE), acl(Op.WRITE, permission=DENY)], False),
    ("another LITERAL denied", [acl(Op.WRITE), acl(Op.WRITE, "other", permission=DENY)], True),
    ("under a denied prefix", [acl(Op.WRITE), acl(Op.WRITE, "ord", pattern=PREFIXED, permission=DENY)], False),
    (
        "a prefix under a denied prefix",
        [acl(Op.WRITE, "orders-", pattern=PREFIXED), acl(Op.WRITE, "ord", pattern=PREFIXED, permission=DENY)],
        False,
    ),
    (
        "a prefix beside a denied literal",
        [acl(Op.WRITE, "ord", pattern=PREFIXED), acl(Op.WRITE, "orders", permission=DENY)],
        True,
    ),
    ("everything denied", [acl(Op.WRITE), acl(Op.WRITE, "*", principal="User:*", permission=DENY)], False),
    ("another host", [acl(Op.WRITE, host="10.0.0.2")], False),
]


@pytest.mark.parametrize(("why", "acls", "expected"), ANY_CASES, ids=[c[0] for c in ANY_CASES])
def test_allows_any(why: str, acls: list[AclBinding], expected: bool) -> None:
    assert Authorizer(Acls(acls)).allows_any(ALICE, HOST, Op.WRITE, TOPIC) is expected


def test_filters_select_as_kafka_describe_and_delete_do() -> None:
    acls = Acls(
        [
            acl(Op.READ),
            acl(Op.WRITE, "*"),
            acl(Op.READ, "ord", pattern=PREFIXED),
            acl(Op.READ, "app", kind=GROUP, principal="User:bob"),
        ]
    )
    assert acls.matching(AclFilter()) == list(acls.bindings)
    assert acls.matching(AclFilter(resource_type=GROUP)) == [acls.bindings[3]]
    assert acls.matching(AclFilter(resource_name="orders")) == [acls.bindings[0]]
    assert acls.matching(AclFilter(resource_name="orders", pattern_type=PatternType.MATCH)) == list(acls.bindings[:3])
    assert acls.matching(AclFilter(pattern_type=PREFIXED)) == [acls.bindings[2]]
    assert acls.matching(AclFilter(principal="User:bob", operation=Op.READ)) == [acls.bindings[3]]
    assert acls.matching(AclFilter(permission=DENY)) == []


def test_bindings_kafka_refuses() -> None:
    assert acl(Op.READ).problem() is None
    assert "pattern type MATCH" in (acl(Op.READ, pattern=PatternType.MATCH).problem() or "")
    assert "operation ANY" in (acl(Op.ANY).problem() or "")
    assert "kafka-cluster" in (acl(Op.ALTER, "other", kind=CLUSTER).problem() or "")
    assert "Type:name" in (acl(Op.READ, principal="alice").problem() or "")


# -- against a reference -------------------------------------------------------------------------


def reference_allows(
    acls: list[AclBinding],
    super_users: set[str],
    principal: str,
    host: str,
    op: Operation,
    kind: ResourceType,
    name: str,
) -> bool:
    """Kafka's rules as the documentation states them, one ACL at a time."""
    if principal in super_users:
        return True

    def applies(a: AclBinding) -> bool:
        if a.resource_type != kind or a.principal not in (principal, "User:*") or a.host not in (host, "*"):
            return False
        if a.pattern_type == LITERAL:
            return a.resource_name in (name, "*")
        return name.startswith(a.resource_name)

    relevant = [a for a in acls if applies(a)]
    if any(a.permission == DENY and a.operation in (op, Op.ALL) for a in relevant):
        return False
    implied = {op}
    if op == Op.DESCRIBE:
        implied |= {Op.READ, Op.WRITE, Op.DELETE, Op.ALTER}
    if op == Op.DESCRIBE_CONFIGS:
        implied.add(Op.ALTER_CONFIGS)
    return any(a.permission == ALLOW and (a.operation == Op.ALL or a.operation in implied) for a in relevant)


NAMES = st.sampled_from(["*", "a", "ab", "abc", "b", "ba"])
PRINCIPALS = st.sampled_from(["User:alice", "User:bob", "User:*"])
HOSTS = st.sampled_from(["*", "10.0.0.1", "10.0.0.2"])
KINDS = st.sampled_from([TOPIC, GROUP, TXN])
OPERATIONS = st.sampled_from([op for op in Operation if op not in (Op.UNKNOWN, Op.ANY)])
BINDINGS = st.builds(
    AclBinding,
    KINDS,
    NAMES,
    st.sampled_from([LITERAL, PREFIXED]),
    PRINCIPALS,
    HOSTS,
    OPERATIONS,
    st.sampled_from([ALLOW, DENY]),
)
REQUESTS = st.tuples(
    st.sampled_from(["User:alice", "User:bob"]),
    st.sampled_from(["10.0.0.1", "10.0.0.2"]),
    OPERATIONS,
    KINDS,
    NAMES.filter(lambda n: n != "*"),
)


@settings(max_examples=400)
@given(
    acls=st.lists(BINDINGS, max_size=12),
    super_users=st.sets(st.sampled_from(["User:alice", "User:bob"]), max_size=1),
    requests=st.lists(REQUESTS, min_size=1, max_size=8),
)
def test_decisions_equal_the_reference(
    acls: list[AclBinding], super_users: set[str], requests: list[tuple[str, str, Operation, ResourceType, str]]
) -> None:
    authorizer = Authorizer(Acls(acls), super_users)
    for request in requests * 2:  # the second time from the remembered decisions
        assert authorizer.allows(*request) == reference_allows(acls, super_users, *request), request
