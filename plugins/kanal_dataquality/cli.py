"""``kanal test-rule``: test a data quality rule against a sample key, value and headers.

    kanal test-rule --rule positive-amount --value '{"amount": -1}'            # a stored rule, by name
    kanal test-rule --cel "value.amount > 0" --value '{"amount": 3}'            # an inline CEL rule
    kanal test-rule --schema schema.json --value-file order.json               # an inline JSON schema
    kanal test-rule -f rule.yaml --value '...' --header x-source=web --key k1   # a DataQualityRule manifest
    kanal test-rule --local --cel "..." --value '...'                           # no gateway needed

It asks the gateway (``POST /gateway/v2/data-quality/test-rule``, same ``--url``/``--user``/``--password``
and ``KANAL_URL``/``KANAL_USER``/``KANAL_PASSWORD`` as ``kanal apply``) unless ``--local`` is given
(inline rules only; EnforceAvro and Avro payloads need the gateway's registry). Prints ``passed``,
``failed: <message>`` or ``evaluation error: <message>``; exit code 0 passed, 2 failed, 3 evaluation
error, 1 for a problem with the command itself. The plugin adds the command through the
``kanal_cli_commands`` hook (:func:`add_commands`).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from kanal.api import CliContext, CliError

__all__ = ["add_commands"]

EXIT = {"passed": 0, "failed": 2, "evaluationError": 3}


class _Problem(Exception):
    pass


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    file = Path(path)
    if not file.is_file():
        raise _Problem(f"{path}: no such file")
    return file.read_text()


def _rule(args: argparse.Namespace) -> Any:
    given = [x for x in (args.rule, args.cel, args.schema, args.filename) if x is not None]
    if len(given) != 1:
        raise _Problem("give exactly one of --rule NAME, --cel EXPRESSION, --schema FILE, -f MANIFEST")
    if args.rule is not None:
        return args.rule
    if args.cel is not None:
        return {"type": "Cel", "celExpression": args.cel}
    if args.schema is not None:
        text = _read(args.schema)
        try:
            schema = json.loads(text)
        except ValueError:
            schema = yaml.safe_load(text)
        return {"type": "JsonSchema", "schema": schema}
    documents = [d for d in yaml.safe_load_all(_read(args.filename)) if d is not None]
    rules = [d for d in documents if isinstance(d, dict) and d.get("kind", "DataQualityRule") == "DataQualityRule"]
    if len(rules) != 1:
        raise _Problem(f"{args.filename}: expected one DataQualityRule manifest, found {len(rules)}")
    return rules[0]


def _body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {"rule": _rule(args)}
    if args.key is not None:
        body["key"] = args.key
    if args.value is not None and args.value_file is not None:
        raise _Problem("give --value or --value-file, not both")
    if args.value is not None:
        body["value"] = args.value
    if args.value_file is not None:
        raw = Path(args.value_file).read_bytes() if args.value_file != "-" else sys.stdin.buffer.read()
        try:
            body["value"] = raw.decode("utf-8")
        except UnicodeDecodeError:
            body["valueBase64"] = base64.b64encode(raw).decode()
    headers: dict[str, str] = {}
    for item in args.header or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise _Problem(f"--header {item!r}: expected NAME=VALUE")
        headers[name] = value
    if headers:
        body["headers"] = headers
    return body


def _local(body: dict[str, Any]) -> dict[str, Any]:
    import trio

    from kanal_dataquality.rules import RuleCompileError
    from kanal_dataquality.testrule import ERROR, SampleError, compile_for_test, run_test

    if isinstance(body["rule"], str):
        raise _Problem("--local tests inline rules only (--cel, --schema, -f); a stored rule needs the gateway")
    try:
        rule = compile_for_test(body["rule"])
    except RuleCompileError as exc:
        return {"result": ERROR, "message": str(exc)}
    try:
        answer: dict[str, Any] = trio.run(run_test, rule, body, None)
    except SampleError as exc:
        raise _Problem(str(exc)) from None
    return answer


def _remote(args: argparse.Namespace, body: dict[str, Any], cli: CliContext) -> dict[str, Any]:
    try:
        answer: dict[str, Any] = cli.admin_client(args.url, args.user, args.password).call(
            "POST", "/gateway/v2/data-quality/test-rule", body
        )
    except CliError as exc:
        raise _Problem(str(exc)) from None
    return answer


def _test_rule(args: argparse.Namespace, cli: CliContext) -> int:
    try:
        body = _body(args)
        answer = _local(body) if args.local else _remote(args, body, cli)
    except _Problem as exc:
        print(f"kanal: {exc}", file=sys.stderr)
        return 1
    if args.output == "json":
        print(json.dumps(answer, indent=2))
    else:
        result = answer.get("result")
        if result == "passed":
            print("passed")
        elif result == "failed":
            reason = f" ({answer['reason']})" if answer.get("reason") else ""
            print(f"failed: {answer.get('message')}{reason}")
        else:
            print(f"evaluation error: {answer.get('message')}")
    return EXIT.get(str(answer.get("result")), 1)


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser], cli: CliContext) -> None:
    """Adds ``kanal test-rule``; ``cli`` reaches the gateway's admin API."""
    parser = commands.add_parser(
        "test-rule", help="test a data quality rule on a sample key, value and headers (passed, failed, error)"
    )
    parser.add_argument("--rule", help="name of a DataQualityRule stored on the gateway (or EnforceAvro)")
    parser.add_argument("--cel", help="an inline CEL expression over key, value and headers")
    parser.add_argument("--schema", help="a file holding an inline JSON schema")
    parser.add_argument("-f", "--filename", help="a DataQualityRule manifest file")
    parser.add_argument("--key", help="the sample key (text)")
    parser.add_argument("--value", help="the sample value (text, usually JSON)")
    parser.add_argument("--value-file", help="a file holding the sample value (binary files are sent as bytes)")
    parser.add_argument("--header", action="append", help="a sample header NAME=VALUE (repeatable)")
    parser.add_argument("--local", action="store_true", help="evaluate here, without a gateway (inline rules)")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    parser.add_argument("--url", help="admin API URL (default KANAL_URL, else http://localhost:8888)")
    parser.add_argument("--user", help="admin API user (default KANAL_USER)")
    parser.add_argument("--password", help="password (default KANAL_PASSWORD)")
    parser.set_defaults(func=lambda args: _test_rule(args, cli))
