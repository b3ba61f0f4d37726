"""``topic-required-schema-id``: record values produced to the matching topics must (or must not)
start with a Confluent schema id (magic byte 0, then a 4-byte id), so that consumers using a
registry serde can read every record. A partition holding a record at fault is failed with
POLICY_VIOLATION; null values (tombstones) carry no payload and pass either way.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from kanal.api import ErrorCode, GatewayServices, PartitionError, RecordsContext, RecordsResult, hookimpl
from kanal_safeguards.base import SafeguardInterceptor, TopicMatcher, check_action
from kanal_safeguards.decisions import Action, Decisions, Violation

__all__ = ["TopicRequiredSchemaId", "TopicRequiredSchemaIdConfig", "has_schema_id"]


class TopicRequiredSchemaIdConfig(msgspec.Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    """What operators write under ``config:`` (camelCase keys)."""

    topic: str = ".*"
    schema_id_required: bool = False
    action: Action = Action.BLOCK


def has_schema_id(value: bytes) -> bool:
    """Whether a value starts with the Confluent wire format's magic byte and schema id."""
    return len(value) >= 5 and value[0] == 0


class TopicRequiredSchemaId(SafeguardInterceptor):
    """Fails the Produce partitions whose record values break the schema id rule."""

    plugin_name: ClassVar[str] = "topic-required-schema-id"
    description: ClassVar[str] = "Requires (or forbids) a schema id at the start of record values."
    config_type: ClassVar[type[TopicRequiredSchemaIdConfig]] = TopicRequiredSchemaIdConfig
    config: TopicRequiredSchemaIdConfig

    def __init__(self, config: TopicRequiredSchemaIdConfig, services: GatewayServices) -> None:
        super().__init__(config, services)
        check_action(self.plugin_name, "action", config.action, frozenset({Action.BLOCK, Action.INFO}))
        self._matches = TopicMatcher(config.topic)
        required = config.schema_id_required
        self._reason = "SchemaId is required." if required else "SchemaId is not allowed."
        self._at_fault = (lambda v: not has_schema_id(v)) if required else has_schema_id

    def wants_produce_records(self, topic: str) -> bool:
        return self._matches(topic)

    @hookimpl
    def kanal_produce_records(self, ctx: RecordsContext) -> RecordsResult:
        if not self._matches(ctx.topic):
            return None
        at_fault = self._at_fault
        if not any(
            record.value is not None and at_fault(record.value)
            for batch in ctx.records.batches
            if not batch.is_control
            for record in batch.records()
        ):
            return None
        decisions = Decisions([Violation(self._reason, self.config.action, "schemaId", None)])
        self.audit(decisions, ctx.connection, topic=ctx.topic, partition=ctx.partition)
        if decisions.blocked:
            return PartitionError(ErrorCode.policy_violation, decisions.message)
        return None
