"""An example policy for the conformance suite: fail produce to one partition with an error code.

It shows how a plugin ships a golden case: ``partition-policy.case.yaml`` replays the kafka-python
capture with this interceptor configured and states what must change, and nothing else may.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kanal.pipeline.context import RecordsContext
from kanal.pipeline.hookspecs import hookimpl
from kanal.pipeline.interceptor import Interceptor, InterceptorConfigError
from kanal.pipeline.results import PartitionError


class RejectPartition(Interceptor):
    plugin_name = "conformance-example-reject-partition"
    description = "Fails produce to one partition with an error code (conformance example)."

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        try:
            self.partition = int(config["partition"])
            self.error_code = int(config.get("errorCode", 87))
        except KeyError as exc:
            raise InterceptorConfigError(f"{exc.args[0]} is required") from None
        except (TypeError, ValueError) as exc:
            raise InterceptorConfigError(str(exc)) from None
        self.message = str(config.get("message", f"partition {self.partition} is closed by policy"))

    @hookimpl
    def kanal_produce_records(self, ctx: RecordsContext) -> PartitionError | None:
        if ctx.partition == self.partition:
            return PartitionError(self.error_code, self.message)
        return None


class _Plugin:
    @hookimpl
    def kanal_interceptor_types(self) -> list[type[Interceptor]]:
        return [RejectPartition]


plugin = _Plugin()
