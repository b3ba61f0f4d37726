"""``{{variable}}`` templates of the safeguard interceptors (header values, client ids): parsed
once when the interceptor is configured into a ``str.format_map`` pattern, and the variables every
template may read of a client connection."""

from __future__ import annotations

import re

from kanal.api import Connection

__all__ = ["compile_template", "connection_variables", "host", "variables"]

_VARIABLE = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")


def variables(template: str) -> list[str]:
    """The variables ``template`` uses, once each, in order."""
    return list(dict.fromkeys(_VARIABLE.findall(template)))


def compile_template(template: str) -> str:
    """``template`` as a ``str.format_map`` pattern (its other braces escaped)."""
    pieces: list[str] = []
    pos = 0
    for match in _VARIABLE.finditer(template):
        pieces.append(template[pos : match.start()].replace("{", "{{").replace("}", "}}"))
        pieces.append("{" + match.group(1) + "}")
        pos = match.end()
    pieces.append(template[pos:].replace("{", "{{").replace("}", "}}"))
    return "".join(pieces)


def host(address: str) -> str:
    """``host`` of ``host:port`` (``[::1]:9092`` gives ``::1``)."""
    return address.rsplit(":", 1)[0].strip("[]")


def connection_variables(connection: Connection, client_id: str | None) -> dict[str, str]:
    """What a template reads of the client: its address, principal (``anonymous`` without one),
    virtual cluster (empty outside one) and client id."""
    return {
        "userIp": host(connection.client_address),
        "user": connection.principal or "anonymous",
        "vcluster": connection.vcluster or "",
        "clientId": client_id or "",
    }
