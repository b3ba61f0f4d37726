"""Safeguard policies: rules on what a request may ask (topics and their configs, produce and
fetch settings, read-only topics, schema ids, consumer groups, client ids), one module per
interceptor type, and the header removal on fetch."""

from __future__ import annotations

from kanal.api import Interceptor
from kanal_safeguards.policies.alter_config import AlterBrokerConfigPolicy, AlterTopicConfigPolicy
from kanal_safeguards.policies.client_id import ClientIdPolicy
from kanal_safeguards.policies.consumer_group import ConsumerGroupPolicy
from kanal_safeguards.policies.create_topic import CreateTopicPolicy
from kanal_safeguards.policies.fetch_policy import FetchPolicy
from kanal_safeguards.policies.header_removal import HeaderRemoval
from kanal_safeguards.policies.produce_policy import ProducePolicy
from kanal_safeguards.policies.read_only import ReadOnlyTopic
from kanal_safeguards.policies.schema_id import TopicRequiredSchemaId

__all__ = ["INTERCEPTORS"]

INTERCEPTORS: list[type[Interceptor]] = [
    CreateTopicPolicy,
    AlterTopicConfigPolicy,
    AlterBrokerConfigPolicy,
    ProducePolicy,
    FetchPolicy,
    ReadOnlyTopic,
    TopicRequiredSchemaId,
    HeaderRemoval,
    ConsumerGroupPolicy,
    ClientIdPolicy,
]
