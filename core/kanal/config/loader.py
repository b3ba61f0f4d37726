"""Reading the YAML file, expanding placeholders, and building settings."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from kanal.api.errors import ConfigError
from kanal.api.placeholders import expand_placeholders
from kanal.config.settings import KnownSettings, Settings, build_settings

_FILE_KEYS = ("gateway.", "kafka.", "interceptors", "config file")


def load_settings(
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    *,
    require_upstream: bool = False,
    known: KnownSettings | None = None,
) -> Settings:
    """Settings from the environment and, if given, a YAML file (``${VAR}`` placeholders expanded).
    With ``require_upstream`` (``kanal run``), a missing ``KAFKA_BOOTSTRAP_SERVERS`` is an error: the
    gateway would otherwise wait for a broker on 127.0.0.1:9092 for ever."""
    environ = dict(os.environ if env is None else env)
    document: Any = None
    if path is not None:
        file = Path(path)
        try:
            text = file.read_text()
        except OSError as exc:
            raise ConfigError(str(path), f"cannot read the config file: {exc.strerror}") from None
        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(str(path), f"invalid YAML: {exc}") from None
        if document is not None and not isinstance(document, Mapping):
            raise ConfigError(str(path), "the config file must hold a mapping at the top level")
        document = expand_placeholders(_hold_interceptor_configs(document or {}), environ, "config")
        document = _restore_interceptor_configs(document)
    try:
        settings = build_settings(environ, document, known)
    except ConfigError as exc:
        if path is None or not exc.key.startswith(_FILE_KEYS):
            raise
        raise ConfigError(f"{path}: {exc.key}", exc.problem) from None  # a key of the file: name the file
    kafka_section = (document or {}).get("kafka") or {}
    if require_upstream and not environ.get("KAFKA_BOOTSTRAP_SERVERS") and "bootstrap.servers" not in kafka_section:
        raise ConfigError(
            "KAFKA_BOOTSTRAP_SERVERS",
            "required: the Kafka cluster the gateway fronts, host:port[,host:port...]"
            " (or kafka.bootstrap.servers in the config file)",
        )
    return settings


class _Held:
    """An interceptor's config, kept from the file's expansion (which passes over other objects)."""

    __slots__ = ("config",)

    def __init__(self, config: Any) -> None:
        self.config = config


def _hold_interceptor_configs(document: Mapping[str, Any]) -> dict[str, Any]:
    """The document with each interceptor's ``config`` out of the expansion's reach: those are
    expanded when the interceptor is made (with the same environment), as the admin API's are, so a
    value is never expanded twice."""
    items = document.get("interceptors")
    if not isinstance(items, list):
        return dict(document)
    held = [{**item, "config": _Held(item["config"])} if _has_config(item) else item for item in items]
    return {**document, "interceptors": held}


def _restore_interceptor_configs(document: dict[str, Any]) -> dict[str, Any]:
    items = document.get("interceptors")
    if not isinstance(items, list):
        return document
    restored = [
        {**item, "config": item["config"].config}
        if isinstance(item, Mapping) and isinstance(item.get("config"), _Held)
        else item
        for item in items
    ]
    return {**document, "interceptors": restored}


def _is_held(item: Any) -> bool:
    return isinstance(item, Mapping) and isinstance(item.get("config"), _Held)


def _has_config(item: Any) -> bool:
    return isinstance(item, Mapping) and "config" in item
