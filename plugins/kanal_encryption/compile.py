"""From an encryption config to its :class:`~kanal_encryption.encrypt.Plan`, checked once.

Everything an operator can get wrong is refused here, with the config path at fault: a key named
both ways or neither, an unknown algorithm or placeholder, a bad regex or field path, and a key id
template reading a part this same config encrypts (the decrypter could never rebuild that key id).
"""

from __future__ import annotations

import re

from kanal.api import InterceptorConfigError

from .config import EncryptionConfig, FieldSpec, HeaderSpec, KeySpec, PartSpec
from .crypto.ciphers import Algorithm
from .crypto.compression import Codec
from .encrypt import Plan
from .keys import Locator
from .paths import PathError, parse_path
from .targets import HEADER, KEY, VALUE, Target, path_label
from .templates import TemplateError, parse_template

__all__ = ["Topics", "compile_plan"]


class Topics:
    """The ``topic`` regex of an interceptor (matching whole names), its answers remembered: it is
    asked for every request's topics."""

    __slots__ = ("_pattern", "_seen")

    def __init__(self, text: str) -> None:
        try:
            self._pattern = re.compile(text)
        except re.error as exc:
            raise InterceptorConfigError(f"topic: not a regular expression ({exc})") from None
        self._seen: dict[str, bool] = {}

    def matches(self, topic: str) -> bool:
        seen = self._seen.get(topic)
        if seen is None:
            if len(self._seen) > 10_000:
                self._seen.clear()
            seen = self._seen[topic] = self._pattern.fullmatch(topic) is not None
        return seen


def compile_plan(config: EncryptionConfig, locator: Locator) -> Plan:
    value = _part(config.record_value, VALUE, "recordValue", locator)
    key = _part(config.record_key, KEY, "recordKey", locator)
    header_payload, header_fields = _headers(config.record_header, locator)
    if not any((value[0], value[1], key[0], key[1], header_payload, header_fields)):
        raise InterceptorConfigError("nothing to encrypt: set recordValue, recordKey or recordHeader")
    try:
        codec = Codec.parse(config.compression_type)
    except ValueError as exc:
        raise InterceptorConfigError(f"compressionType: {exc}") from None
    plan = Plan(
        key_payload=key[0],
        key_fields=key[1],
        value_payload=value[0],
        value_fields=value[1],
        header_payload=header_payload,
        header_fields=header_fields,
        codec=int(codec),
        skip_encrypted=config.error_policy == "skip_already_encrypted",
    )
    _check_templates(plan)
    return plan


def _target(spec: KeySpec, part: str, label: bytes, where: str, locator: Locator, **extra: object) -> Target:
    text = locator.check(spec.key_id, spec.key_secret_id, where)
    try:
        template = parse_template(text)
        algorithm = Algorithm.parse(spec.algorithm)
    except (TemplateError, ValueError) as exc:
        raise InterceptorConfigError(f"{where}: {exc}") from None
    return Target(part, label, extra.pop("path", None), template, algorithm, **extra)  # type: ignore[arg-type]


def _part(spec: PartSpec | None, part: str, where: str, locator: Locator) -> tuple[Target | None, tuple[Target, ...]]:
    if spec is None:
        return None, ()
    if (spec.payload is None) == (spec.fields is None):
        raise InterceptorConfigError(f"{where}: set one of payload or fields")
    if spec.payload is not None:
        return _target(spec.payload, part, part.encode(), f"{where}.payload", locator), ()
    return None, tuple(
        _field(field, part, f"{where}.fields[{i}]", locator) for i, field in enumerate(spec.fields or ())
    )


def _field(field: FieldSpec, part: str, where: str, locator: Locator) -> Target:
    try:
        path = parse_path(field.field_name)
    except PathError as exc:
        raise InterceptorConfigError(f"{where}.fieldName: {exc}") from None
    return _target(field, part, path_label(part, path), where, locator, path=path)


def _headers(spec: HeaderSpec | None, locator: Locator) -> tuple[Target | None, tuple[Target, ...]]:
    if spec is None:
        return None, ()
    payload = None
    if spec.payload is not None or spec.header is not None:
        if spec.payload is None or spec.header is None:
            raise InterceptorConfigError("recordHeader: header (a regex of names) and payload go together")
        try:
            pattern = re.compile(spec.header)
        except re.error as exc:
            raise InterceptorConfigError(f"recordHeader.header: not a regular expression ({exc})") from None
        payload = _target(spec.payload, HEADER, b"header:", "recordHeader.payload", locator, header=pattern)
    fields = []
    for i, field in enumerate(spec.fields or ()):
        if not field.field_name:
            raise InterceptorConfigError(f"recordHeader.fields[{i}].fieldName: required (the header's name)")
        label = b"header:" + field.field_name.encode()
        fields.append(_target(field, HEADER, label, f"recordHeader.fields[{i}]", locator))
    return payload, tuple(fields)


def _check_templates(plan: Plan) -> None:
    """A key id must not be built from what the same config encrypts."""
    value_fields = {t.path.steps for t in plan.value_fields if t.path is not None}
    header_names = {t.label[len(b"header:") :].decode() for t in plan.header_fields}
    for target in plan.targets:
        template = target.template
        if template.reads_key and (plan.key_payload is not None or plan.key_fields):
            raise InterceptorConfigError(f"key id {template.text!r} reads the record key, which this config encrypts")
        for path in template.value_paths:
            if plan.value_payload is not None or any(_overlap(path.steps, f) for f in value_fields):
                raise InterceptorConfigError(
                    f"key id {template.text!r} reads the value field {path.text!r}, which this config encrypts"
                )
        for name in template.headers:
            pattern = plan.header_payload.header if plan.header_payload is not None else None
            if name in header_names or (pattern is not None and pattern.fullmatch(name)):
                raise InterceptorConfigError(
                    f"key id {template.text!r} reads the header {name!r}, which this config encrypts"
                )


def _overlap(a: tuple[str | int, ...], b: tuple[str | int, ...]) -> bool:
    """Whether one path is the other or inside it."""
    n = min(len(a), len(b))
    return a[:n] == b[:n]
