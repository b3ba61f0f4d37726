"""Topic-id support is a preview, off by default: describing or deleting a topic by id is answered
with UNSUPPORTED_VERSION by the gateway (spec: not an empty row, not a server error)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from confluent_kafka import Producer
from inprocess import bootstrap_of, inprocess_gateway
from wire import WireClient, metadata_request

from kanal.embedded import TansuBroker
from kanal.protocol.api import ApiKey, require_request_class
from kanal.protocol.entities import build, nested

UNSUPPORTED_VERSION = 35


def _by_id(api_key: int, version: int, topic_id: uuid.UUID) -> object:
    cls = require_request_class(api_key, version)
    return build(cls, topics=(build(nested(cls, "topics"), topic_id=topic_id, name=None),))


def test_describing_or_deleting_a_topic_by_id_is_unsupported_while_topic_ids_are_off(
    tansu: TansuBroker, unique_topic: Callable[..., str]
) -> None:
    topic = unique_topic()
    with inprocess_gateway(tansu) as gw:
        producer = Producer({"bootstrap.servers": bootstrap_of(gw)})
        producer.produce(topic, b"v")
        producer.flush(10)
        client = WireClient(bootstrap_of(gw))
        (named,) = client.call(metadata_request([topic]), 1).topics  # by name: as ever
        assert named.error_code == 0 and named.topic_id != uuid.UUID(int=0)
        described = client.call(_by_id(ApiKey.METADATA, 12, named.topic_id), 2)
        assert [t.error_code for t in described.topics] == [UNSUPPORTED_VERSION]
        deleted = client.call(_by_id(ApiKey.DELETE_TOPICS, 6, named.topic_id), 3)
        assert [t.error_code for t in deleted.responses] == [UNSUPPORTED_VERSION]
        assert "GATEWAY_FEATURE_FLAGS_TOPIC_IDS" in (deleted.responses[0].error_message or "")
        (still,) = client.call(metadata_request([topic]), 4).topics
        assert still.error_code == 0  # nothing was deleted
        client.close()

    with inprocess_gateway(tansu, env={"GATEWAY_FEATURE_FLAGS_TOPIC_IDS": "true"}) as gw:
        client = WireClient(bootstrap_of(gw))
        described = client.call(_by_id(ApiKey.METADATA, 12, named.topic_id), 5)
        assert [t.error_code for t in described.topics] != [UNSUPPORTED_VERSION]  # the cluster answered
        client.close()
