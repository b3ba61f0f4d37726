"""Reading the YAML file, expanding placeholders, and building settings."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from kanal.api.errors import ConfigError
from kanal.config.placeholders import expand
from kanal.config.settings import Settings, build_settings


def load_settings(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Settings from the environment and, if given, a YAML file (``${VAR}`` placeholders expanded)."""
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
        document = expand(document or {}, environ, "config")
    return build_settings(environ, document)
