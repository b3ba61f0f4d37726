"""The test registry's state and its HTTP behaviour, pinned to the captured Karapace traffic.

Pure: :meth:`Registry.handle` takes (method, raw path, query, headers, body) and returns (status,
headers, body). What it does, as Karapace did in ``captures/registry/karapace.jsonl``:

- subjects with versions, soft and permanent deletion, ``deleted=true`` listings; one id per distinct
  schema (a schema registered under two subjects keeps its id); schemas stored in a canonical form
  (JSON with sorted keys, no spaces), so whitespace or key order never makes a new version;
- Avro (parsed with fastavro, references resolved), JSON Schema (checked with jsonschema), Protobuf
  stored as given; compatibility per subject or global level, checked at registration and on
  ``POST /compatibility/subjects/{s}/versions/{v}``;
- Karapace's dialect: ``GET /schemas/ids/{id}/versions`` answers ``[]`` for an unknown id, ``GET
  /mode/{s}`` the global mode, no GUIDs, contexts, associations, exporters or compatibility against
  all versions (``404 "Not Found"``), ``PUT/DELETE /mode`` and ``DELETE /config`` 405, a missing
  request Content-Type a 500, content negotiation (406, 415), one trailing ``/`` ignored;
- optionally Karapace's authfile mode (users, and Read/Write permissions on ``Subject:<regex>`` and
  ``Config:``; Write implies Read; denials disguised as 40401/40403, global ones 403).
"""

from __future__ import annotations

import base64
import binascii
import re
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote_plus

import orjson

from kanal_registry_proxy.testing.compat import LEVELS, avro_problems, json_problems

Headers = list[tuple[bytes, bytes]]
VND = "application/vnd.schemaregistry.v1+json"
_ACCEPTED_REQUEST_TYPES = (
    "application/vnd.schemaregistry.v1+json",
    "application/vnd.schemaregistry+json",
    "application/json",
    "application/octet-stream",
)
SCHEMA_TYPES = ("AVRO", "JSON", "PROTOBUF")
MAX_VERSION = 2**31 - 1


class _Answer(Exception):
    def __init__(self, status: int, body: Any, content_type: str | None = None, raw: bytes | None = None) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.raw = raw


def _err(status: int, code: int, message: Any) -> _Answer:
    return _Answer(status, {"error_code": code, "message": message})


def _not_found() -> _Answer:
    return _Answer(404, "Not Found", "application/json")


@dataclass
class Schema:
    id: int
    schema_type: str
    text: str  # canonical
    references: list[dict[str, Any]]
    parsed: Any = None


@dataclass
class Version:
    version: int
    schema_id: int
    deleted: bool = False


@dataclass
class Subject:
    name: str
    versions: dict[int, Version] = field(default_factory=dict)
    compatibility: str | None = None

    def live(self) -> list[Version]:
        return [v for v in self.versions.values() if not v.deleted]


@dataclass
class Permission:
    username: str
    operation: str  # Read or Write
    resource: re.Pattern[str]


class Registry:
    """The state of one test registry; :meth:`handle` is thread-safe."""

    def __init__(self, users: dict[str, str] | None = None, permissions: list[dict[str, str]] | None = None) -> None:
        self.schemas: dict[int, Schema] = {}
        self._by_content: dict[tuple[str, str, str], int] = {}
        self.subjects: dict[str, Subject] = {}
        self.compatibility = "BACKWARD"
        self.mode = "READWRITE"
        self.next_id = 1
        self.users = users
        self.permissions = [
            Permission(p["username"], p["operation"], re.compile(p["resource"])) for p in permissions or []
        ]
        self.lock = threading.Lock()
        self.requests = 0
        # the last requests received (method, raw path, query, headers, body), for tests
        self.seen: deque[tuple[str, bytes, bytes, Headers, bytes]] = deque(maxlen=1000)

    # -- HTTP -----------------------------------------------------------------------------------

    def handle(
        self, method: str, raw_path: bytes, query: bytes, headers: Headers, body: bytes
    ) -> tuple[int, Headers, bytes]:
        with self.lock:
            self.requests += 1
            self.seen.append((method, raw_path, query, headers, body))
            try:
                content_type = self._negotiate(headers)
                result = self._route(method, raw_path, query, headers, body)
                answer = _Answer(200, result)
            except _Answer as exc:
                answer = exc
                content_type = exc.content_type or (content_type if exc.status != 406 else VND)
            except _Negotiation as exc:
                answer = _Answer(406, {"message": "HTTP 406 Not Acceptable"})
                content_type = VND
                del exc
        payload = answer.raw if answer.raw is not None else orjson.dumps(answer.body)
        return answer.status, [(b"content-type", (answer.content_type or content_type).encode())], payload

    @staticmethod
    def _negotiate(headers: Headers) -> str:
        accept = next((v.decode("latin-1") for k, v in headers if k == b"accept"), "")
        if not accept.strip():
            return VND
        for item in accept.split(","):
            media = item.split(";")[0].strip().lower()
            if media in ("*/*", "application/*", VND):
                return VND
            if media == "application/vnd.schemaregistry+json":
                return media
            if media == "application/json":
                return media
        raise _Negotiation()

    def _route(self, method: str, raw_path: bytes, query: bytes, headers: Headers, body: bytes) -> Any:
        path = raw_path.decode("latin-1")
        if path.endswith("/") and len(path) > 1:
            path = path[:-1]
        parts = [unquote_plus(p) for p in path.split("/")[1:]] if path != "/" else []
        params = {k: v for k, v in parse_qsl(query.decode("latin-1"), keep_blank_values=True)}
        if parts == [] and method == "GET":
            raise _Answer(200, {}, "application/json")
        user = self._authenticate(parts, method, headers)
        n = len(parts)
        head = parts[0] if parts else ""
        # which routes exist (for 405 against 404)
        if head == "subjects":
            if n == 1:
                self._only(method, "GET")
                return self._list_subjects(params, user)
            subject = parts[1]
            if n == 2:
                self._only(method, "POST", "DELETE")
                if method == "POST":
                    return self._lookup(subject, self._body(headers, body), params, user)
                return self._delete_subject(subject, params, user)
            if parts[2] == "versions":
                if n == 3:
                    self._only(method, "GET", "POST")
                    if method == "POST":
                        return self._register(subject, self._body(headers, body), params, user)
                    return self._versions(subject, params, user)
                if n == 4:
                    self._only(method, "GET", "DELETE")
                    if method == "DELETE":
                        return self._delete_version(subject, parts[3], params, user)
                    return self._get_version(subject, parts[3], params, user)
                if n == 5 and parts[4] in ("schema", "referencedby"):
                    self._only(method, "GET")
                    if parts[4] == "schema":
                        found = self._get_version(subject, parts[3], params, user)
                        raise _Answer(200, None, raw=self.schemas[found["id"]].text.encode())
                    return self._referenced_by(subject, parts[3], params, user)
        elif head == "compatibility" and n == 5 and parts[1] == "subjects" and parts[3] == "versions":
            self._only(method, "POST")
            return self._compatibility(parts[2], parts[4], self._body(headers, body), params, user)
        elif head == "schemas":
            if n == 1:
                self._only(method, "GET")
                return self._list_schemas(params, user)
            if n == 2 and parts[1] == "types":
                self._only(method, "GET")
                return ["JSON", "AVRO", "PROTOBUF"]
            if parts[1] == "ids" and n in (3, 4):
                if n == 4 and parts[3] != "versions":
                    raise _not_found()
                self._only(method, "GET")
                if not parts[2].isdigit():
                    raise _err(404, 404, "HTTP 404 Not Found")
                if n == 3:
                    return self._schema_by_id(int(parts[2]), params, user)
                return self._id_versions(int(parts[2]), params, user)
        elif head == "config" and n in (1, 2):
            if n == 1:
                self._only(method, "GET", "PUT")
                self._require(user, "Read" if method == "GET" else "Write", "Config:", config=True)
                if method == "GET":
                    return {"compatibilityLevel": self.compatibility}
                level = self._level(self._body(headers, body))
                self.compatibility = level
                return {"compatibility": level}
            self._only(method, "GET", "PUT", "DELETE")
            return self._subject_config(
                method, parts[1], self._body(headers, body) if method == "PUT" else None, params, user
            )
        elif head == "mode" and n in (1, 2):
            self._only(method, "GET")
            if n == 1:
                self._require(user, "Read", "Config:", config=True)
                return {"mode": self.mode}
            self._require(user, "Read", f"Subject:{parts[1]}")
            self._subject(parts[1], params)
            return {"mode": self.mode}
        raise _not_found()

    @staticmethod
    def _only(method: str, *allowed: str) -> None:
        if method not in allowed:
            raise _Answer(405, "Method Not Allowed", "application/json")

    @staticmethod
    def _body(headers: Headers, body: bytes) -> Any:
        content_type = next((v.decode("latin-1") for k, v in headers if k == b"content-type"), None)
        if content_type is None:
            raise _Answer(500, None, "text/plain; charset=utf-8", raw=b"Internal Server Error")
        if content_type.split(";")[0].strip().lower() not in _ACCEPTED_REQUEST_TYPES:
            raise _Answer(415, {"message": "HTTP 415 Unsupported Media Type"}, VND)
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise _err(
                422,
                422,
                [
                    {
                        "type": "json_invalid",
                        "loc": ["body", exc.pos],
                        "msg": "JSON decode error",
                        "input": {},
                        "ctx": {"error": exc.msg},
                    }
                ],
            ) from None

    # -- authfile mode ----------------------------------------------------------------------------

    def _authenticate(self, parts: list[str], method: str, headers: Headers) -> str | None:
        if self.users is None or parts == ["schemas", "types"]:
            return None
        header = next((v for k, v in headers if k == b"authorization"), b"")
        scheme, _, value = header.partition(b" ")
        try:
            user, _, password = base64.b64decode(value).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            user, password = "", ""
        if scheme.lower() != b"basic" or self.users.get(user) != password or not user:
            raise _Answer(401, {"message": "Unauthorized"}, VND)
        return user

    def _allowed(self, user: str | None, operation: str, resource: str) -> bool:
        if self.users is None:
            return True
        for permission in self.permissions:
            if permission.username != user or not permission.resource.match(resource):
                continue
            if permission.operation == operation or (permission.operation == "Write" and operation == "Read"):
                return True
        return False

    def _require(self, user: str | None, operation: str, resource: str, config: bool = False) -> None:
        if self._allowed(user, operation, resource):
            return
        if config:
            raise _Answer(403, {"message": "Forbidden"}, VND)
        subject = resource.partition(":")[2]
        raise _err(404, 40401, f"Subject '{subject}' not found.")

    # -- helpers ----------------------------------------------------------------------------------

    def _subject(self, name: str, params: dict[str, str], allow_deleted: bool = False) -> Subject:
        subject = self.subjects.get(name)
        if subject is None or not subject.versions or (not subject.live() and not allow_deleted):
            raise _err(404, 40401, f"Subject '{name}' not found.")
        return subject

    @staticmethod
    def _flag(params: dict[str, str], name: str) -> bool:
        return params.get(name, "false").lower() == "true"

    @staticmethod
    def _version_number(text: str) -> int | None:
        """None for latest; 42202 for anything that is not a version."""
        if text in ("latest", "-1"):
            return None
        if text.isdigit() and 1 <= int(text) <= MAX_VERSION:
            return int(text)
        raise _err(
            422,
            42202,
            f"The specified version '{text}' is not a valid version id. "
            'Allowed values are between [1, 2^31-1] and the string "latest"',
        )

    def _find_version(self, subject: Subject, text: str, deleted: bool) -> Version:
        number = self._version_number(text)
        candidates = subject.versions.values() if deleted else subject.live()
        if number is None:
            ordered = sorted(candidates, key=lambda v: v.version)
            if not ordered:
                raise _err(404, 40402, "Version -1 not found.")
            return ordered[-1]
        version = subject.versions.get(number)
        if version is None or (version.deleted and not deleted):
            raise _err(404, 40402, f"Version {number} not found.")
        return version

    def _describe(self, subject: str, version: Version) -> dict[str, Any]:
        schema = self.schemas[version.schema_id]
        out: dict[str, Any] = {"subject": subject, "version": version.version, "id": schema.id, "schema": schema.text}
        if schema.schema_type != "AVRO":
            out["schemaType"] = schema.schema_type
        if schema.references:
            out["references"] = schema.references
        return out

    def _level(self, document: Any) -> str:
        level = document.get("compatibility") if isinstance(document, dict) else None
        if level not in LEVELS:
            raise _err(422, 42203, "Invalid compatibility level")
        return str(level)

    # -- schemas ----------------------------------------------------------------------------------

    def _parse_request(
        self, document: Any, for_compatibility: bool = False
    ) -> tuple[str, Any, str, list[dict[str, Any]]]:
        """(schema type, parsed schema, canonical text, references) of a register/lookup body."""
        if not isinstance(document, dict) or "schema" not in document:
            raise _err(
                422,
                422,
                [{"type": "missing", "loc": ["body", "schema"], "msg": "Field required", "input": document}],
            )
        schema_type = document.get("schemaType") or "AVRO"
        if schema_type not in SCHEMA_TYPES:
            raise _err(
                422,
                422,
                [
                    {
                        "type": "enum",
                        "loc": ["body", "schemaType"],
                        "msg": "Input should be 'AVRO', 'JSON' or 'PROTOBUF'",
                        "input": schema_type,
                        "ctx": {"expected": "'AVRO', 'JSON' or 'PROTOBUF'"},
                    }
                ],
            )
        text = document["schema"]
        references = document.get("references") or []
        if not isinstance(text, str) or not text.strip():
            raise _err(422, 42201, "Empty schema")
        if schema_type == "PROTOBUF":
            return schema_type, None, text, references
        label = "SchemaType.AVRO" if schema_type == "AVRO" else "SchemaType.JSONSCHEMA"
        try:
            parsed = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            if for_compatibility:
                raise _err(422, 42201, f"Invalid {label.replace('JSONSCHEMA', 'JSON')} schema") from None
            raise _err(422, 42201, f"Invalid {schema_type} schema. Error: {exc.msg}") from None
        named = self._referenced_names(references, schema_type)
        problem = self._validate(schema_type, parsed, named)
        if problem is not None:
            if for_compatibility:
                raise _err(422, 42201, f"Invalid {label.replace('JSONSCHEMA', 'JSON')} schema")
            if references:
                raise _err(
                    422,
                    42201,
                    f"Invalid {schema_type} schema. Error: Invalid schema {text} with refs "
                    f"{self._refs_text(references)} of type {label}",
                )
            if schema_type == "JSON":
                raise _err(
                    422, 42201, f"Invalid JSON schema. Error: Invalid schema {text} with refs None of type {label}"
                )
            raise _err(422, 42201, f"Invalid AVRO schema. Error: {problem}")
        canonical = orjson.dumps(parsed, option=orjson.OPT_SORT_KEYS).decode()
        return schema_type, parsed, canonical, references

    @staticmethod
    def _refs_text(references: list[dict[str, Any]]) -> str:
        items = ", ".join(
            f"{{name='{r.get('name')}', subject='{r.get('subject')}', version={r.get('version')}}}" for r in references
        )
        return f"[{items}]"

    def _referenced_names(self, references: list[dict[str, Any]], schema_type: str) -> dict[str, Any] | None:
        """Named Avro types of the referenced schemas; None when a reference is missing."""
        named: dict[str, Any] = {}
        for reference in references:
            subject = self.subjects.get(str(reference.get("subject")))
            version = subject.versions.get(int(reference.get("version", -1))) if subject else None
            if version is None or version.deleted:
                return None
            schema = self.schemas[version.schema_id]
            if schema_type == "AVRO" and schema.schema_type == "AVRO":
                from kanal_registry_proxy.testing.compat import collect_names

                inner = self._referenced_names(schema.references, "AVRO") or {}
                named.update(inner)
                collect_names(schema.parsed, named)
        return named

    @staticmethod
    def _validate(schema_type: str, parsed: Any, named: dict[str, Any] | None) -> str | None:
        if named is None:
            return "a reference names a subject version that does not exist"
        if schema_type == "AVRO":
            import fastavro
            from fastavro.schema import SchemaParseException, UnknownType

            named_schemas: dict[str, Any] = {}
            try:
                for definition in named.values():
                    clean = {k: v for k, v in definition.items() if k != "__fullname__"}
                    fastavro.parse_schema(clean, named_schemas=named_schemas)
                fastavro.parse_schema(parsed, named_schemas=named_schemas)
            except (SchemaParseException, UnknownType, ValueError, TypeError, KeyError, AttributeError) as exc:
                return f"{type(exc).__name__}: {exc}"
            return None
        import jsonschema

        try:
            if not isinstance(parsed, (dict, bool)):
                raise jsonschema.SchemaError("not an object")
            validator = jsonschema.validators.validator_for(parsed, default=jsonschema.Draft7Validator)
            validator.check_schema(parsed)
        except jsonschema.SchemaError as exc:
            return str(exc.message)
        return None

    def _problems(
        self,
        subject: Subject,
        schema_type: str,
        parsed: Any,
        references: list[dict[str, Any]],
        against: list[Version],
        level: str,
    ) -> list[str]:
        if level == "NONE" or schema_type == "PROTOBUF":
            return []
        problems: list[str] = []
        new_names = self._referenced_names(references, schema_type) or {}
        for version in against:
            old = self.schemas[version.schema_id]
            if old.schema_type != schema_type:
                problems.append(f"schema type changed from {old.schema_type} to {schema_type}")
                continue
            directions = []
            if level.startswith(("BACKWARD", "FULL")):
                directions.append(
                    (parsed, old.parsed, new_names, self._referenced_names(old.references, schema_type) or {})
                )
            if level.startswith(("FORWARD", "FULL")):
                directions.append(
                    (old.parsed, parsed, self._referenced_names(old.references, schema_type) or {}, new_names)
                )
            for reader, writer, rn, wn in directions:
                if schema_type == "AVRO":
                    problems += avro_problems(reader, writer, rn, wn)
                else:
                    problems += json_problems(reader, writer)
        return problems

    def _level_of(self, subject: Subject | None) -> str:
        return (subject.compatibility if subject is not None else None) or self.compatibility

    def _against(self, subject: Subject, level: str) -> list[Version]:
        live = sorted(subject.live(), key=lambda v: v.version)
        if not live:
            return []
        return live if level.endswith("TRANSITIVE") else [live[-1]]

    # -- endpoints --------------------------------------------------------------------------------

    def _register(self, name: str, document: Any, params: dict[str, str], user: str | None) -> Any:
        self._require(user, "Write", f"Subject:{name}")
        schema_type, parsed, canonical, references = self._parse_request(document)
        key = (schema_type, canonical, orjson.dumps(references).decode())
        subject = self.subjects.get(name)
        existing_id = self._by_content.get(key)
        if subject is not None and existing_id is not None:
            for version in subject.live():
                if version.schema_id == existing_id:
                    return {"id": existing_id}
        if subject is not None:
            level = self._level_of(subject)
            problems = self._problems(subject, schema_type, parsed, references, self._against(subject, level), level)
            if problems:
                raise _err(
                    409,
                    409,
                    f"Incompatible schema, compatibility_mode={level}. Incompatibilities: {', '.join(problems)}",
                )
        if existing_id is None:
            existing_id = self.next_id
            self.next_id += 1
            self.schemas[existing_id] = Schema(existing_id, schema_type, canonical, references, parsed)
            self._by_content[key] = existing_id
        if subject is None:
            subject = self.subjects[name] = Subject(name)
        number = max(subject.versions, default=0) + 1
        subject.versions[number] = Version(number, existing_id)
        return {"id": existing_id}

    def _lookup(self, name: str, document: Any, params: dict[str, str], user: str | None) -> Any:
        self._require(user, "Read", f"Subject:{name}")
        subject = self._subject(name, params, self._flag(params, "deleted"))
        schema_type, _, canonical, references = self._parse_request(document)
        schema_id = self._by_content.get((schema_type, canonical, orjson.dumps(references).decode()))
        candidates = subject.versions.values() if self._flag(params, "deleted") else subject.live()
        for version in sorted(candidates, key=lambda v: v.version):
            if version.schema_id == schema_id:
                return self._describe(name, version)
        raise _err(404, 40403, "Schema not found")

    def _list_subjects(self, params: dict[str, str], user: str | None) -> Any:
        deleted = self._flag(params, "deleted")
        return [
            s.name
            for s in self.subjects.values()
            if s.versions and (deleted or s.live()) and self._allowed(user, "Read", f"Subject:{s.name}")
        ]

    def _versions(self, name: str, params: dict[str, str], user: str | None) -> Any:
        self._require(user, "Read", f"Subject:{name}")
        deleted = self._flag(params, "deleted")
        subject = self._subject(name, params, deleted)
        versions = subject.versions.values() if deleted else subject.live()
        return sorted(v.version for v in versions)

    def _get_version(self, name: str, text: str, params: dict[str, str], user: str | None) -> Any:
        self._require(user, "Read", f"Subject:{name}")
        deleted = self._flag(params, "deleted")
        subject = self._subject(name, params, deleted)
        return self._describe(name, self._find_version(subject, text, deleted))

    def _referenced_by(self, name: str, text: str, params: dict[str, str], user: str | None) -> Any:
        self._require(user, "Read", f"Subject:{name}")
        subject = self._subject(name, params)
        version = self._find_version(subject, text, False)
        return sorted(self._referrers(name, version.version))

    def _referrers(self, name: str, number: int) -> set[int]:
        ids: set[int] = set()
        for other in self.subjects.values():
            for version in other.live():
                for reference in self.schemas[version.schema_id].references:
                    if reference.get("subject") == name and int(reference.get("version", -1)) == number:
                        ids.add(version.schema_id)
        return ids

    def _delete_subject(self, name: str, params: dict[str, str], user: str | None) -> Any:
        self._require(user, "Write", f"Subject:{name}")
        subject = self.subjects.get(name)
        if subject is None or not subject.versions:
            raise _err(404, 40401, f"Subject '{name}' not found.")
        permanent = self._flag(params, "permanent")
        live = sorted(v.version for v in subject.live())
        if permanent:
            if live:
                raise _err(404, 40405, f"Subject '{name}' was not deleted first before being permanently deleted")
            numbers = sorted(subject.versions)
            del self.subjects[name]
            return numbers
        if not live:
            raise _err(404, 40404, f"Subject '{name}' was soft deleted.Set permanent=true to delete permanently")
        for number in live:
            if self._referrers(name, number):
                raise _err(
                    422,
                    42206,
                    "One or more references exist to the schema "
                    f"{{magic=1,keytype=SCHEMA,subject={name},version={number}}}.",
                )
        for version in subject.live():
            version.deleted = True
        return live

    def _delete_version(self, name: str, text: str, params: dict[str, str], user: str | None) -> Any:
        self._require(user, "Write", f"Subject:{name}")
        permanent = self._flag(params, "permanent")
        subject = self._subject(name, params, True)
        version = self._find_version(subject, text, True)
        if permanent:
            if not version.deleted:
                raise _err(
                    404,
                    40407,
                    f"Subject '{name}' Version {version.version} was not deleted first "
                    "before being permanently deleted",
                )
            del subject.versions[version.version]
            return version.version
        if version.deleted:
            raise _err(
                404,
                40406,
                f"Subject '{name}' Version {version.version} was soft deleted. "
                "Set permanent=true to delete permanently",
            )
        if self._referrers(name, version.version):
            raise _err(
                422,
                42206,
                "One or more references exist to the schema "
                f"{{magic=1,keytype=SCHEMA,subject={name},version={version.version}}}.",
            )
        version.deleted = True
        return version.version

    def _compatibility(self, name: str, text: str, document: Any, params: dict[str, str], user: str | None) -> Any:
        self._require(user, "Read", f"Subject:{name}")
        number = self._version_number(text)
        subject = self.subjects.get(name)
        if subject is None or not subject.live():
            raise _err(404, 40402, f"Version {-1 if number is None else number} not found.")
        version = self._find_version(subject, text, False)
        schema_type, parsed, _, references = self._parse_request(document, for_compatibility=True)
        level = self._level_of(subject)
        against = self._against(subject, level) if level.endswith("TRANSITIVE") else [version]
        problems = self._problems(subject, schema_type, parsed, references, against, level)
        if problems:
            return {"is_compatible": False, "messages": problems}
        return {"is_compatible": True}

    def _list_schemas(self, params: dict[str, str], user: str | None) -> Any:
        latest_only = self._flag(params, "latestOnly")
        out: list[dict[str, Any]] = []
        for subject in self.subjects.values():
            if not self._allowed(user, "Read", f"Subject:{subject.name}"):
                continue
            versions = sorted(subject.live(), key=lambda v: v.version)
            if latest_only:
                versions = versions[-1:]
            for version in versions:
                schema = self.schemas[version.schema_id]
                out.append(
                    {
                        "subject": subject.name,
                        "schema": schema.text,
                        "version": version.version,
                        "id": schema.id,
                        "schemaType": schema.schema_type,
                        "references": schema.references or None,
                    }
                )
        return out

    def _holders(self, schema_id: int, deleted: bool) -> list[tuple[str, int]]:
        found: list[tuple[str, int]] = []
        for subject in self.subjects.values():
            for version in subject.versions.values() if deleted else subject.live():
                if version.schema_id == schema_id:
                    found.append((subject.name, version.version))
        return sorted(found)

    def _schema_by_id(self, schema_id: int, params: dict[str, str], user: str | None) -> Any:
        schema = self.schemas.get(schema_id)
        if schema is None:
            raise _err(404, 40403, "Schema not found")
        holders = self._holders(schema_id, True)
        if self.users is not None and not any(self._allowed(user, "Read", f"Subject:{s}") for s, _ in holders):
            raise _err(404, 40403, "Schema not found")
        out: dict[str, Any] = {"schema": schema.text}
        if schema.schema_type != "AVRO":
            out["schemaType"] = schema.schema_type
        if schema.references:
            out["references"] = schema.references
        if self._flag(params, "includeSubjects"):
            out["subjects"] = sorted({s for s, _ in self._holders(schema_id, False)})
        if self._flag(params, "fetchMaxId"):
            out["maxId"] = self.next_id - 1
        return out

    def _id_versions(self, schema_id: int, params: dict[str, str], user: str | None) -> Any:
        return [
            {"subject": s, "version": v}
            for s, v in self._holders(schema_id, self._flag(params, "deleted"))
            if self._allowed(user, "Read", f"Subject:{s}")
        ]

    def _subject_config(self, method: str, name: str, document: Any, params: dict[str, str], user: str | None) -> Any:
        self._require(user, "Read" if method == "GET" else "Write", f"Subject:{name}")
        if method == "PUT":
            level = self._level(document)
            subject = self.subjects.get(name)
            if subject is None:
                subject = self.subjects[name] = Subject(name)
            subject.compatibility = level
            return {"compatibility": level}
        subject = self._subject(name, params)
        if method == "DELETE":
            subject.compatibility = None
            return {"compatibility": self.compatibility}
        if subject.compatibility is None:
            if self._flag(params, "defaultToGlobal"):
                return {"compatibilityLevel": self.compatibility}
            raise _err(404, 40408, f"Subject '{name}' does not have subject-level compatibility configured")
        return {"compatibilityLevel": subject.compatibility}


class _Negotiation(Exception):
    pass
