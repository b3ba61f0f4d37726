"""``kanal test-rule`` and ``kanal dq backtest``: a rule on a sample record, a policy on a topic's records.

    kanal test-rule --rule positive-amount --value '{"amount": -1}'            # a stored rule, by name
    kanal test-rule --cel "value.amount > 0" --value '{"amount": 3}'            # an inline CEL rule
    kanal test-rule --schema schema.json --value-file order.json               # an inline JSON schema
    kanal test-rule -f rule.yaml --value '...' --header x-source=web --key k1   # a DataQualityRule manifest
    kanal test-rule --local --cel "..." --value '...'                           # no gateway needed

It asks the gateway (``POST /gateway/v2/data-quality/test-rule``, same ``--url``/``--user``/``--password``
and ``KANAL_URL``/``KANAL_USER``/``KANAL_PASSWORD`` as ``kanal apply``) unless ``--local`` is given
(inline rules only; EnforceAvro and Avro payloads need the gateway's registry). Prints ``passed``,
``failed: <message>`` or ``evaluation error: <message>``; exit code 0 passed, 2 failed, 3 evaluation
error, 1 for a problem with the command itself.

``kanal dq backtest`` runs a stored or draft policy over a range of a topic's records through the
gateway (``POST /gateway/v2/data-quality/backtest``, admins only), printing its progress to standard
error and then its report::

    kanal dq backtest --policy orders --topic orders --latest 10000
    kanal dq backtest -f draft-policy.yaml --topic orders --from 2024-05-01T00:00:00Z --to 2024-05-02T00:00:00Z
    kanal dq backtest --policy orders --topic orders --offsets 0:0-5000 --offsets 1:100- --max-records 1000

Exit code 0 when no record broke the policy, 2 when some did, 1 for a problem (the backtest failed, or
was cancelled: Ctrl-C cancels it on the gateway). The plugin adds both commands through the
``kanal_cli_commands`` hook (:func:`add_commands`).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
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


# -- kanal dq backtest ----------------------------------------------------------------------------------

BACKTEST = "/gateway/v2/data-quality/backtest"
#: Seconds between two looks at a running backtest: the first soon (most backtests are short), then
#: doubling up to the last.
POLL = (0.05, 0.5)


def _offsets(items: list[str]) -> dict[str, dict[str, int]]:
    """``PARTITION:START-END`` items (either side may be left out; ``PARTITION:`` is the whole
    partition) as the API's offsets range."""
    out: dict[str, dict[str, int]] = {}
    for item in items:
        partition, sep, span = item.partition(":")
        start, dash, end = span.partition("-")
        try:
            if not sep or not partition.strip().isdigit() or (span.strip() and not dash):
                raise ValueError
            bounds = {k: int(v) for k, v in (("start", start.strip()), ("end", end.strip())) if v}
        except ValueError:
            raise _Problem(f"--offsets {item!r}: expected PARTITION:START-END (START or END may be left out)") from None
        out[partition.strip()] = bounds
    return out


def _backtest_body(args: argparse.Namespace) -> dict[str, Any]:
    if (args.policy is None) == (args.filename is None):
        raise _Problem("give exactly one of --policy NAME (a stored policy) or -f MANIFEST (a draft)")
    policy: Any = args.policy
    if args.filename is not None:
        documents = [d for d in yaml.safe_load_all(_read(args.filename)) if d is not None]
        policies = [d for d in documents if isinstance(d, dict) and d.get("kind") == "DataQualityPolicy"]
        if len(policies) != 1:
            raise _Problem(f"{args.filename}: expected one DataQualityPolicy manifest, found {len(policies)}")
        policy = policies[0]
    ranges = [
        name
        for name, given in (
            ("--latest", args.latest is not None),
            ("--offsets", bool(args.offsets)),
            ("--from/--to", args.start is not None or args.end is not None),
        )
        if given
    ]
    if len(ranges) > 1:
        raise _Problem(f"give one range: {' or '.join(ranges)}")
    body: dict[str, Any] = {"policy": policy, "topic": args.topic}
    if args.latest is not None:
        body["range"] = {"latest": args.latest}
    elif args.offsets:
        body["range"] = {"offsets": _offsets(args.offsets)}
    elif args.start is not None or args.end is not None:
        body["range"] = {k: v for k, v in (("from", args.start), ("to", args.end)) if v is not None}
    for field, value in (
        ("virtualCluster", args.virtual_cluster),
        ("partitions", args.partition),
        ("maxRecords", args.max_records),
        ("maxSeconds", args.max_seconds),
        ("samples", args.samples),
    ):
        if value is not None:
            body[field] = value
    return body


def _progress(job: dict[str, Any]) -> str:
    progress = job["progress"]
    parts = ", ".join(
        f"{p['partition']}: {max(0, p['position'] - p['start'])}/{max(0, p['end'] - p['start'])}"
        for p in progress["partitions"]
        if p["end"] >= 0
    )
    return f"backtest {job['id']}: {progress['recordsRead']} records read" + (f" (partitions {parts})" if parts else "")


def _print_report(job: dict[str, Any]) -> None:
    report = job["report"]
    what = "draft policy" if job["draft"] else "policy"
    print(f"backtest {job['id']}: {what} {job['policy']} on topic {job['topic']} ({job['state']})")
    if not job.get("targeted", True):
        print(f"  note: the policy's targets do not include topic {job['topic']}")
    if report is None:
        print(f"  error: {job.get('error')}")
        return
    rate = f", {report['recordsPerSecond']} records/s" if report.get("recordsPerSecond") else ""
    print(f"  evaluated: {report['evaluated']} records in {report['elapsedSeconds']:.3f} s{rate}")
    print(f"  violations: {report['violations']}")
    for rule in report["rules"]:
        print(f"    {rule['rule']}: {rule['violations']}")
    if report.get("missingRules"):
        print(f"  rules not evaluated (deleted?): {', '.join(report['missingRules'])}")
    if report["stoppedOn"]:
        print(f"  stopped on {report['stoppedOn']}: the range was not read to its end")
    elif not report["complete"]:
        print("  stopped before the end of the range")
    if report["samples"]:
        print("  samples:")
    for sample in report["samples"]:
        reasons = "; ".join(d["message"] + (f" ({d['reason']})" if d.get("reason") else "") for d in sample["details"])
        print(f"    partition {sample['partition']} offset {sample['offset']}: {reasons}")
        print(f"      key: {sample['key']}  value: {sample['value']}")


def _backtest(args: argparse.Namespace, cli: CliContext) -> int:
    try:
        body = _backtest_body(args)
        client = cli.admin_client(args.url, args.user, args.password)
        job: dict[str, Any] = client.call("POST", BACKTEST, body)
        try:
            shown = ""
            pause = POLL[0]
            while job["state"] == "running":
                line = _progress(job)
                if line != shown and not args.quiet:
                    print(line, file=sys.stderr)
                    shown = line
                time.sleep(pause)
                pause = min(pause * 2, POLL[1])
                job = client.call("GET", f"{BACKTEST}/{job['id']}")
        except KeyboardInterrupt:
            job = client.call("DELETE", f"{BACKTEST}/{job['id']}") or job
            print(f"kanal: backtest {job['id']} cancelled", file=sys.stderr)
    except (_Problem, CliError) as exc:
        print(f"kanal: {exc}", file=sys.stderr)
        return 1
    if args.output == "json":
        print(json.dumps(job, indent=2))
    else:
        _print_report(job)
    if job["state"] != "done":
        return 1
    return 2 if job["report"]["violations"] else 0


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser], cli: CliContext) -> None:
    """Adds ``kanal test-rule`` and ``kanal dq backtest``; ``cli`` reaches the gateway's admin API."""
    _add_test_rule(commands, cli)
    dq = commands.add_parser("dq", help="data quality: backtest a policy on a topic's records")
    actions = dq.add_subparsers(dest="dq_command", required=True)
    backtest = actions.add_parser(
        "backtest",
        help="run a stored or draft policy over a range of a topic's records, changing nothing",
        description="Runs a data quality policy over a topic's records through the gateway and reports "
        "evaluated records, violations per rule and samples. Exit code 0: no violation; 2: violations; "
        "1: a problem.",
    )
    backtest.add_argument("--policy", help="name of a DataQualityPolicy stored on the gateway")
    backtest.add_argument("-f", "--filename", help="a DataQualityPolicy manifest file: a draft, not stored")
    backtest.add_argument("--topic", required=True, help="the topic, as clients name it")
    backtest.add_argument("--virtual-cluster", help="the virtual cluster whose topic it is")
    backtest.add_argument("--partition", type=int, action="append", help="only this partition (repeatable)")
    backtest.add_argument("--latest", type=int, help="the last N records of each partition (default 1000)")
    backtest.add_argument(
        "--offsets", action="append", help="PARTITION:START-END, END exclusive, either may be left out (repeatable)"
    )
    backtest.add_argument("--from", dest="start", help="records from this time: ISO-8601 or epoch milliseconds")
    backtest.add_argument("--to", dest="end", help="records before this time: ISO-8601 or epoch milliseconds")
    backtest.add_argument("--max-records", type=int, help="stop after this many records (default 100000)")
    backtest.add_argument("--max-seconds", type=float, help="stop after this many seconds (default 60)")
    backtest.add_argument("--samples", type=int, help="violating records to show (default 20)")
    backtest.add_argument("-q", "--quiet", action="store_true", help="no progress lines on standard error")
    backtest.add_argument("-o", "--output", choices=("text", "json"), default="text")
    backtest.add_argument("--url", help="admin API URL (default KANAL_URL, else http://localhost:8888)")
    backtest.add_argument("--user", help="admin API user (default KANAL_USER)")
    backtest.add_argument("--password", help="password (default KANAL_PASSWORD)")
    backtest.set_defaults(func=lambda args: _backtest(args, cli))


def _add_test_rule(commands: argparse._SubParsersAction[argparse.ArgumentParser], cli: CliContext) -> None:
    """Adds ``kanal test-rule``."""
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
