"""``kanal capture`` and ``kanal conformance``.

::

    kanal capture --output traffic.jsonl [--config FILE] [--redact-sasl] [--redact-records]
        Runs the gateway exactly like ``kanal run`` and records every frame it moves, client side
        and upstream side, until SIGINT/SIGTERM.
    kanal capture import-pcap FILE --broker-port N [--broker-port M] --output OUT [--redact-...]
        Turns a tcpdump capture (pcap or pcapng) of broker ports into the same JSONL frames.
    kanal conformance run [DIR|FILE] [-k TEXT] [--suggest]
        Replays every case under DIR (default ./conformance) through an in-process gateway against
        a scripted broker, prints a diff by field path for each mismatch, exits 1 on failure.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import Any

import trio

from kanal import __version__
from kanal.admin.service import install as install_admin
from kanal.api.errors import ConfigError, InterceptorConfigError
from kanal.config.loader import load_settings
from kanal.config.settings import KnownSettings
from kanal.conformance.capture import CaptureTap, Redactor
from kanal.conformance.frames import write_frames
from kanal.conformance.pcap import PcapError, import_pcap
from kanal.conformance.replay import CaseError, discover_cases, run_case, suggest_expectations
from kanal.gateway import Gateway, Listening
from kanal.logs import configure_logging
from kanal.pipeline.registry import PluginError, PluginRegistry


def add_commands(subparsers: Any) -> None:
    capture = subparsers.add_parser(
        "capture",
        help="run the gateway and record its traffic as JSONL frames (or import a pcap)",
        description="Runs the gateway like `kanal run` and records every frame it moves, both sides, "
        "to --output until stopped. `kanal capture import-pcap` converts a tcpdump capture instead.",
    )
    capture.add_argument("--config", "-c", help="YAML config file (environment variables take precedence)")
    capture.add_argument("--output", "-o", help="the JSONL file to write")
    _redaction_options(capture)
    capture.set_defaults(func=_capture)
    actions = capture.add_subparsers(dest="capture_command", metavar="{import-pcap}")
    pcap = actions.add_parser("import-pcap", help="convert a pcap/pcapng file of broker traffic to JSONL frames")
    pcap.add_argument("file", help="pcap or pcapng file (tcpdump -s 0 -w FILE 'tcp port N')")
    pcap.add_argument(
        "--broker-port",
        type=int,
        action="append",
        required=True,
        help="a broker's TCP port (repeat for several brokers); tells the two directions apart",
    )
    pcap.add_argument("--output", "-o", required=True, help="the JSONL file to write")
    _redaction_options(pcap)
    pcap.set_defaults(func=_import_pcap)

    conformance = subparsers.add_parser("conformance", help="replay captured Kafka traffic through the gateway")
    commands = conformance.add_subparsers(dest="conformance_command", required=True)
    run = commands.add_parser(
        "run",
        help="replay conformance cases against a scripted broker",
        description="Replays every case (a *.jsonl capture, or a *.case.yaml) under DIR through an in-process "
        "gateway whose upstream is a scripted broker answering from the capture, and compares "
        "what the client receives with the capture. Exits 1 when a case fails.",
    )
    run.add_argument(
        "dir", nargs="?", default="conformance", help="folder, case file or capture (default: conformance)"
    )
    run.add_argument("-k", dest="select", help="only the cases whose name contains this text")
    run.add_argument(
        "--suggest",
        action="store_true",
        help="for failing cases, print the expect: entries that would document the differences",
    )
    run.add_argument(
        "--log-level",
        default="error",
        choices=("debug", "info", "warning", "error"),
        help="gateway log level during the replay (default: error)",
    )
    run.set_defaults(func=_conformance_run)


def _redaction_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--redact-sasl",
        action="store_true",
        help="replace SASL authentication bytes (SaslAuthenticate, raw tokens after SaslHandshake v0)",
    )
    parser.add_argument(
        "--redact-records",
        action="store_true",
        help="mask record keys, values and header values in Produce requests and Fetch responses",
    )


# -- kanal capture ------------------------------------------------------------------------------


async def _serve_capturing(gateway: Gateway, tap: CaptureTap, output: str) -> None:
    """Like ``kanal run``, with the tap; a signal while the upstream is still awaited stops at once."""
    gateway.tap = tap
    started = trio.Event()
    flusher = trio.CancelScope()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                async for _ in signals:
                    if not started.is_set():
                        nursery.cancel_scope.cancel()  # still waiting for the upstream: nothing to drain
                    else:
                        print("Kanal: stopping (draining in-flight requests)", flush=True)
                        gateway.shutdown()
                    return

            async def run_gateway(task_status: trio.TaskStatus[Listening] = trio.TASK_STATUS_IGNORED) -> None:
                await gateway.run(task_status=task_status)
                flusher.cancel()  # drained: stop flushing, the caller flushes once more

            async def flush_regularly() -> None:
                with flusher:
                    while True:
                        await trio.sleep(1)
                        tap.flush()

            nursery.start_soon(stop_on_signal)
            listening: Listening = await nursery.start(run_gateway)
            started.set()
            print(
                f"Kanal {__version__} capturing to {output}: clients bootstrap at {listening.bootstrap}, "
                f"upstream {listening.upstream}",
                flush=True,
            )
            nursery.start_soon(flush_regularly)


def _capture(args: argparse.Namespace) -> int:
    if not args.output:
        print("kanal capture: --output FILE is required (or use `kanal capture import-pcap`)", file=sys.stderr)
        return 2
    try:
        registry = PluginRegistry()
        registry.load_entry_points()
        settings = load_settings(args.config, require_upstream=True, known=KnownSettings(registry.declared_settings()))
        configure_logging(settings.log_format, settings.log_level)
        gateway = Gateway(settings, registry)
        install_admin(gateway)  # as `kanal run`: admin API, health, metrics, persisted resources
        with Path(args.output).open("wb") as out:
            tap = CaptureTap(out, redact_sasl=args.redact_sasl, redact_records=args.redact_records)
            try:
                trio.run(_serve_capturing, gateway, tap, args.output)
            finally:
                tap.flush()
                print(f"kanal capture: {tap.count} frames written to {args.output}", flush=True)
    except (ConfigError, InterceptorConfigError, PluginError) as exc:
        print(f"kanal: configuration error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"kanal capture: {exc}", file=sys.stderr)
        return 1
    return 0


def _import_pcap(args: argparse.Namespace) -> int:
    try:
        data = Path(args.file).read_bytes()
        result = import_pcap(data, args.broker_port)
    except OSError as exc:
        print(f"kanal capture import-pcap: {exc}", file=sys.stderr)
        return 1
    except PcapError as exc:
        print(f"kanal capture import-pcap: {args.file}: {exc}", file=sys.stderr)
        return 2
    redactor = Redactor(sasl=args.redact_sasl, records=args.redact_records)
    frames = [redactor(f) for f in result.frames]
    count = write_frames(args.output, frames)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"{count} frames from {result.connections} connections ({result.packets} packets) written to {args.output}")
    return 0


# -- kanal conformance run -----------------------------------------------------------------------


def _conformance_run(args: argparse.Namespace) -> int:
    configure_logging("text", args.log_level)
    root = Path(args.dir)
    if not root.exists():
        print(f"kanal conformance: {root} does not exist", file=sys.stderr)
        return 2
    try:
        cases = discover_cases(root)
    except CaseError as exc:
        print(f"kanal conformance: {exc}", file=sys.stderr)
        return 2
    if args.select:
        cases = [c for c in cases if args.select in c.name]
    if not cases:
        print(f"kanal conformance: no cases under {root}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    failed = 0
    for case in cases:
        try:
            result = run_case(case)
        except (CaseError, ConfigError, InterceptorConfigError, PluginError) as exc:
            print(f"ERROR {case.name}: {exc}", flush=True)
            failed += 1
            continue
        print(result.report(), flush=True)
        if not result.ok:
            failed += 1
            if args.suggest:
                suggestion = suggest_expectations(result)
                if suggestion:
                    where = case.case_path or f"{case.capture_path.with_suffix('')}.case.yaml"
                    print(f"  # to document these differences, add to {where}:")
                    print("\n".join(f"  {line}" for line in suggestion.splitlines()), flush=True)
    elapsed = time.perf_counter() - started
    print(f"{len(cases) - failed} passed, {failed} failed ({elapsed:.2f} s)")
    return 1 if failed else 0
