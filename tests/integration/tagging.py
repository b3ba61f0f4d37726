"""An interceptor that shows whose traffic it applied to: it appends its configured tag to every
fetched value. Tests of scopes give each scope another tag and read which one a client got."""

from __future__ import annotations

from kanal.api.context import RecordsContext
from kanal.api.hookspecs import hookimpl
from kanal.api.interceptor import Interceptor


class TagOnFetch(Interceptor):
    """Appends ``config.tag`` to every fetched value."""

    plugin_name = "test-tag"

    @hookimpl
    def kanal_fetch_records(self, ctx: RecordsContext) -> None:
        for batch in ctx.records.batches:
            for record in batch.records():
                if record.value is not None:
                    record.value = record.value + self.config["tag"].encode()
            batch.mark_changed()


class TagPlugin:
    @hookimpl
    def kanal_interceptor_types(self) -> list[type[Interceptor]]:
        return [TagOnFetch]
