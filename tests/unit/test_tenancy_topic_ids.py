"""A virtual cluster's own topic ids: distinct per virtual cluster, mapped back exactly, found in
every message that carries them, and the names its interceptors see."""

from __future__ import annotations

import uuid

import trio
from hypothesis import given
from hypothesis import strategies as st

from kanal.protocol.api import ApiKey, require_request_class, response_class
from kanal.protocol.entities import build, nested
from kanal.tenancy.names import VirtualNames
from kanal.tenancy.topic_ids import TenantTopicNames, VirtualTopicIds, carries_topic_ids, map_topic_ids
from kanal.testing import FakeTopicNames

ids = st.uuids(allow_nil=True)


@given(ids, st.text(min_size=1, max_size=20))
def test_a_virtual_id_maps_back_to_its_physical_id(physical: uuid.UUID, prefix: str) -> None:
    mapping = VirtualTopicIds(prefix)
    virtual = mapping.virtual(physical)
    assert mapping.physical(virtual) == physical
    assert (virtual == physical) == (physical.int == 0)  # only "no id" is shown as it is


@given(ids.filter(lambda u: u.int != 0))
def test_two_virtual_clusters_never_see_the_same_id_for_one_topic(physical: uuid.UUID) -> None:
    assert VirtualTopicIds("team-a.").virtual(physical) != VirtualTopicIds("team-b.").virtual(physical)


def test_every_topic_id_of_a_message_is_mapped_at_any_depth() -> None:
    mapping = VirtualTopicIds("team-a.")
    physical = uuid.UUID(int=42)
    fetch_cls = require_request_class(ApiKey.FETCH, 13)
    topic_cls = nested(fetch_cls, "topics")
    forgotten_cls = nested(fetch_cls, "forgotten_topics_data")
    request = build(
        fetch_cls,
        topics=(build(topic_cls, topic_id=physical, partitions=()),),
        forgotten_topics_data=(build(forgotten_cls, topic_id=physical, partitions=(0,)),),
    )
    mapped = map_topic_ids(request, mapping.virtual)
    assert [t.topic_id for t in mapped.topics] == [mapping.virtual(physical)]
    assert [t.topic_id for t in mapped.forgotten_topics_data] == [mapping.virtual(physical)]
    assert map_topic_ids(mapped, mapping.physical) == request
    heartbeat = response_class(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0)
    assert heartbeat is not None and carries_topic_ids(heartbeat)  # the KIP-848 assignment
    assert not carries_topic_ids(require_request_class(ApiKey.FETCH, 12))  # names only
    unchanged = build(fetch_cls, topics=())
    assert map_topic_ids(unchanged, mapping.virtual) is unchanged


def test_interceptors_of_a_virtual_cluster_see_its_names_and_ids() -> None:
    physical = uuid.UUID(int=7)
    base = FakeTopicNames({physical: "team-a.orders", uuid.UUID(int=8): "team-b.orders"})
    mapping = VirtualTopicIds("team-a.")
    names = TenantTopicNames(base, VirtualNames("team-a."), mapping)
    virtual = mapping.virtual(physical)
    assert names.name(virtual) == "orders" and names.id("orders") == virtual
    assert names.name(physical) is None  # the physical id is nobody's in the virtual cluster
    assert names.name(mapping.virtual(uuid.UUID(int=8))) is None  # another tenant's topic
    assert trio.run(names.resolve, virtual) == "orders"
    foreign = mapping.virtual(uuid.UUID(int=8))
    assert trio.run(names.resolve, foreign) == str(foreign)
    without_ids = TenantTopicNames(base, VirtualNames("team-a."), None)
    assert without_ids.name(physical) == "orders" and without_ids.id("orders") == physical


def test_an_alias_topic_has_an_id_of_its_own_that_leads_to_its_physical_topic() -> None:
    shared, own = uuid.UUID(int=11), uuid.UUID(int=12)
    base = FakeTopicNames({shared: "shared.orders", own: "team-a.payments"})
    aliases = {"orders": "shared.orders", "old-payments": "team-a.payments"}
    mapping = VirtualTopicIds("team-a.", aliases, base.name)
    names = TenantTopicNames(base, VirtualNames("team-a.", aliases), mapping)
    orders, old = mapping.virtual(shared, "orders"), mapping.virtual(own, "old-payments")
    assert len({orders, old, mapping.virtual(shared), mapping.virtual(own), shared, own}) == 6
    assert mapping.resolve(orders) == (shared, "orders") and mapping.resolve(old) == (own, "old-payments")
    assert mapping.resolve(mapping.virtual(own)) == (own, None)  # the topic's own id stays its own
    assert names.name(orders) == "orders" and names.id("orders") == orders
    assert names.name(old) == "old-payments" and names.name(mapping.virtual(own)) == "payments"
    assert trio.run(names.resolve, orders) == "orders"
    forgetful = VirtualTopicIds("team-a.", aliases)  # the cache has not seen the physical topic yet
    assert forgetful.resolve(orders)[1] is None  # not taken for the alias: the cluster says unknown
