"""Chaos by error codes: ``chaos-broken-brokers`` and ``chaos-leader-election-errors``.

A chosen share of Produce and Fetch requests is answered by the gateway with an error on every
partition, as a failing broker would answer; the request never reaches the broker, so a failed
Produce writes nothing and the client's retry (if it retries) is the only copy written.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from kanal.api import (
    ApiKey,
    ErrorCode,
    GatewayServices,
    InterceptorConfigError,
    Reject,
    RequestContext,
    RequestResult,
    api_name,
    hookimpl,
)
from kanal_safeguards.chaos.common import ChaosConfig, ChaosInterceptor, Percent

__all__ = [
    "DEFAULT_ERRORS",
    "LEADER_ERRORS",
    "LEGAL_ERRORS",
    "BrokenBrokers",
    "BrokenBrokersConfig",
    "LeaderElectionErrors",
    "LeaderElectionErrorsConfig",
]

_APIS = {"PRODUCE": ApiKey.PRODUCE, "FETCH": ApiKey.FETCH}

#: The error each API answers unless ``errorMap`` says otherwise.
DEFAULT_ERRORS: dict[str, str] = {"FETCH": "UNKNOWN_SERVER_ERROR", "PRODUCE": "CORRUPT_MESSAGE"}

_COMMON = (
    "UNKNOWN_SERVER_ERROR",
    "CORRUPT_MESSAGE",
    "UNKNOWN_TOPIC_OR_PARTITION",
    "LEADER_NOT_AVAILABLE",
    "NOT_LEADER_OR_FOLLOWER",
    "REQUEST_TIMED_OUT",
    "BROKER_NOT_AVAILABLE",
    "REPLICA_NOT_AVAILABLE",
    "NETWORK_EXCEPTION",
    "TOPIC_AUTHORIZATION_FAILED",
    "CLUSTER_AUTHORIZATION_FAILED",
    "KAFKA_STORAGE_ERROR",
    "UNSUPPORTED_COMPRESSION_TYPE",
    "UNKNOWN_TOPIC_ID",
    "INVALID_REQUEST",
    "UNSUPPORTED_VERSION",
)

#: The errors a broker may answer per partition, by API (the Produce and Fetch response docs).
LEGAL_ERRORS: dict[str, frozenset[str]] = {
    "PRODUCE": frozenset(
        (
            *_COMMON,
            "INVALID_TOPIC_EXCEPTION",
            "MESSAGE_TOO_LARGE",
            "RECORD_LIST_TOO_LARGE",
            "NOT_ENOUGH_REPLICAS",
            "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
            "INVALID_REQUIRED_ACKS",
            "INVALID_TIMESTAMP",
            "UNSUPPORTED_FOR_MESSAGE_FORMAT",
            "POLICY_VIOLATION",
            "OUT_OF_ORDER_SEQUENCE_NUMBER",
            "DUPLICATE_SEQUENCE_NUMBER",
            "INVALID_PRODUCER_EPOCH",
            "INVALID_TXN_STATE",
            "INVALID_PRODUCER_ID_MAPPING",
            "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
            "UNKNOWN_PRODUCER_ID",
            "INVALID_RECORD",
            "THROTTLING_QUOTA_EXCEEDED",
            "PRODUCER_FENCED",
            "TRANSACTION_ABORTABLE",
        )
    ),
    "FETCH": frozenset(
        (
            *_COMMON,
            "OFFSET_OUT_OF_RANGE",
            "FENCED_LEADER_EPOCH",
            "UNKNOWN_LEADER_EPOCH",
            "OFFSET_NOT_AVAILABLE",
            "FETCH_SESSION_ID_NOT_FOUND",
            "INVALID_FETCH_SESSION_EPOCH",
            "FETCH_SESSION_TOPIC_ID_ERROR",
            "INCONSISTENT_TOPIC_ID",
            "OFFSET_MOVED_TO_TIERED_STORAGE",
        )
    ),
}

#: What a partition answers during a leader election.
LEADER_ERRORS: tuple[ErrorCode, ...] = (
    ErrorCode.leader_not_available,
    ErrorCode.not_leader_or_follower,
    ErrorCode.broker_not_available,
)


class BrokenBrokersConfig(ChaosConfig, kw_only=True):
    """What operators write under ``config:`` (camelCase keys)."""

    rate_in_percent: Percent
    error_map: dict[str, str] = msgspec.field(default_factory=lambda: dict(DEFAULT_ERRORS))


class LeaderElectionErrorsConfig(ChaosConfig, kw_only=True):
    """What operators write under ``config:`` (camelCase keys)."""

    rate_in_percent: Percent


def _error_codes(error_map: dict[str, str]) -> dict[int, ErrorCode]:
    """The error per API key: the defaults, each replaced by the map's entry for its API; an API
    name or an error the API cannot answer is refused, naming the entry."""
    codes: dict[int, ErrorCode] = {}
    for api, default in DEFAULT_ERRORS.items():
        codes[_APIS[api]] = ErrorCode[default.lower()]
    for api, name in error_map.items():
        if api not in _APIS:
            raise InterceptorConfigError(f"errorMap.{api}: unknown API (use {', '.join(sorted(_APIS))})")
        wanted = name.upper()
        if wanted not in LEGAL_ERRORS[api]:
            raise InterceptorConfigError(
                f"errorMap.{api}: {name!r} is not an error a {api.capitalize()} response may carry "
                f"(one of {', '.join(sorted(LEGAL_ERRORS[api]))})"
            )
        codes[_APIS[api]] = ErrorCode[wanted.lower()]
    return codes


class BrokenBrokers(ChaosInterceptor):
    """Answers ``rateInPercent`` % of Produce and Fetch requests with the error of ``errorMap``."""

    plugin_name: ClassVar[str] = "chaos-broken-brokers"
    description: ClassVar[str] = "Chaos (test environments): answers Produce and Fetch requests with errors."
    config_type: ClassVar[type[BrokenBrokersConfig]] = BrokenBrokersConfig
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset(_APIS.values())
    config: BrokenBrokersConfig

    def __init__(self, config: BrokenBrokersConfig, services: GatewayServices) -> None:
        self._codes = _error_codes(config.error_map)  # before the base acquires the counter
        super().__init__(config, services)

    @hookimpl
    def kanal_request(self, ctx: RequestContext) -> RequestResult:
        if not self.chance(self.config.rate_in_percent):
            return None
        code = self._codes[ctx.api_key]
        self.injected(ctx.connection, api=api_name(ctx.api_key), error=code.name.upper())
        return Reject(code, f"{self.plugin_name}: injected {code.name.upper()}")


class LeaderElectionErrors(ChaosInterceptor):
    """Answers ``rateInPercent`` % of Produce and Fetch requests as a partition without a leader."""

    plugin_name: ClassVar[str] = "chaos-leader-election-errors"
    description: ClassVar[str] = "Chaos (test environments): Produce and Fetch answer leader-election errors."
    config_type: ClassVar[type[LeaderElectionErrorsConfig]] = LeaderElectionErrorsConfig
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset(_APIS.values())
    config: LeaderElectionErrorsConfig

    @hookimpl
    def kanal_request(self, ctx: RequestContext) -> RequestResult:
        if not self.chance(self.config.rate_in_percent):
            return None
        code = self.random.choice(LEADER_ERRORS)
        self.injected(ctx.connection, api=api_name(ctx.api_key), error=code.name.upper())
        return Reject(code, f"{self.plugin_name}: injected {code.name.upper()}")
