"""The topic and config safeguards: rules on CreateTopics (``create-topic-policy``) and on the
configs AlterConfigs / IncrementalAlterConfigs set on topics (``alter-topic-config-policy``) and
brokers (``alter-broker-config-policy``). Each fails only the topics or resources at fault."""

from __future__ import annotations

from kanal.api import Interceptor

from .alter_config import AlterBrokerConfigPolicy, AlterTopicConfigPolicy
from .create_topic import CreateTopicPolicy

__all__ = ["INTERCEPTORS", "AlterBrokerConfigPolicy", "AlterTopicConfigPolicy", "CreateTopicPolicy"]

INTERCEPTORS: list[type[Interceptor]] = [CreateTopicPolicy, AlterTopicConfigPolicy, AlterBrokerConfigPolicy]
