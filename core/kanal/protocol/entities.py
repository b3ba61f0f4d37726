"""Building kio entities with neutral values for every field not given.

kio messages have many required fields; the gateway builds requests for its own calls and error
responses for clients, and wants to name only the fields that matter.
"""

from __future__ import annotations

import datetime
import uuid
from dataclasses import MISSING, fields, is_dataclass
from functools import cache
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from kio.schema.errors import ErrorCode

_ZERO_UUID = uuid.UUID(int=0)
_PRIMITIVE_DEFAULTS: dict[str, Any] = {
    "bool": False,
    "bytes": b"",
    "string": "",
    "uuid": _ZERO_UUID,
    "float64": 0.0,
    "timedelta_i32": datetime.timedelta(0),
    "timedelta_i64": datetime.timedelta(0),
    "error_code": ErrorCode.none,
    "records": None,
}


@cache
def hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _default_for(field_type: Any, kafka_type: str | None) -> Any:
    """A neutral value for a required field: zero, empty, or a nested default entity."""
    origin = get_origin(field_type)
    if (origin is Union or isinstance(field_type, UnionType)) and type(None) in get_args(field_type):
        return None
    if origin is tuple:
        return ()
    if kafka_type is not None:
        if kafka_type.startswith(("int", "uint")):
            return 0
        if kafka_type == "datetime_i64":
            return datetime.datetime.fromtimestamp(0, datetime.UTC)
        return _PRIMITIVE_DEFAULTS.get(kafka_type)
    if isinstance(field_type, type) and is_dataclass(field_type):
        return build(field_type)
    return None


def build(cls: type, **values: Any) -> Any:
    """An instance of a kio entity with the given fields and neutral values for the rest."""
    types = hints(cls)
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name in values:
            kwargs[f.name] = values[f.name]
        elif f.default is MISSING and f.default_factory is MISSING:
            kwargs[f.name] = _default_for(types[f.name], f.metadata.get("kafka_type"))
    return cls(**kwargs)


def nested(cls: type, field_name: str) -> type:
    """The entity class of a tuple field (``tuple[Entity, ...]``)."""
    hint = hints(cls)[field_name]
    if get_origin(hint) is not tuple:  # an optional array: tuple[Entity, ...] | None
        hint = next(a for a in get_args(hint) if get_origin(a) is tuple)
    entity: type = get_args(hint)[0]
    return entity


def has_field(cls: type, name: str) -> bool:
    return name in hints(cls)
