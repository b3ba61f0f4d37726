"""Commands: ``kanal registry-proxy`` (serve; ``hash-password``; ``permissions apply|delete``) and
``kanal license keygen|issue|verify``, added through the ``kanal_cli_commands`` hook; the cluster is
reached through the command line's :class:`~kanal.api.CliContext`."""

from __future__ import annotations

import argparse
import functools
import gc
import getpass
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from kanal.api import CliContext, ConfigError

log = logging.getLogger(__name__)


def add_commands(commands: Any, cli: CliContext) -> None:
    proxy = commands.add_parser(
        "registry-proxy",
        help="run the schema registry proxy (configured by SRP_*, AUTH_*, SCHEMA_REGISTRY_* variables)",
        description="Runs the schema registry proxy until SIGINT/SIGTERM. See docs/registry-proxy.md.",
    )
    proxy.set_defaults(func=functools.partial(_serve, cli=cli))
    actions = proxy.add_subparsers(dest="proxy_command")
    hashing = actions.add_parser("hash-password", help="print a bcrypt hash for the basic credentials file")
    hashing.add_argument("--rounds", type=int, default=12, help="bcrypt cost (default 12)")
    hashing.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    hashing.set_defaults(func=_hash_password)
    permissions = actions.add_parser("permissions", help="reactive mode: publish application instance permissions")
    which = permissions.add_subparsers(dest="permissions_command", required=True)
    apply = which.add_parser("apply", help="publish ApplicationInstance documents (YAML or JSON) to the commands topic")
    apply.add_argument("-f", "--file", required=True, help="file with one or more ApplicationInstance documents")
    apply.set_defaults(func=functools.partial(_permissions_apply, cli=cli))
    delete = which.add_parser("delete", help="remove an application instance's permissions")
    delete.add_argument("name")
    delete.set_defaults(func=functools.partial(_permissions_delete, cli=cli))

    license_cmd = commands.add_parser("license", help="license keys and tokens")
    license_actions = license_cmd.add_subparsers(dest="license_command", required=True)
    keygen = license_actions.add_parser("keygen", help="write a new Ed25519 key pair for signing licenses")
    keygen.add_argument("--private-key", default="license-private.pem", help="file for the private key")
    keygen.add_argument("--public-key", default="license-public.pem", help="file for the public key")
    keygen.add_argument("--force", action="store_true", help="overwrite existing files")
    keygen.set_defaults(func=_keygen)
    issue = license_actions.add_parser("issue", help="print a license token signed with a private key")
    issue.add_argument("--private-key", required=True, help="the Ed25519 private key (PEM)")
    issue.add_argument("--expires", help="expiry: YYYY-MM-DD (end of that day, UTC) or an ISO 8601 date-time")
    issue.add_argument("--licensee", default="unnamed", help="who the license is for")
    issue.add_argument("--plan", default="gateway", choices=("gateway", "scale"), help="license plan")
    issue.set_defaults(func=_issue)
    verify = license_actions.add_parser("verify", help="check a token against a public key")
    verify.add_argument("token", nargs="?", help="the token (default: VENDOR_LICENSE)")
    verify.add_argument("--public-key", help="PEM text or file (default: VENDOR_LICENSE_PUBLIC_KEY)")
    verify.set_defaults(func=_verify)


# -- serving ---------------------------------------------------------------------------------------


def _serve(args: argparse.Namespace, cli: CliContext) -> int:
    from kanal_registry_proxy import tracing
    from kanal_registry_proxy.service import standalone
    from kanal_registry_proxy.settings import load_settings

    env = os.environ
    cli.configure_logging(
        (env.get("SRP_LOG_FORMAT") or "json").strip().lower(), (env.get("SRP_LOG_LEVEL") or "info").strip()
    )
    try:
        settings = load_settings(env)
        writer = None
        if settings.access_log and logging.getLogger("kanal_registry_proxy.access").isEnabledFor(logging.INFO):
            from kanal_registry_proxy.accesslog import AccessLog

            writer = AccessLog(fmt=settings.log_format)
        service = standalone(settings, cli, access_writer=writer)
    except ConfigError as exc:
        log.error("the schema registry proxy cannot start: %s", exc, extra={"event": "startup_refused", "key": exc.key})
        print(f"kanal registry-proxy: cannot start: {exc}", file=sys.stderr)
        return 2
    tracing.configure(settings.traces_exporter, settings.service_name)
    gc.collect()
    gc.freeze()  # what startup built lives on: keep it out of the collector's way (shorter pauses)

    async def main() -> None:
        stop = trio.Event()

        async def trigger() -> None:
            await stop.wait()

        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def watch() -> None:
                    async for _ in signals:
                        if stop.is_set():
                            nursery.cancel_scope.cancel()
                        stop.set()

                nursery.start_soon(watch)
                binds = await nursery.start(
                    lambda task_status: service.serve(task_status=task_status, shutdown_trigger=trigger)
                )
                print(f"Kanal schema registry proxy ready on {', '.join(binds)} ({service.describe()})", flush=True)
                await stop.wait()
                with trio.move_on_after(5):
                    while service.ready:
                        await trio.sleep(0.05)
                nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    except OSError as exc:
        print(f"kanal registry-proxy: {exc}", file=sys.stderr)
        return 1
    return 0


def _hash_password(args: argparse.Namespace) -> int:
    from kanal_registry_proxy.auth_basic import hash_password

    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = getpass.getpass("Password: ")
        if getpass.getpass("Again: ") != password:
            print("kanal: the passwords differ", file=sys.stderr)
            return 2
    try:
        print(hash_password(password, args.rounds))
    except ValueError as exc:
        print(f"kanal: {exc}", file=sys.stderr)
        return 2
    return 0


def _permissions_apply(args: argparse.Namespace, cli: CliContext) -> int:
    import orjson
    import yaml

    from kanal_registry_proxy.reactive import KEY_PREFIX, CommandError, parse_command

    try:
        documents = [d for d in yaml.safe_load_all(Path(args.file).read_text()) if d is not None]
    except (OSError, yaml.YAMLError) as exc:
        print(f"kanal: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    records = []
    for document in documents:
        name = document.get("metadata", {}).get("name") if isinstance(document, dict) else None
        key, value = f"{KEY_PREFIX}{name}".encode(), orjson.dumps(document)
        try:
            parse_command(key, value)
        except CommandError as exc:
            print(f"kanal: {args.file}: {exc}", file=sys.stderr)
            return 2
        records.append((key, value))
    return _publish(cli, records)


def _permissions_delete(args: argparse.Namespace, cli: CliContext) -> int:
    from kanal_registry_proxy.reactive import KEY_PREFIX

    return _publish(cli, [(f"{KEY_PREFIX}{args.name}".encode(), None)])


def _publish(cli: CliContext, records: Sequence[tuple[bytes, bytes | None]]) -> int:
    """Appends permission commands (a None value deletes) to the commands topic, creating it."""
    from kanal_registry_proxy.settings import COMMANDS_TOPIC

    topic = os.environ.get("SRP_COMMANDS_TOPIC") or COMMANDS_TOPIC
    try:
        commands = cli.state_log(topic)  # the cluster of KAFKA_BOOTSTRAP_SERVERS (and KAFKA_*)
    except ConfigError as exc:
        print(f"kanal: {exc}", file=sys.stderr)
        return 2

    async def main() -> None:
        try:
            await commands.ensure_topic()
            for key, value in records:
                offset = await commands.append(key, value)
                done = "published to" if value is not None else "deleted in"
                print(f"{key.decode()} {done} {topic} at offset {offset}")
        finally:
            await commands.aclose()

    trio.run(main)
    return 0


# -- licenses --------------------------------------------------------------------------------------


def _keygen(args: argparse.Namespace) -> int:
    from kanal_registry_proxy.license import generate_keypair

    private_path, public_path = Path(args.private_key), Path(args.public_key)
    for path in (private_path, public_path):
        if path.exists() and not args.force:
            print(f"kanal: {path} exists (use --force to overwrite)", file=sys.stderr)
            return 2
    private_pem, public_pem = generate_keypair()
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(private_pem)
    public_path.write_bytes(public_pem)
    print(f"private key: {private_path} (keep it secret)\npublic key: {public_path} (VENDOR_LICENSE_PUBLIC_KEY)")
    return 0


def _issue(args: argparse.Namespace) -> int:
    from kanal_registry_proxy.license import LicenseError, issue, parse_expiry

    try:
        private_pem = Path(args.private_key).read_bytes()
        expires = parse_expiry(args.expires) if args.expires else None
        print(issue(private_pem, args.licensee, expires, args.plan))
    except (OSError, ValueError, TypeError) as exc:
        kind = "license" if isinstance(exc, LicenseError) else "key"
        print(f"kanal: {kind}: {exc}", file=sys.stderr)
        return 2
    return 0


def _verify(args: argparse.Namespace) -> int:
    from kanal_registry_proxy.license import LicenseError, check_license
    from kanal_registry_proxy.settings import read_pem

    token = args.token or os.environ.get("VENDOR_LICENSE")
    key = args.public_key or os.environ.get("VENDOR_LICENSE_PUBLIC_KEY")
    if not token or not key:
        print("kanal: give a token and --public-key (or VENDOR_LICENSE and VENDOR_LICENSE_PUBLIC_KEY)", file=sys.stderr)
        return 2
    try:
        found = check_license(token, read_pem(key, "--public-key"))
    except (LicenseError, ConfigError) as exc:
        print(f"kanal: invalid license: {exc}", file=sys.stderr)
        return 1
    print(f"valid: {found.describe()}")
    return 0
