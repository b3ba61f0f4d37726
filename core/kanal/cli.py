"""The ``kanal`` command: run (production), dev (embedded broker), version."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import resource
import signal
import sys
from collections.abc import Sequence

import trio

from kanal import __version__
from kanal.admin.cli import CommandLine
from kanal.admin.service import install as install_admin
from kanal.api.errors import ConfigError, InterceptorConfigError
from kanal.config.loader import load_settings
from kanal.config.settings import KnownSettings, Settings
from kanal.embedded.dev import dev_admin_user, dev_http_port
from kanal.gateway import Gateway, Listening
from kanal.logs import configure_logging
from kanal.pipeline.registry import PluginError, PluginRegistry
from kanal.protocol.records import record_walker


def _registry() -> PluginRegistry:
    registry = PluginRegistry()
    registry.load_entry_points()
    return registry


def raise_open_file_limit() -> None:
    """Each client connection holds two sockets (client and upstream): lift the soft limit on open
    files to the hard one, so a thousand clients do not exhaust a default of 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))


async def serve(settings: Settings, registry: PluginRegistry, banner: str = "") -> int:
    """Runs a gateway until SIGINT or SIGTERM, then shuts it down gracefully; returns the exit code
    (0, or the one of what stopped the node by itself: 41 for another membership protocol in its
    fleet's group)."""
    raise_open_file_limit()
    gateway = Gateway(settings, registry)
    install_admin(gateway)  # admin HTTP API, health, metrics and the persistent resource store
    for _, services in registry.call_each("kanal_gateway_services", gateway.services_for):
        gateway.services.extend(services or ())  # plugins' companion services (kanal_gateway_services)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            serving = False

            async def run_gateway(*, task_status: trio.TaskStatus[Listening]) -> None:
                await gateway.run(task_status=task_status)
                nursery.cancel_scope.cancel()  # stopped: no more signals to wait for

            async def watch_signals() -> None:
                async for _ in signals:
                    if serving and not gateway.stopping.is_set():
                        print("Kanal: stopping (draining in-flight requests)", flush=True)
                        gateway.shutdown()
                    else:  # still starting (waiting for the cluster), or a second signal
                        print("Kanal: stopping now", flush=True)
                        nursery.cancel_scope.cancel()

            nursery.start_soon(watch_signals)
            listening: Listening = await nursery.start(run_gateway)
            serving = True
            print(
                f"Kanal {__version__} ready: clients bootstrap at {listening.bootstrap} "
                f"(ports {listening.first_port}-{listening.last_port} for brokers {listening.min_broker_id}+), "
                f"upstream {listening.upstream}{banner}",
                flush=True,
            )
    return gateway.failure.exit_code if gateway.failure is not None else 0


def _known(registry: PluginRegistry) -> KnownSettings:
    return KnownSettings(registry.declared_settings())


def _run(args: argparse.Namespace) -> int:
    try:
        registry = _registry()
        settings = load_settings(args.config, require_upstream=True, known=_known(registry))
        configure_logging(settings.log_format, settings.log_level)
        code: int = trio.run(serve, settings, registry)
    except (ConfigError, InterceptorConfigError, PluginError) as exc:
        print(f"kanal: configuration error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"kanal: {exc}", file=sys.stderr)
        return 1
    return code


def _dev_port_start() -> int:
    """6969 like production when 6969-6971 are free, else any free block of three ports."""
    import socket

    from kanal.embedded.tansu import free_port_block

    try:
        for port in (6969, 6970, 6971):
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", port))
        return 6969
    except OSError:
        return free_port_block(3)


def _dev(args: argparse.Namespace) -> int:
    from kanal.embedded.tansu import SHORT_MEMBERSHIP_TIMINGS, TansuBroker

    env = dict(os.environ)
    try:
        with TansuBroker() as broker:
            env.setdefault("KAFKA_BOOTSTRAP_SERVERS", broker.bootstrap)
            env.setdefault("GATEWAY_BIND_HOST", "127.0.0.1")
            env.setdefault("GATEWAY_ADVERTISED_HOST", "127.0.0.1")
            env.setdefault("GATEWAY_MIN_BROKERID", str(broker.node_id))
            env.setdefault("GATEWAY_PORT_COUNT", "3")
            env.setdefault("GATEWAY_PORT_START", str(_dev_port_start()))
            for name, value in SHORT_MEMBERSHIP_TIMINGS.items():  # joins its fleet in 3 s, not 23
                env.setdefault(name, value)
            dev_http_port(env)
            admin_notice = dev_admin_user(env)
            registry = _registry()
            settings = load_settings(args.config, env, known=_known(registry))
            configure_logging(settings.log_format, settings.log_level)
            print(f"Kanal dev: embedded Tansu broker at {broker.bootstrap}", flush=True)
            if admin_notice:
                admin_url = f"http://127.0.0.1:{settings.http_port}"
                print(f"{admin_notice}; admin API at {admin_url}, console at {admin_url}/console", flush=True)
            code: int = trio.run(serve, settings, registry, " (embedded Tansu; Ctrl-C stops both)")
    except (ConfigError, InterceptorConfigError, PluginError) as exc:
        print(f"kanal: configuration error: {exc}", file=sys.stderr)
        return 2
    except (OSError, RuntimeError) as exc:
        print(f"kanal dev: {exc}", file=sys.stderr)
        return 1
    return code


def _version(args: argparse.Namespace) -> int:
    walker = record_walker()
    print(f"kanal {__version__} (record walk: {walker}{'' if walker == 'compiled' else ', no C compiler at install'})")
    return 0


# Core modules that add subcommands: each defines ``add_commands(subparsers)``; a command's handler
# takes the parsed arguments and returns the exit code. Plugins add theirs through the
# ``kanal_cli_commands`` hook.
COMMAND_MODULES: tuple[str, ...] = ("kanal.conformance.cli", "kanal.admin.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kanal", description="Kanal, an open Kafka gateway.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the gateway (configured by GATEWAY_*/KAFKA_* variables)")
    run.add_argument("--config", "-c", help="YAML config file (environment variables take precedence)")
    run.set_defaults(func=_run)
    dev = commands.add_parser("dev", help="run an embedded Tansu broker with a gateway in front of it")
    dev.add_argument("--config", "-c", help="YAML config file")
    dev.set_defaults(func=_dev)
    version = commands.add_parser("version", help="print the version")
    version.set_defaults(func=_version)
    for module in COMMAND_MODULES:
        importlib.import_module(module).add_commands(commands)
    _registry().manager.hook.kanal_cli_commands(commands=commands, cli=CommandLine(os.environ))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code
