"""``header-removal``: record headers whose key matches ``headerKeyRegex`` (whole key) are removed
from what consumers of the matching topics fetch; what is stored is unchanged. Run it innermost
(the highest priority number) so that the other interceptors still see the headers."""

from __future__ import annotations

import re
from typing import ClassVar

import msgspec

from kanal.api import GatewayServices, InterceptorConfigError, RecordsContext, RecordsResult, hookimpl
from kanal_safeguards.base import SafeguardInterceptor, TopicMatcher

__all__ = ["HeaderRemoval", "HeaderRemovalConfig"]


class HeaderRemovalConfig(msgspec.Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    """What operators write under ``config:`` (camelCase keys)."""

    header_key_regex: str
    topic: str = ".*"


class HeaderRemoval(SafeguardInterceptor):
    """Strips matching headers from fetched records."""

    plugin_name: ClassVar[str] = "header-removal"
    description: ClassVar[str] = "Removes record headers matching a regex from what consumers fetch."
    config_type: ClassVar[type[HeaderRemovalConfig]] = HeaderRemovalConfig
    config: HeaderRemovalConfig

    def __init__(self, config: HeaderRemovalConfig, services: GatewayServices) -> None:
        super().__init__(config, services)
        self._matches = TopicMatcher(config.topic)
        try:
            self._removed = re.compile(config.header_key_regex).fullmatch
        except re.error as exc:
            raise InterceptorConfigError(
                f"headerKeyRegex: {config.header_key_regex!r} is not a valid regex: {exc}"
            ) from None

    @hookimpl
    def kanal_fetch_records(self, ctx: RecordsContext) -> RecordsResult:
        if not self._matches(ctx.topic):
            return None
        removed = self._removed
        for batch in ctx.records.batches:
            if batch.is_control:
                continue
            changed = False
            for record in batch.records():
                headers = record.headers
                if headers and any(removed(key) for key, _ in headers):
                    record.headers = [(key, value) for key, value in headers if not removed(key)]
                    changed = True
            if changed:
                batch.mark_changed()
        return None
