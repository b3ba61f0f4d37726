"""``produce-policy``: what a producer must do to write to the matching topics (acks, headers,
compression, idempotence, transactions, Produce API version).

Request-level rules (acks, version) answer the whole request; per-batch rules (headers,
compression, idempotence, transaction) fail only the topic-partitions whose batches break them,
so a producer writing to several topics loses only what is at fault. The per-batch checks run in
the records hook, which has no notes of its own: the request hook hands it a :class:`_Pending` of
this request through ``connection.state`` (the records hooks of a request run right after its
request hooks, in the same task), and the response hook finds the same object in its notes to
add ``throttle_time_ms`` for THROTTLE.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

import msgspec

from kanal.api import (
    GZIP,
    LZ4,
    NONE,
    SNAPPY,
    ZSTD,
    ApiKey,
    ErrorCode,
    GatewayServices,
    InterceptorConfigError,
    PartitionError,
    RecordBatch,
    RecordsContext,
    RecordsResult,
    Reject,
    RequestContext,
    RequestResult,
    ResponseContext,
    ResponseResult,
    hookimpl,
)
from kanal_safeguards.base import SafeguardInterceptor, TopicMatcher, check_actions, with_throttle
from kanal_safeguards.decisions import Action, Decisions, Violation
from kanal_safeguards.rules import RangeRule, ValueRule, ValuesRule

__all__ = [
    "CODECS",
    "ProducePolicy",
    "ProducePolicyConfig",
    "produce_topic_names",
]

#: The compression names operators write, by codec number (the batch attributes' low bits).
CODECS: dict[int, str] = {NONE: "NONE", GZIP: "GZIP", SNAPPY: "SNAPPY", LZ4: "LZ4", ZSTD: "ZSTD"}


def produce_topic_names(ctx: RequestContext) -> list[str | None]:
    """The topic names of a Produce request (v13+ names topics by id: None for an unknown id)."""
    names: list[str | None] = []
    for data in ctx.request.topic_data:
        name = getattr(data, "name", None)
        if name is None and getattr(data, "topic_id", None) is not None:
            name = ctx.topic_names.name(data.topic_id)
        names.append(name)
    return names


class ProducePolicyConfig(msgspec.Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    """What operators write under ``config:`` (camelCase keys)."""

    topic: str = ".*"
    acks: ValueRule | None = None
    record_header_required: ValueRule | None = None
    compressions: ValuesRule | None = None
    idempotence_required: ValueRule | None = None
    transaction_required: ValueRule | None = None
    version: RangeRule | None = None
    throttle_time_ms: Annotated[int, msgspec.Meta(ge=0)] = 100


@dataclass(slots=True)
class _Pending:
    """What the request hook learnt of one Produce request, for its records and response hooks."""

    block: str | None = None  # a request-level BLOCK that fails every matching partition
    throttle: bool = False


class ProducePolicy(SafeguardInterceptor):
    """Checks Produce requests to the matching topics against the configured rules."""

    plugin_name: ClassVar[str] = "produce-policy"
    description: ClassVar[str] = "Requires acks, headers, compressions, idempotence, transactions, a Produce version."
    config_type: ClassVar[type[ProducePolicyConfig]] = ProducePolicyConfig
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.PRODUCE})
    response_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.PRODUCE})
    responses_on_demand: ClassVar[bool] = True
    config: ProducePolicyConfig

    ALLOWED: ClassVar[frozenset[Action]] = frozenset({Action.BLOCK, Action.INFO, Action.THROTTLE})

    def __init__(self, config: ProducePolicyConfig, services: GatewayServices) -> None:
        super().__init__(config, services)
        c = config
        rules = {
            "acks": c.acks,
            "recordHeaderRequired": c.record_header_required,
            "compressions": c.compressions,
            "idempotenceRequired": c.idempotence_required,
            "transactionRequired": c.transaction_required,
            "version": c.version,
        }
        check_actions(self.plugin_name, rules, self.ALLOWED)
        if c.acks is not None and c.acks.value not in (-1, 0, 1):
            raise InterceptorConfigError(f"acks.value: {c.acks.value!r} is not an acks setting (use -1, 0 or 1)")
        flags = {
            "recordHeaderRequired": c.record_header_required,
            "idempotenceRequired": c.idempotence_required,
            "transactionRequired": c.transaction_required,
        }
        for key, flag in flags.items():
            if flag is not None and not isinstance(flag.value, bool):
                raise InterceptorConfigError(f"{key}.value: expected true or false, got {flag.value!r}")
        if c.compressions is not None:
            unknown = [v for v in c.compressions.values if str(v).upper() not in CODECS.values()]
            if unknown:
                raise InterceptorConfigError(
                    f"compressions.values: unknown compression {unknown[0]!r} (use {', '.join(CODECS.values())})"
                )
        self._matches = TopicMatcher(c.topic)
        self._state_key = f"kanal_safeguards.produce-policy.{id(self)}"
        self._may_throttle = any(rule is not None and rule.action is Action.THROTTLE for rule in rules.values())
        self._batch_rules = any(
            rule is not None
            for rule in (c.record_header_required, c.compressions, c.idempotence_required, c.transaction_required)
        )

    def wants_produce_records(self, topic: str) -> bool:
        return self._batch_rules and self._matches(topic)

    @hookimpl
    def kanal_request(self, ctx: RequestContext) -> RequestResult:
        names = produce_topic_names(ctx)
        matching = [n for n in names if self._matches(n)]
        pending = _Pending()
        ctx.connection.state[self._state_key] = pending
        if not matching:
            return None
        ctx.notes["pending"] = pending
        if self._may_throttle and ctx.request.acks != 0:
            ctx.want_response()
        decisions = Decisions()
        c = self.config
        if c.acks is not None:
            decisions.add(c.acks.check("acks", int(ctx.request.acks)))
        if c.version is not None:
            decisions.add(c.version.check("version", ctx.api_version))
        if not decisions.violations:
            return None
        self.audit(decisions, ctx.connection, topics=sorted(set(matching)), apiVersion=ctx.api_version)
        pending.throttle = bool(decisions.of(Action.THROTTLE))
        if decisions.blocked:
            if len(matching) == len(names):
                return Reject(ErrorCode.policy_violation, decisions.message)
            pending.block = decisions.message  # the other topics of the request go through
        return None

    @hookimpl
    def kanal_produce_records(self, ctx: RecordsContext) -> RecordsResult:
        if not self._matches(ctx.topic):
            return None
        pending = ctx.connection.state.get(self._state_key)
        if pending is not None and pending.block is not None:
            return PartitionError(ErrorCode.policy_violation, pending.block)
        decisions = Decisions()
        for violation in self._batch_violations(ctx.records.batches):
            decisions.add(violation)
        if not decisions.violations:
            return None
        self.audit(decisions, ctx.connection, topic=ctx.topic, partition=ctx.partition)
        if pending is not None and decisions.of(Action.THROTTLE):
            pending.throttle = True
        if decisions.blocked:
            return PartitionError(ErrorCode.policy_violation, decisions.message)
        return None

    @hookimpl
    def kanal_response(self, ctx: ResponseContext) -> ResponseResult:
        pending = ctx.notes.get("pending")
        if pending is not None and pending.throttle:
            ctx.response = with_throttle(ctx.response, self.config.throttle_time_ms)
        return None

    def _batch_violations(self, batches: list[RecordBatch]) -> list[Violation | None]:
        """One violation at most per rule for the partition (the first batch at fault)."""
        c = self.config
        data = [b for b in batches if not b.is_control]
        found: list[Violation | None] = []
        if (rule := _required(c.record_header_required)) and any(not r.headers for b in data for r in b.records()):
            found.append(Violation("Headers are required", rule.action, "headers", None))
        if c.compressions is not None:
            for codec in dict.fromkeys(CODECS.get(b.compression, str(b.compression)) for b in data):
                found.append(c.compressions.check("compression", codec))
        if (rule := _required(c.idempotence_required)) and any(b.producer_id < 0 for b in data):
            found.append(Violation("Idempotence is required", rule.action, "idempotence", False))
        if (rule := _required(c.transaction_required)) and any(not b.is_transactional for b in data):
            found.append(Violation("Transaction is required", rule.action, "transaction", False))
        return found


def _required(rule: ValueRule | None) -> ValueRule | None:
    """The rule when it is ``{value: true}`` (``false`` requires nothing)."""
    return rule if rule is not None and rule.value is True else None
