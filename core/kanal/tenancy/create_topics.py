"""CreateTopics entries the gateway answers itself: logical names Kafka would refuse once prefixed.

Kafka checks the physical name, so a logical name that fits Kafka's limit on its own can be too long
with the prefix. The gateway refuses such a topic itself, with the error Kafka gives for a bad name
(INVALID_TOPIC_EXCEPTION) and a message naming the limit, while the request's other topics still go
to the broker. Kafka answers CreateTopics per topic, so the client gets one answer for every topic it
asked for, in its order: the refused ones are merged back into the broker's answer.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kanal.protocol.entities import build, has_field, nested
from kanal.protocol.messages import response_type
from kanal.tenancy.apis import api_key
from kanal.tenancy.names import INVALID_TOPIC, VirtualNames

CREATE_TOPICS = api_key("create_topics")


def refused_topics(request: Any, names: VirtualNames) -> tuple[Any, tuple[Any, ...]]:
    """The request without the topics refused by name, and the response entries refusing them."""
    refusals = [(topic, why) for topic in request.topics if (why := names.invalid_topic(topic.name)) is not None]
    if not refusals:
        return request, ()
    entry_cls = nested(response_type(CREATE_TOPICS, int(request.__version__)), "topics")
    refused = {id(topic) for topic, _ in refusals}
    kept = tuple(topic for topic in request.topics if id(topic) not in refused)
    return replace(request, topics=kept), tuple(_refusal(entry_cls, topic.name, why) for topic, why in refusals)


def _refusal(entry_cls: type, name: str, message: str) -> Any:
    values: dict[str, Any] = {"name": name, "error_code": INVALID_TOPIC}
    if has_field(entry_cls, "error_message"):
        values["error_message"] = message
    for unknown in ("num_partitions", "replication_factor"):  # what Kafka answers for a topic it did not create
        if has_field(entry_cls, unknown):
            values[unknown] = -1
    return build(entry_cls, **values)


def answer_alone(version: int, refused: tuple[Any, ...]) -> Any:
    """The whole response when every topic was refused: nothing goes to the broker."""
    return build(response_type(CREATE_TOPICS, version), topics=refused)


def merged(topics: tuple[Any, ...], refused: tuple[Any, ...], order: tuple[str, ...]) -> tuple[Any, ...]:
    """The broker's entries and the refused ones, in the client's order of names."""
    position: dict[str, int] = {}
    for i, name in enumerate(order):
        position.setdefault(name, i)
    last = len(order)
    return tuple(sorted((*topics, *refused), key=lambda t: position.get(t.name, last)))
