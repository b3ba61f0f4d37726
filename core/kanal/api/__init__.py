"""The Kanal plugin API: the one package a plugin imports.

Everything a plugin author may use is re-exported here (in the style of ``pytest/__init__.py``);
the modules behind it may move, these names stay. First-party plugins use exactly this, and an
``import-linter`` contract in the test command keeps them to it.

- interceptors: :class:`Interceptor`, :class:`InterceptorSpec`, :class:`Scope`, :data:`hookimpl`;
- what hooks receive and answer: the contexts and the results (:class:`Respond`, :class:`Reject`,
  :class:`Close`, :class:`PartitionError`);
- the gateway: :class:`GatewayServices` (cluster id, metrics, topic names, a Kafka client (and a
  :class:`TopicReader` over it), settings, installed interceptors, state logs, background tasks,
  the audit log, the fleet: :class:`Fleet`, :func:`while_leader`) and :class:`HelperProcess`;
- Kafka: :class:`ApiKey`, :class:`ErrorCode`, message builders (:func:`build`, :func:`nested`,
  :func:`has_field`, :func:`request_class`), the record API and the record walk;
- the admin plane: resource kinds, the routes protocol, console pages, CLI commands;
- errors: :class:`ConfigError`, :class:`InterceptorConfigError`, :class:`ResourceError`,
  :class:`UpstreamError`, :class:`LogError`.
"""

from kio.schema.errors import ErrorCode

from kanal.api.admin import AdminRoutes, AdminUser, Change, ResourceStore, View
from kanal.api.cli import AdminClient, CliContext, CliError
from kanal.api.console import ConsolePages, RecordNote, ShownRecord
from kanal.api.context import Connection, RecordsContext, RequestContext, ResponseContext
from kanal.api.errors import ConfigError, InterceptorConfigError, LogError, UpstreamError
from kanal.api.hookspecs import hookimpl
from kanal.api.interceptor import Interceptor, InterceptorSpec, Scope
from kanal.api.parallel import HelperProcess
from kanal.api.placeholders import expand_placeholders
from kanal.api.resources import (
    API_VERSION,
    READY,
    Key,
    KindRegistry,
    Manifest,
    ResourceError,
    ResourceKind,
    StateView,
    Status,
    check_envelope,
    envelope,
    invalid,
    lookup,
)
from kanal.api.results import (
    Close,
    PartitionError,
    RecordsResult,
    Reject,
    RequestResult,
    Respond,
    ResponseResult,
)
from kanal.api.services import (
    Fleet,
    FleetMember,
    GatewayAcls,
    GatewayServices,
    Identities,
    KafkaClient,
    LogRecord,
    Principal,
    Service,
    StateLog,
    TopicNames,
    while_leader,
)
from kanal.api.settings import (
    EXTERNAL_CONNECTION_PREFIX,
    ExternalConnection,
    FamilyCheck,
    Hint,
    SettingsFamily,
    external_connections,
)
from kanal.api.topic_reader import EARLIEST, LATEST, TopicReader
from kanal.protocol.acl_codes import Operation as AclOperation
from kanal.protocol.acl_codes import ResourceType as AclResourceType
from kanal.protocol.api import ApiKey, api_name, require_request_class, response_class
from kanal.protocol.api import request_class as request_class
from kanal.protocol.entities import build, has_field, nested
from kanal.protocol.records import (
    GZIP,
    LZ4,
    NONE,
    SNAPPY,
    ZSTD,
    CorruptRecordError,
    Headers,
    Record,
    RecordBatch,
    RecordSet,
    RecordSpan,
    encode_batch,
    encode_varint,
    record_headers,
    record_spans,
    record_values,
    records_area,
    skip_records,
    write_record,
)

__all__ = [
    "API_VERSION",
    "EARLIEST",
    "EXTERNAL_CONNECTION_PREFIX",
    "GZIP",
    "LATEST",
    "LZ4",
    "NONE",
    "READY",
    "SNAPPY",
    "ZSTD",
    "AclOperation",
    "AclResourceType",
    "AdminClient",
    "AdminRoutes",
    "AdminUser",
    "ApiKey",
    "Change",
    "CliContext",
    "CliError",
    "Close",
    "ConfigError",
    "Connection",
    "ConsolePages",
    "CorruptRecordError",
    "ErrorCode",
    "ExternalConnection",
    "FamilyCheck",
    "Fleet",
    "FleetMember",
    "GatewayAcls",
    "GatewayServices",
    "Headers",
    "HelperProcess",
    "Hint",
    "Identities",
    "Interceptor",
    "InterceptorConfigError",
    "InterceptorSpec",
    "KafkaClient",
    "Key",
    "KindRegistry",
    "LogError",
    "LogRecord",
    "Manifest",
    "PartitionError",
    "Principal",
    "Record",
    "RecordBatch",
    "RecordNote",
    "RecordSet",
    "RecordSpan",
    "RecordsContext",
    "RecordsResult",
    "Reject",
    "RequestContext",
    "RequestResult",
    "ResourceError",
    "ResourceKind",
    "ResourceStore",
    "Respond",
    "ResponseContext",
    "ResponseResult",
    "Scope",
    "Service",
    "SettingsFamily",
    "ShownRecord",
    "StateLog",
    "StateView",
    "Status",
    "TopicNames",
    "TopicReader",
    "UpstreamError",
    "View",
    "api_name",
    "build",
    "check_envelope",
    "encode_batch",
    "encode_varint",
    "envelope",
    "expand_placeholders",
    "external_connections",
    "has_field",
    "hookimpl",
    "invalid",
    "lookup",
    "nested",
    "record_headers",
    "record_spans",
    "record_values",
    "records_area",
    "request_class",
    "require_request_class",
    "response_class",
    "skip_records",
    "while_leader",
    "write_record",
]
