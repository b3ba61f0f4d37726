"""``kanal apply``, ``kanal get`` and ``kanal delete``: manifests through the admin HTTP API.

The commands reach the gateway at ``--url`` (``KANAL_URL``, default ``http://localhost:8888``) with
``--user``/``--password`` (``KANAL_USER``/``KANAL_PASSWORD``). They ask the gateway which resource
kinds it knows (``GET /gateway/v2/resource-kinds``), so every kind a plugin registers works without
changes here. Standard library only (urllib).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from kanal.api.cli import CliError
from kanal.api.errors import ConfigError
from kanal.api.services import StateLog
from kanal.config.upstream import UpstreamSettings, parse_upstream
from kanal.config.users import basic_header
from kanal.logs import configure_logging
from kanal.net.kafka_client import GatewayKafkaClient
from kanal.net.state_log import CompactedLog
from kanal.protocol.framing import DEFAULT_MAX_FRAME_SIZE

DEFAULT_URL = "http://localhost:8888"
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


class Client:
    """A small admin API client."""

    def __init__(self, url: str, user: str | None, password: str | None, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.auth = basic_header(user, password or "") if user else None
        self.timeout = timeout
        self._kinds: list[dict[str, Any]] | None = None

    def call(self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None) -> Any:
        url = self.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.auth:
            request.add_header("Authorization", self.auth)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            raise CliError(_error_text(exc.code, exc.read())) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CliError(f"cannot reach the gateway at {self.url}: {reason} (set --url or KANAL_URL)") from None
        return json.loads(payload) if payload.strip() else None

    def kinds(self) -> list[dict[str, Any]]:
        if self._kinds is None:
            self._kinds = self.call("GET", "/gateway/v2/resource-kinds")
        return self._kinds

    def kind(self, name: str) -> dict[str, Any]:
        """A kind by name, path, alias or plural, in any case."""
        wanted = name.lower()
        for kind in self.kinds():
            names = {kind["kind"].lower(), kind["path"], kind["kind"].lower() + "s", kind["path"] + "s"}
            names |= {a.lower() for a in kind["aliases"]}
            if wanted in names:
                return kind
        known = ", ".join(k["kind"] for k in self.kinds())
        raise CliError(f"unknown resource kind {name!r} (this gateway knows: {known})")


def _error_text(status: int, payload: bytes) -> str:
    try:
        body = json.loads(payload)
        text = f"{body.get('title') or 'error'}: {body.get('msg')}"
        if body.get("cause"):
            text += f" ({body['cause']})"
    except (ValueError, AttributeError):
        text = payload.decode(errors="replace").strip() or "error"
    return f"HTTP {status}: {text}"


class CommandLine:
    """:class:`kanal.api.CliContext`: what plugin commands reach, from the environment."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ

    def admin_client(self, url: str | None, user: str | None, password: str | None) -> Client:
        env = self.environ
        return Client(
            url or env.get("KANAL_URL", DEFAULT_URL),
            user or env.get("KANAL_USER"),
            password or env.get("KANAL_PASSWORD"),
        )

    def _upstream(self, purpose: str) -> UpstreamSettings:
        if not self.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
            raise ConfigError("KAFKA_BOOTSTRAP_SERVERS", f"required: the cluster {purpose}")
        return parse_upstream(self.environ, {})

    def kafka(self) -> GatewayKafkaClient:
        return GatewayKafkaClient(self._upstream("to call"), 10.0, DEFAULT_MAX_FRAME_SIZE, "kanal-cli")

    def configure_logging(self, fmt: str = "text", level: str = "info") -> None:
        configure_logging(fmt, level)

    def state_log(self, topic: str) -> StateLog:
        return CompactedLog(topic, self._upstream("holding the topic " + topic), 10.0)


def _client(args: argparse.Namespace) -> Client:
    return Client(args.url, args.user, args.password)


# -- apply ---------------------------------------------------------------------------------------


def manifest_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in MANIFEST_SUFFIXES)
    if not path.exists():
        raise CliError(f"{path}: no such file or directory")
    return [path]


def read_manifests(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, manifest) for every document of every file (``-`` reads standard input)."""
    files = [Path("-")] if str(path) == "-" else manifest_files(path)
    for file in files:
        text = sys.stdin.read() if str(file) == "-" else file.read_text()
        try:
            documents = list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            raise CliError(f"{file}: invalid YAML: {exc}") from None
        for i, document in enumerate(documents):
            if document is None:
                continue
            items = document if isinstance(document, list) else [document]
            for item in items:
                if not isinstance(item, dict) or "kind" not in item:
                    raise CliError(f"{file} (document {i + 1}): not a manifest (apiVersion, kind, metadata, spec)")
                yield f"{file}", item


def _label(manifest: dict[str, Any]) -> str:
    metadata = manifest.get("metadata") or {}
    name = metadata.get("name", "?")
    scope = metadata.get("scope") or {}
    extra = [f"{k}={v}" for k, v in scope.items() if v] if isinstance(scope, dict) else []
    extra += [f"vCluster={metadata['vCluster']}"] if metadata.get("vCluster") else []
    return f"{manifest.get('kind')}/{name}" + (f" ({', '.join(extra)})" if extra else "")


def _apply(args: argparse.Namespace) -> int:
    client = _client(args)
    failures = 0
    manifests = [m for source in args.filename for m in read_manifests(Path(source))]
    if not manifests:
        raise CliError("no manifests found")
    for where, manifest in manifests:
        kind = client.kind(str(manifest["kind"]))
        query = {"dryMode": "true"} if args.dry_run else None
        try:
            answer = client.call("PUT", f"/gateway/v2/{kind['path']}", manifest, query)
        except CliError as exc:
            failures += 1
            print(f"{_label(manifest)}: FAILED: {exc} [{where}]", file=sys.stderr)
            continue
        suffix = " (dry run)" if args.dry_run else ""
        status = (answer.get("resource") or {}).get("status") or {}
        state = f" [{status['status']}{': ' + status['message'] if status.get('message') else ''}]" if status else ""
        print(f"{_label(manifest)}: {answer['upsertResult']}{suffix}{state}")
    return 1 if failures else 0


# -- get -----------------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def _value(resource: dict[str, Any], path: str) -> Any:
    current: Any = resource
    for part in path.split("."):
        if not isinstance(current, dict):
            return None
        current = current.get(part)
    return current


def _status(args: argparse.Namespace) -> int:
    answer = _client(args).call("GET", "/versions")
    print(f"gateway       {answer.get('gateway')}")
    print(f"record walk   {answer.get('recordWalker')}")
    for plugin, version in sorted((answer.get("plugins") or {}).items()):
        print(f"plugin        {plugin} {version}")
    return 0


def _get(args: argparse.Namespace) -> int:
    client = _client(args)
    kind = client.kind(args.kind)
    query = {"name": args.name} if args.name else {}
    resources = client.call("GET", f"/gateway/v2/{kind['path']}", query=query)
    if args.name and not resources:
        raise CliError(f"{kind['kind']} {args.name!r} not found")
    if args.output == "json":
        print(json.dumps(resources[0] if args.name and len(resources) == 1 else resources, indent=2))
    elif args.output == "yaml":
        print(yaml.safe_dump_all(resources, sort_keys=False).rstrip())
    else:
        if not resources:
            print(f"No {kind['kind']} resources.")
            return 0
        columns = kind["columns"]
        used = [c for c in columns if c[0] == "NAME" or any(_value(r, c[1]) is not None for r in resources)]
        rows = [[c[0] for c in used]] + [[_cell(_value(r, c[1])) for c in used] for r in resources]
        print(table(rows))
    return 0


# -- delete --------------------------------------------------------------------------------------


def _delete(args: argparse.Namespace) -> int:
    client = _client(args)
    targets: list[tuple[dict[str, Any], str, dict[str, Any]]] = []
    if args.filename:
        for _, manifest in read_manifests(Path(args.filename)):
            kind = client.kind(str(manifest["kind"]))
            metadata = manifest.get("metadata") or {}
            body = {k: v for k, v in metadata.items() if k != "name"}
            targets.append((kind, str(metadata.get("name")), body))
    else:
        if not args.kind or not args.name:
            raise CliError("kanal delete needs KIND NAME, or -f FILE")
        kind = client.kind(args.kind)
        key: dict[str, Any] = {}
        for field, value in (("vCluster", args.vcluster), ("group", args.group), ("username", args.username)):
            if value:
                key[field] = value
        targets.append((kind, args.name, key))
    failures = 0
    for kind, name, body in targets:
        try:
            client.call("DELETE", f"/gateway/v2/{kind['path']}/{urllib.parse.quote(name, safe='')}", body or None)
        except CliError as exc:
            failures += 1
            print(f"{kind['kind']}/{name}: FAILED: {exc}", file=sys.stderr)
            continue
        print(f"{kind['kind']}/{name}: DELETED")
    return 1 if failures else 0


# -- wiring --------------------------------------------------------------------------------------


def _connection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=os.environ.get("KANAL_URL", DEFAULT_URL), help="admin API URL (KANAL_URL)")
    parser.add_argument("--user", default=os.environ.get("KANAL_USER"), help="admin API user (KANAL_USER)")
    parser.add_argument(
        "--password", default=os.environ.get("KANAL_PASSWORD"), help="admin API password (KANAL_PASSWORD)"
    )


def _guarded(handler: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            code: int = handler(args)
            return code
        except CliError as exc:
            print(f"kanal: {exc}", file=sys.stderr)
            return 1

    return run


def add_commands(commands: Any) -> None:
    apply = commands.add_parser("apply", help="create or update resources from manifests (YAML or JSON)")
    apply.add_argument(
        "-f", "--filename", action="append", required=True, help="a manifest file, a directory, or - (repeatable)"
    )
    apply.add_argument("--dry-run", action="store_true", help="validate only; store nothing")
    _connection_options(apply)
    apply.set_defaults(func=_guarded(_apply))

    get = commands.add_parser("get", help="list resources of a kind, or show one")
    get.add_argument("kind", help="resource kind (Interceptor, interceptors, topic-view, ...)")
    get.add_argument("name", nargs="?", help="resource name")
    get.add_argument("-o", "--output", choices=("table", "yaml", "json"), default="table")
    _connection_options(get)
    get.set_defaults(func=_guarded(_get))

    delete = commands.add_parser("delete", help="delete a resource")
    delete.add_argument("kind", nargs="?", help="resource kind")
    delete.add_argument("name", nargs="?", help="resource name")
    delete.add_argument("-f", "--filename", help="delete the resources of these manifests")
    delete.add_argument("--vcluster", help="scope: virtual cluster (interceptors)")
    delete.add_argument("--group", help="scope: group (interceptors)")
    delete.add_argument("--username", help="scope: username (interceptors)")
    _connection_options(delete)
    delete.set_defaults(func=_guarded(_delete))

    status = commands.add_parser("status", help="a running gateway's version, record walk and plugins")
    _connection_options(status)
    status.set_defaults(func=_guarded(_status))
