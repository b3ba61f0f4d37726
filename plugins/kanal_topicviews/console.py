"""The console's topic-view pages: the views, a form to create or edit one with its SQL statement,
and a preview of the view over the last records of its input topic before it is saved.

The preview runs the view exactly as a consumer's Fetch would (the same compiled statement and
:class:`~kanal_topicviews.transform.Transformer`) on the input topic's latest records, read with the
gateway's client; it shows, record by record, the value before and after, or that the record is not
in the view (filtered out by the WHERE clause), or the error that onError would apply to (dropped,
or the fetch failed). Saving goes through the admin API's validation (the same 400 messages).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson
from kanal_schemas import VALUE_HEADER
from quart import request

from kanal.api import (
    EARLIEST,
    LATEST,
    ConsolePages,
    GatewayServices,
    RecordSet,
    ResourceError,
    ShownRecord,
    TopicReader,
    UpstreamError,
)

from .resource import KIND
from .runtime import ensure_runtime
from .transform import FetchFailed
from .views import View, ViewConfigError

__all__ = ["add_pages", "preview"]

TEMPLATES: Final = Path(__file__).parent / "templates"
PREVIEW_RECORDS: Final = 10
_PARTITION_BYTES: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class PreviewRow:
    partition: int
    offset: int
    before: str
    after: str | None  # None: not in the view
    outcome: str  # "in the view", "filtered out", or what onError does with an error


def _text(value: bytes | None) -> str:
    if value is None:
        return "null"
    try:
        return orjson.dumps(orjson.loads(value), option=orjson.OPT_INDENT_2).decode()
    except orjson.JSONDecodeError:
        return value[:2000].decode("utf-8", errors="replace")


def _by_offset(data: bytes | None, since: int) -> dict[int, bytes | None]:
    out: dict[int, bytes | None] = {}
    for batch in RecordSet.parse(data).batches:
        if batch.is_control:
            continue
        for record in batch.records():
            offset = batch.offset_of(record)
            if offset >= since:
                out[offset] = record.value
    return out


def _run(view: View, data: bytes, partition: int, start: int) -> tuple[dict[int, bytes | None], dict[int, str]]:
    """The view's output values by offset, and the records it could not transform (with why),
    as a consumer fetching from ``start`` would get them record after record (an error does not
    stop the preview: it goes on after the failing record)."""
    kept: dict[int, bytes | None] = {}
    errors: dict[int, str] = {}
    position = start
    for _ in range(PREVIEW_RECORDS * 4):  # (an error per record at most, plus the last pass)
        try:
            kept.update(_by_offset(view.transformer.fetch(data, partition, position), position))
            break
        except FetchFailed as failed:
            if failed.records is not None:
                kept.update(_by_offset(failed.records, position))
            errors[failed.offset] = failed.reason
            position = failed.offset + 1
    return kept, errors


async def preview(
    services: GatewayServices, manifest: dict[str, Any], count: int = PREVIEW_RECORDS
) -> list[PreviewRow]:
    """The view of ``manifest`` over the last ``count`` records of each partition of its input
    topic (raises ``ViewConfigError`` for a statement that does not compile, ``UpstreamError`` when
    the cluster does not answer)."""
    runtime = ensure_runtime(services)
    strict = {**manifest, "spec": {**manifest["spec"], "onError": {"type": "FAIL_FETCH"}}}
    view = View.from_manifest(strict, services.cluster_id, runtime.decoders)
    on_error = str(manifest["spec"]["onError"]["type"]).upper()
    reader = TopicReader(services.kafka)
    error, partitions = await reader.partitions(view.physical)
    if error:
        raise ViewConfigError(f"the input topic {view.physical!r} cannot be read (error {error})")
    tps = [(view.physical, p) for p in partitions]
    starts = await reader.list_offsets(tps, EARLIEST)
    ends = await reader.list_offsets(tps, LATEST)
    positions = {tp: max(starts.get(tp, 0), ends.get(tp, 0) - count) for tp in tps}
    rows: list[PreviewRow] = []
    for _ in range(2):  # a second round when the Fetch shows a later end than ListOffsets gave
        answers = await reader.fetch(positions, max_wait=0.1, partition_bytes=_PARTITION_BYTES, isolation_level=0)
        again = {}
        for tp, (records, _next) in answers.items():
            high = reader.watermarks.get(tp, (-1, -1, -1))[1]
            if high - count > positions[tp]:
                again[tp] = high - count
                continue
            data = records.to_bytes() or b""
            inputs = _by_offset(data, positions[tp])
            kept, errors = _run(view, data, tp[1], positions[tp])
            for offset in sorted(inputs)[-count:]:
                if offset in errors:
                    outcome = ("dropped: " if on_error == "DROP" else "the fetch fails here: ") + errors[offset]
                    rows.append(PreviewRow(tp[1], offset, _text(inputs[offset]), None, outcome))
                elif offset in kept:
                    rows.append(PreviewRow(tp[1], offset, _text(inputs[offset]), _text(kept[offset]), "in the view"))
                else:
                    rows.append(PreviewRow(tp[1], offset, _text(inputs[offset]), None, "filtered out"))
        if not again:
            break
        positions = again
    return sorted(rows, key=lambda r: (r.partition, r.offset))


def _manifest(form: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "transformation": {"type": "sql", "statement": form.get("statement", "")},
        "onError": {"type": form.get("onError", "DROP")},
    }
    if form.get("schemaRegistryConnectionName", "").strip():
        spec["schemaRegistryConnectionName"] = form["schemaRegistryConnectionName"].strip()
    return {"apiVersion": "gateway/v2", "kind": KIND, "metadata": {"name": form.get("name", "").strip()}, "spec": spec}


def _fields(manifest: dict[str, Any] | None) -> dict[str, str]:
    if manifest is None:
        return {"name": "", "statement": "", "onError": "DROP", "schemaRegistryConnectionName": ""}
    spec = manifest["spec"]
    return {
        "name": manifest["metadata"]["name"],
        "statement": spec["transformation"]["statement"],
        "onError": spec["onError"]["type"],
        "schemaRegistryConnectionName": spec.get("schemaRegistryConnectionName") or "",
    }


def _registry_decoder(read: Any) -> Any:
    async def decode(record: ShownRecord) -> Any:
        return await read(record.value, record.header(VALUE_HEADER))

    return decode


def add_pages(console: ConsolePages, services: GatewayServices) -> None:
    """Registers the topic-view pages, and, for the topic page, a decoder of record values per schema
    registry connection (``GATEWAY_EXTERNAL_CONNECTION_*``): Avro and JSON Schema values, named by a
    schema id prefix or a ``__value_schema_id`` header (an id or a GUID)."""
    console.templates(TEMPLATES)
    kind = console.kinds.get(KIND)
    decoders = ensure_runtime(services).decoders
    for name, read in decoders.readers() if decoders is not None else ():
        console.value_decoder(f"schema registry {name}", _registry_decoder(read))

    def stored() -> list[dict[str, Any]]:
        return sorted(console.store.resources(KIND), key=lambda m: str(m["metadata"]["name"]))

    async def previewed(fields: dict[str, str]) -> tuple[list[PreviewRow] | None, str | None]:
        if not fields["statement"].strip():
            return None, None
        try:
            return await preview(services, _manifest(fields)), None
        except (ViewConfigError, ValueError, KeyError) as exc:
            return None, str(exc)
        except UpstreamError as exc:
            return None, f"the cluster does not answer: {exc}"

    @console.page("topic-views", "Topic views")
    async def views_page() -> Any:
        """Every topic view: its input topic, statement, error handling and status."""
        rows = []
        for manifest in stored():
            status = (console.store.with_status(kind, manifest).get("status") or {}) if kind else {}
            rows.append({**_fields(manifest), "status": status.get("status"), "message": status.get("message")})
        return console.render("topicviews/list.html", title="Topic views", rows=rows)

    def edit(fields: dict[str, str], existing: bool, status: int = 200, **extra: Any) -> Any:
        title = f"Topic view {fields['name']}" if existing else "New topic view"
        context = {"rows": None, "problem": None, "error": None, **extra}
        return console.render("topicviews/edit.html", status, title=title, fields=fields, existing=existing, **context)

    @console.page("topic-views/edit")
    async def edit_page() -> Any:
        """The form of a new view, or of the view ``?name=``."""
        existing = next((m for m in stored() if m["metadata"]["name"] == request.args.get("name")), None)
        return edit(_fields(existing), existing is not None)

    @console.page("topic-views/preview", methods=["POST"], read_only=True)
    async def preview_page() -> Any:
        """The form again with the preview of what the view would hold (read-only users may preview);
        with ``fragment`` only the preview (the form's live region, as you type)."""
        form = dict(await console.form())
        fields = {k: form.get(k, v) for k, v in _fields(None).items()}
        rows, problem = await previewed(fields)
        if form.get("fragment"):
            return console.render("topicviews/preview.html", title="Preview", rows=rows, problem=problem, fields=fields)
        existing = any(m["metadata"]["name"] == fields["name"] for m in stored())
        return edit(fields, existing, rows=rows, problem=problem)

    @console.page("topic-views/save", methods=["POST"])
    async def save() -> Any:
        """Stores the view through the admin API's validation; a refusal shows the form again with why."""
        form = dict(await console.form())
        manifest = _manifest(form)
        if kind is None:
            return console.redirect("topic-views", "The TopicView kind is not installed.", error=True)
        try:
            change = await console.store.put(kind, manifest)
        except ResourceError as exc:
            fields = {k: form.get(k, "") for k in _fields(None)}
            return edit(fields, False, error=exc.msg, status=400)
        console.audit("PUT", kind=KIND, resourceName=manifest["metadata"]["name"], upsertResult=change.result)
        outcome = change.result.lower().replace("_", " ")  # created, updated, not changed
        return console.redirect("topic-views", f"Topic view {manifest['metadata']['name']!r} {outcome}.")

    @console.page("topic-views/delete", methods=["POST"])
    async def delete() -> Any:
        """Deletes a view (its consumers get UNKNOWN_TOPIC_OR_PARTITION from then on)."""
        name = (await console.form()).get("name", "")
        if kind is None:
            return console.redirect("topic-views", "The TopicView kind is not installed.", error=True)
        try:
            await console.store.delete(kind, kind.key_of({"name": name}))
        except ResourceError as exc:
            return console.redirect("topic-views", exc.msg, error=True)
        console.audit("DELETE", kind=KIND, resourceName=name)
        return console.redirect("topic-views", f"Topic view {name!r} deleted.")
