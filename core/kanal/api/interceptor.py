"""Interceptors: the base class of a plugin's interceptor types, their config, and their model.

An interceptor's life: the core validates its config (against ``config_type`` or ``config_schema``),
constructs it with that config and the :class:`~kanal.api.services.GatewayServices`, calls its hooks
for the connections its scope matches, and awaits ``aclose()`` once it is replaced, deleted or the
gateway shuts down (connections still using it finish their requests first).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, get_type_hints, is_typeddict

import jsonschema
import msgspec

from kanal.api.errors import InterceptorConfigError

if TYPE_CHECKING:
    from kanal.api.services import GatewayServices

__all__ = ["Interceptor", "InterceptorConfigError", "InterceptorSpec", "Scope", "validate_config"]


class Interceptor:
    """Base class of interceptor types. Subclasses set ``plugin_name`` and implement hooks
    (see :mod:`kanal.api.hookspecs`) as methods marked with ``@hookimpl``.

    Config: set ``config_type`` to a dataclass, a ``TypedDict`` or a ``msgspec.Struct`` and the core
    converts the operator's config into it (``self.config`` is then an instance), refusing unknown
    keys and wrong types with a message naming the field; or set ``config_schema`` (a JSON schema)
    and ``self.config`` is the validated dict. Either way the admin API shows the schema and answers
    400 for a bad config before the constructor runs. The constructor may still raise
    :class:`InterceptorConfigError` for what a schema cannot say (a regex that does not compile).

    ``request_api_keys`` and ``response_api_keys`` say which APIs ``kanal_request`` and
    ``kanal_response`` want; everything else stays opaque bytes, which is what keeps the
    gateway fast. With ``responses_on_demand``, a response is decoded for this interceptor only
    when its ``kanal_request`` asked for it (``ctx.want_response()``): an interceptor that changes
    a few requests then costs nothing on the responses to all the others.
    """

    plugin_name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: The spec this instance was configured from (its name, scope, priority and config as declared),
    #: set by the core right after the constructor returns (so None inside ``__init__``, and for an
    #: instance used outside the core). Every node of a fleet builds the interceptor from the same
    #: declaration, so its plugin, name and scope identify it across the fleet: state a plugin shares
    #: between nodes about one interceptor (a fleet-wide limit's usage) is keyed by them.
    spec: InterceptorSpec | None = None
    config_type: ClassVar[type[Any] | None] = None
    config_schema: ClassVar[Mapping[str, Any] | None] = None
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset()
    response_api_keys: ClassVar[frozenset[int] | None] = frozenset()
    responses_on_demand: ClassVar[bool] = False

    def __init__(self, config: Any, services: GatewayServices) -> None:
        self.config = config
        self.services = services

    async def aclose(self) -> None:
        """Releases what the interceptor holds (connections, tasks, helper processes). Called once,
        when it is replaced or deleted, or at shutdown; the default does nothing."""

    def wants_produce_records(self, topic: str) -> bool:
        """Whether ``kanal_produce_records`` is to see the records produced to ``topic``.

        The default, True, has every Produce request decoded for this interceptor. Answer False for
        the topics your hook would return at once for: a Produce request none of whose topics any
        interceptor wants is forwarded as it arrived (a large one while it arrives, its records never
        entering the gateway). The hook may still be called for such a topic when the request also
        holds a wanted one. Called per request, so keep it to a lookup.
        """
        return True

    @classmethod
    def json_schema(cls) -> Mapping[str, Any] | None:
        """The schema operators see: ``config_schema``, or the one derived from ``config_type``."""
        if cls.config_schema is not None:
            return cls.config_schema
        if cls.config_type is not None:
            schema: Mapping[str, Any] = msgspec.json.schema(cls.config_type)
            return schema
        return None


def validate_config(cls: type[Interceptor], config: Mapping[str, Any], *, expanded: bool = False) -> Any:
    """The config an interceptor of type ``cls`` is constructed with; raises
    :class:`InterceptorConfigError` naming the field at fault.

    ``expanded``: ``${VAR}`` placeholders were expanded in ``config``. They always expand to
    strings, so a typed config then reads a number or flag from its text; without placeholders
    a quoted number stays an error."""
    if cls.config_type is not None:
        known = _field_names(cls.config_type)
        if known is not None:
            unknown = sorted(set(config) - known)
            if unknown:
                raise InterceptorConfigError(f"{unknown[0]}: unknown key (expected {', '.join(sorted(known))})")
        try:
            return msgspec.convert(dict(config), cls.config_type, str_keys=True)
        except msgspec.ValidationError as exc:
            if not expanded:
                raise InterceptorConfigError(_msgspec_message(str(exc))) from exc
        try:
            return msgspec.convert(dict(config), cls.config_type, str_keys=True, strict=False)
        except msgspec.ValidationError as exc:
            raise InterceptorConfigError(_msgspec_message(str(exc))) from exc
    if cls.config_schema is not None:
        validator = jsonschema.Draft202012Validator(cls.config_schema)
        error = jsonschema.exceptions.best_match(validator.iter_errors(dict(config)))
        if error is not None:
            raise InterceptorConfigError(_schema_message(error))
    return dict(config)


def _schema_message(error: jsonschema.ValidationError) -> str:
    """``path: problem``, naming the missing or unknown key itself where that is the problem."""
    path = [str(p) for p in error.absolute_path]
    instance = error.instance if isinstance(error.instance, Mapping) else {}
    if error.validator == "required":
        missing = next((key for key in error.validator_value if key not in instance), None)
        if missing is not None:
            return f"{'.'.join([*path, missing])}: required"
    if error.validator == "additionalProperties" and isinstance(error.schema, Mapping):
        known = set(error.schema.get("properties", {}))
        unknown = sorted(key for key in instance if key not in known)
        if unknown:
            expected = f" (expected {', '.join(sorted(known))})" if known else ""
            return f"{'.'.join([*path, unknown[0]])}: unknown key{expected}"
    return f"{'.'.join(path) or 'config'}: {error.message}"


def _field_names(config_type: type[Any]) -> frozenset[str] | None:
    if dataclasses.is_dataclass(config_type):
        return frozenset(f.name for f in dataclasses.fields(config_type))
    if is_typeddict(config_type):
        return frozenset(get_type_hints(config_type))
    return None  # a msgspec.Struct says forbid_unknown_fields itself


def _msgspec_message(message: str) -> str:
    """msgspec's ``Expected `int`, got `str` - at `$.size``` as ``size: Expected `int`, got `str```,
    and ``Object missing required field `size``` as ``size: required``."""
    text, sep, where = message.rpartition(" - at `")
    if not sep:
        text, where = message, ""
    path = where.rstrip("`").removeprefix("$").lstrip(".")
    missing = re.fullmatch(r"Object missing required field `(.+)`", text)
    if missing:
        return f"{path + '.' if path else ''}{missing.group(1)}: required"
    return f"{path or 'config'}: {text}"


@dataclass(frozen=True, slots=True)
class Scope:
    """Who an interceptor applies to. All None: every connection (global)."""

    vcluster: str | None = None
    group: str | None = None
    username: str | None = None

    def specificity(self) -> int:
        """Username beats group beats virtual cluster beats global."""
        if self.username is not None:
            return 3
        if self.group is not None:
            return 2
        if self.vcluster is not None:
            return 1
        return 0

    def matches(self, username: str | None, groups: tuple[str, ...], vcluster: str | None) -> bool:
        if self.vcluster is not None and self.vcluster != vcluster:
            return False
        if self.group is not None and self.group not in groups:
            return False
        return self.username is None or self.username == username


@dataclass(frozen=True, slots=True)
class InterceptorSpec:
    """An interceptor as configured: which plugin, where in the chain, for whom, with what."""

    name: str
    plugin: str
    priority: int = 100
    scope: Scope = field(default_factory=Scope)
    config: Mapping[str, Any] = field(default_factory=dict)
