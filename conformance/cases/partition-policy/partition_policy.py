"""An example policy for the conformance suite: fail produce to one partition with an error code.

It shows how a plugin ships a golden case: ``partition-policy.case.yaml`` replays the kafka-python
capture with this interceptor configured and states what must change, and nothing else may.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kanal.api import ErrorCode, GatewayServices, Interceptor, PartitionError, RecordsContext, hookimpl


@dataclass(frozen=True)
class RejectPartitionConfig:
    partition: int
    errorCode: int = ErrorCode.invalid_record
    message: str | None = None


class RejectPartition(Interceptor):
    plugin_name = "conformance-example-reject-partition"
    description = "Fails produce to one partition with an error code (conformance example)."
    config_type: ClassVar[type[RejectPartitionConfig]] = RejectPartitionConfig

    def __init__(self, config: RejectPartitionConfig, services: GatewayServices) -> None:
        super().__init__(config, services)
        self.error = PartitionError(
            config.errorCode, config.message or f"partition {config.partition} is closed by policy"
        )

    @hookimpl
    def kanal_produce_records(self, ctx: RecordsContext) -> PartitionError | None:
        return self.error if ctx.partition == self.config.partition else None


class _Plugin:
    @hookimpl
    def kanal_interceptor_types(self) -> list[type[Interceptor]]:
        return [RejectPartition]


plugin = _Plugin()
