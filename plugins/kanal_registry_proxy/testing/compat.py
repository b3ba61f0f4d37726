"""Schema compatibility for the test registry: Avro schema resolution, a JSON Schema subset.

Avro follows the specification's resolution rules (reader against writer): same primitive or a
promotion (int to long/float/double, long to float/double, float to double, string and bytes),
records by name with every reader field either in the writer (with compatible types) or defaulted,
enums by name with the writer's symbols known to the reader (or a reader default), arrays, maps,
fixed (name and size), and unions (every writer branch readable; a non-union writer readable by some
reader branch). Messages follow Karapace's: ``reader type: string not compatible with writer type: long``.

JSON Schema: a new ``required`` property, a changed property ``type`` and closing
``additionalProperties`` are incompatible (reader = the schema that must accept the other's data).
"""

from __future__ import annotations

from typing import Any

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_PROMOTIONS = {
    "int": {"long", "float", "double"},
    "long": {"float", "double"},
    "float": {"double"},
    "string": {"bytes"},
    "bytes": {"string"},
}
LEVELS = (
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
    "NONE",
)


def _fullname(name: str, namespace: str | None) -> str:
    if "." in name or not namespace:
        return name
    return f"{namespace}.{name}"


def collect_names(schema: Any, names: dict[str, Any], namespace: str | None = None) -> None:
    """Adds every named type (record, enum, fixed) of ``schema`` to ``names`` by full name."""
    if isinstance(schema, list):
        for branch in schema:
            collect_names(branch, names, namespace)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if kind in ("record", "error", "enum", "fixed") and isinstance(schema.get("name"), str):
            ns = schema.get("namespace", namespace)
            full = _fullname(schema["name"], ns)
            names[full] = {**schema, "__fullname__": full}
            namespace = full.rpartition(".")[0] or None
            for field in schema.get("fields", []) if kind in ("record", "error") else []:
                if isinstance(field, dict):
                    collect_names(field.get("type"), names, namespace)
        elif kind == "array":
            collect_names(schema.get("items"), names, namespace)
        elif kind == "map":
            collect_names(schema.get("values"), names, namespace)
        elif isinstance(kind, (dict, list)):
            collect_names(kind, names, namespace)


def _resolve(schema: Any, names: dict[str, Any], namespace: str | None) -> Any:
    if isinstance(schema, str) and schema not in PRIMITIVES:
        return names.get(_fullname(schema, namespace), names.get(schema, schema))
    if (
        isinstance(schema, dict)
        and isinstance(schema.get("type"), str)
        and schema["type"] in PRIMITIVES
        and len([k for k in schema if k not in ("logicalType", "precision", "scale")]) == 1
    ):
        return schema["type"]
    if isinstance(schema, dict) and isinstance(schema.get("type"), (dict, list)):
        return schema["type"]
    if (
        isinstance(schema, dict)
        and isinstance(schema.get("type"), str)
        and schema["type"] not in PRIMITIVES
        and schema["type"] not in ("record", "error", "enum", "fixed", "array", "map")
    ):
        return _resolve(schema["type"], names, namespace)
    return schema


def _kind(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, str):
        return schema
    if isinstance(schema, dict):
        kind = schema.get("type")
        return "record" if kind == "error" else str(kind)
    return "unknown"


class _Avro:
    def __init__(self, reader_names: dict[str, Any], writer_names: dict[str, Any]) -> None:
        self.rn = reader_names
        self.wn = writer_names
        self.seen: set[tuple[str, str]] = set()

    def check(self, reader: Any, writer: Any, rns: str | None = None, wns: str | None = None) -> list[str]:
        r = _resolve(reader, self.rn, rns)
        w = _resolve(writer, self.wn, wns)
        rk, wk = _kind(r), _kind(w)
        if wk == "union":
            problems: list[str] = []
            for branch in w:
                problems += self.check(r, branch, rns, wns)
            return problems
        if rk == "union":
            for branch in r:
                if not self.check(branch, w, rns, wns):
                    return []
            return [f"reader union lacking writer type: {wk}"]
        if rk in PRIMITIVES or wk in PRIMITIVES:
            if rk == wk or rk in _PROMOTIONS.get(wk, ()):
                return []
            return [f"reader type: {rk} not compatible with writer type: {wk}"]
        if rk != wk:
            return [f"reader type: {rk} not compatible with writer type: {wk}"]
        if rk == "record":
            return self._record(r, w)
        if rk == "enum":
            if r.get("__fullname__", r.get("name")) != w.get("__fullname__", w.get("name")) and not self._aliased(r, w):
                return [f"expected: {w.get('name')}"]
            missing = [s for s in w.get("symbols", []) if s not in r.get("symbols", [])]
            if missing and "default" not in r:
                return [f"reader missing symbols: {', '.join(missing)}"]
            return []
        if rk == "fixed":
            if r.get("size") != w.get("size"):
                return [f"expected: {w.get('size')}, found: {r.get('size')}"]
            return []
        if rk == "array":
            return self.check(r.get("items"), w.get("items"), rns, wns)
        if rk == "map":
            return self.check(r.get("values"), w.get("values"), rns, wns)
        return []

    @staticmethod
    def _aliased(r: dict[str, Any], w: dict[str, Any]) -> bool:
        return w.get("name") in r.get("aliases", []) or w.get("__fullname__") in r.get("aliases", [])

    def _record(self, r: dict[str, Any], w: dict[str, Any]) -> list[str]:
        rname, wname = r.get("__fullname__", r.get("name")), w.get("__fullname__", w.get("name"))
        if rname != wname and r.get("name") != w.get("name") and not self._aliased(r, w):
            return [f"expected: {w.get('name')}"]
        key = (str(rname), str(wname))
        if key in self.seen:
            return []
        self.seen.add(key)
        rns = str(rname).rpartition(".")[0] or None
        wns = str(wname).rpartition(".")[0] or None
        writer_fields = {f["name"]: f for f in w.get("fields", []) if isinstance(f, dict)}
        for f in w.get("fields", []):
            for alias in f.get("aliases", []) if isinstance(f, dict) else []:
                writer_fields.setdefault(alias, f)
        problems: list[str] = []
        for field in r.get("fields", []):
            if not isinstance(field, dict):
                continue
            source = writer_fields.get(field["name"])
            if source is None:
                for alias in field.get("aliases", []):
                    source = writer_fields.get(alias)
                    if source is not None:
                        break
            if source is None:
                if "default" not in field:
                    problems.append(f"reader field '{field['name']}' has no default value and is missing in writer")
                continue
            problems += self.check(field.get("type"), source.get("type"), rns, wns)
        return problems


def avro_problems(reader: Any, writer: Any, reader_refs: dict[str, Any], writer_refs: dict[str, Any]) -> list[str]:
    """Why data written with ``writer`` cannot be read with ``reader`` (empty when it can)."""
    rn, wn = dict(reader_refs), dict(writer_refs)
    collect_names(reader, rn)
    collect_names(writer, wn)
    return _Avro(rn, wn).check(reader, writer)


def _json_type(schema: Any) -> Any:
    return schema.get("type") if isinstance(schema, dict) else None


def json_problems(reader: Any, writer: Any, path: str = "#") -> list[str]:
    """Why data valid under ``writer`` may be invalid under ``reader`` (a subset of the rules)."""
    if not isinstance(reader, dict) or not isinstance(writer, dict):
        return []
    problems: list[str] = []
    rt, wt = _json_type(reader), _json_type(writer)
    if rt is not None and wt is not None and rt != wt and not (rt == "number" and wt == "integer"):
        problems.append(f"{path}: type changed from {wt} to {rt}")
        return problems
    new_required = set(reader.get("required", [])) - set(writer.get("required", []))
    for name in sorted(new_required):
        problems.append(f"{path}: property {name!r} became required")
    if reader.get("additionalProperties") is False and writer.get("additionalProperties") is not False:
        problems.append(f"{path}: additionalProperties closed")
    rprops, wprops = reader.get("properties", {}), writer.get("properties", {})
    if isinstance(rprops, dict) and isinstance(wprops, dict):
        for name in sorted(set(rprops) & set(wprops)):
            problems += json_problems(rprops[name], wprops[name], f"{path}/properties/{name}")
    return problems
