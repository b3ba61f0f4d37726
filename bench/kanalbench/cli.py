"""``python bench/run.py SCENARIO [options]`` (or ``all``): runs, prints a table, optionally writes JSON."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from kanalbench.measure import Options, log
from kanalbench.profile import format_pstats, format_summary
from kanalbench.report import Report, format_report, write_json
from kanalbench.scenarios import SCENARIOS

OPTION_HELP = {
    "size": "record value size in bytes",
    "records": "records per run (throughput)",
    "repeats": "runs per path (ABAB order); medians are reported",
    "rate": "records per second (latency)",
    "seconds": "measured seconds per run (latency), after a 1 s warm-up",
    "linger_ms": "producer linger.ms (latency); 0 sends one record per request, which Tansu cannot take at 5k/s",
    "count": "client connections (idle-connections)",
    "partitions": "partitions of each run's topic",
    "payload": "record values: bytes (random) or json",
}


def _add_options(parser: argparse.ArgumentParser, defaults: dict[str, Any]) -> None:
    base = Options()
    for f in fields(Options):
        if f.name in OPTION_HELP:
            default = defaults.get(f.name, getattr(base, f.name))
            kind = type(default)
            extra: dict[str, Any] = {"choices": ("bytes", "json")} if f.name == "payload" else {}
            parser.add_argument(
                f"--{f.name.replace('_', '-')}",
                dest=f.name,
                type=kind,
                default=default,
                help=f"{OPTION_HELP[f.name]} (default {default})",
                **extra,
            )
    parser.add_argument("--config", type=Path, help="gateway YAML config (interceptors) to benchmark")
    parser.add_argument(
        "--gateway-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment variable for the gateway (repeatable)",
    )
    parser.add_argument("--no-warmup", action="store_true", help="skip the unmeasured warm-up run per path")
    parser.add_argument("--json", type=Path, help="also write the results as JSON to this file")
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=Path(os.environ.get("TMPDIR", "/tmp")) / "kanalbench",
        help="broker and gateway logs",
    )
    parser.add_argument("--py-spy", type=Path, help="record a py-spy profile (raw, flamegraph input) of the gateway")
    parser.add_argument("--cprofile", type=Path, help="run the gateway under cProfile, write its stats to this file")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bench/run.py", description="Kanal gateway vs direct, in one run.")
    sub = parser.add_subparsers(dest="scenario", required=True)
    for s in SCENARIOS.values():
        _add_options(sub.add_parser(s.name, help=s.help), s.defaults)
    every = sub.add_parser("all", help="every scenario (and variant) with its defaults")
    every.add_argument("--repeats", type=int, default=Options.repeats, help="runs per path")
    every.add_argument("--json", type=Path, help="also write the results as JSON to this file")
    every.add_argument("--log-dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "kanalbench")
    return parser


def _options(args: argparse.Namespace) -> Options:
    values = {f.name: getattr(args, f.name) for f in fields(Options) if hasattr(args, f.name)}
    opts = Options(**values)
    opts.warmup = not getattr(args, "no_warmup", False)
    opts.env = dict(item.split("=", 1) for item in getattr(args, "gateway_env", []))
    return opts


def _machine() -> dict[str, Any]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            check=False,
        ).stdout.strip()
    except OSError:
        commit = ""
    import confluent_kafka

    import kanal

    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "cpu": cpu,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "librdkafka": confluent_kafka.libversion()[0],
        "confluent_kafka": confluent_kafka.version()[0],
        "commit": commit,
        "kanal": str(Path(kanal.__file__).parent),
        "argv": sys.argv[1:],
    }


def _plan(args: argparse.Namespace) -> list[tuple[str, Options]]:
    if args.scenario != "all":
        return [(args.scenario, _options(args))]
    plan = []
    for s in SCENARIOS.values():
        base = replace(Options(log_dir=args.log_dir, repeats=args.repeats), **s.defaults)
        plan.append((s.name, base))
        plan.extend((s.name, replace(base, **variant)) for variant in s.variants)
    return plan


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    meta = _machine()
    print(
        f"kanalbench {meta['date']}: {meta['cores']} cores ({meta['cpu']}), Python {meta['python']}, "
        f"librdkafka {meta['librdkafka']}, commit {meta['commit'] or '?'}, gateway from {meta['kanal']}",
        flush=True,
    )
    print("broker, gateway and client processes share these cores\n", flush=True)
    reports: list[Report] = []
    for name, opts in _plan(args):
        log(f"{name}: starting (logs in {opts.log_dir})")
        report = SCENARIOS[name].run(opts, name)
        reports.append(report)
        print(format_report(report), flush=True)
        if args.json:
            write_json(args.json, reports, meta)
        if opts.py_spy is not None and opts.py_spy.exists():
            print(f"gateway profile ({opts.py_spy}, all runs of this scenario):")
            print(format_summary(opts.py_spy.read_text()), flush=True)
        if opts.cprofile is not None and opts.cprofile.exists():
            print(f"gateway cProfile ({opts.cprofile}, whole gateway life; times are inflated by the profiler):")
            print(format_pstats(opts.cprofile), flush=True)
    return 0
