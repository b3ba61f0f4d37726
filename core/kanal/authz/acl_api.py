"""CreateAcls, DescribeAcls and DeleteAcls as the gateway answers them when it enforces ACLs itself.

Sans-I/O: requests in, bindings and filters out; results in, responses out. The errors are Kafka's:
INVALID_REQUEST for an ACL Kafka would refuse (the message says why), NONE otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kio.schema.errors import ErrorCode

from kanal.authz.acl import AclBinding, AclFilter
from kanal.protocol.acl_codes import Operation, PatternType, Permission, ResourceType
from kanal.protocol.api import ApiKey
from kanal.protocol.entities import build, nested
from kanal.protocol.messages import response_type

__all__ = ["create_response", "creations", "delete_filters", "delete_response", "describe_filter", "describe_response"]


def _enum(enum: type[Any], value: int) -> Any:
    try:
        return enum(int(value))
    except ValueError:
        return enum.UNKNOWN


def creations(request: Any) -> list[AclBinding | str]:
    """Each creation of a CreateAcls request: its binding, or why Kafka would refuse it."""
    out: list[AclBinding | str] = []
    for creation in request.creations:
        binding = AclBinding(
            _enum(ResourceType, creation.resource_type),
            str(creation.resource_name),
            _enum(PatternType, creation.resource_pattern_type),
            str(creation.principal),
            str(creation.host),
            _enum(Operation, creation.operation),
            _enum(Permission, creation.permission_type),
        )
        out.append(binding.problem() or binding)
    return out


def create_response(
    version: int, problems: Sequence[str | None], error_code: ErrorCode = ErrorCode.invalid_request
) -> Any:
    """The answer to CreateAcls: per creation in order, its problem (None: created), reported with
    ``error_code``."""
    cls = response_type(ApiKey.CREATE_ACLS, version)
    result_cls = nested(cls, "results")
    return build(
        cls,
        results=tuple(
            build(
                result_cls,
                error_code=ErrorCode.none if problem is None else error_code,
                error_message=problem,
            )
            for problem in problems
        ),
    )


def _filter(entry: Any) -> AclFilter:
    return AclFilter(
        _enum(ResourceType, entry.resource_type_filter),
        None if entry.resource_name_filter is None else str(entry.resource_name_filter),
        _enum(PatternType, entry.pattern_type_filter),
        None if entry.principal_filter is None else str(entry.principal_filter),
        None if entry.host_filter is None else str(entry.host_filter),
        _enum(Operation, entry.operation),
        _enum(Permission, entry.permission_type),
    )


def describe_filter(request: Any) -> AclFilter:
    return _filter(request)


def delete_filters(request: Any) -> list[AclFilter]:
    return [_filter(entry) for entry in request.filters]


def describe_response(version: int, bindings: Sequence[AclBinding]) -> Any:
    """The answer to DescribeAcls: the bindings grouped by resource pattern, as Kafka groups them."""
    cls = response_type(ApiKey.DESCRIBE_ACLS, version)
    resource_cls = nested(cls, "resources")
    acl_cls = nested(resource_cls, "acls")
    grouped: dict[tuple[int, str, int], list[Any]] = {}
    for acl in bindings:
        grouped.setdefault((acl.resource_type, acl.resource_name, acl.pattern_type), []).append(
            build(
                acl_cls,
                principal=acl.principal,
                host=acl.host,
                operation=acl.operation.value,
                permission_type=acl.permission.value,
            )
        )
    resources = tuple(
        build(resource_cls, resource_type=kind, resource_name=name, pattern_type=pattern, acls=tuple(acls))
        for (kind, name, pattern), acls in grouped.items()
    )
    return build(cls, error_code=ErrorCode.none, resources=resources)


def delete_response(
    version: int, deleted: Sequence[Sequence[AclBinding]], error_code: ErrorCode = ErrorCode.none
) -> Any:
    """The answer to DeleteAcls: per filter in order, the bindings it deleted (or ``error_code``
    for every filter)."""
    cls = response_type(ApiKey.DELETE_ACLS, version)
    result_cls = nested(cls, "filter_results")
    match_cls = nested(result_cls, "matching_acls")
    return build(
        cls,
        filter_results=tuple(
            build(
                result_cls,
                error_code=error_code,
                matching_acls=tuple(
                    build(
                        match_cls,
                        error_code=ErrorCode.none,
                        resource_type=acl.resource_type.value,
                        resource_name=acl.resource_name,
                        pattern_type=acl.pattern_type.value,
                        principal=acl.principal,
                        host=acl.host,
                        operation=acl.operation.value,
                        permission_type=acl.permission.value,
                    )
                    for acl in bindings
                ),
            )
            for bindings in deleted
        ),
    )
