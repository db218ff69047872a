"""The allowed-origins setting of both apps, parsed without Litestar: the probe agent's
settings (and the GPU campaign, which runs on machines without Litestar) read it too."""

from __future__ import annotations

import re

__all__ = ["parse_origins"]

_ORIGIN = re.compile(
    r"^(?P<scheme>https?)://(?P<wild>\*\.)?"
    r"(?P<host>[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*"
    r"|\[[0-9a-f:.]+\])(?::(?P<port>\d{1,5}))?$"
)
_DEFAULT_PORT = {"http": "80", "https": "443"}


def parse_origins(value: str, setting: str) -> tuple[str, ...]:
    """The allowed origins of a comma-separated setting: ``*`` (any origin, alone), or origins
    as browsers send them (``https://catalog.example.com``, ``http://127.0.0.1:8080``), or a
    host's subdomains (``https://*.example.com``). Empty: CORS off. A malformed entry raises
    ValueError naming ``setting``, the entry and the form."""
    entries = [e.strip() for e in value.split(",") if e.strip()]
    if entries == ["*"]:
        return ("*",)
    out: list[str] = []
    for entry in entries:
        if entry == "*":
            raise ValueError(f"{setting}: '*' allows every origin and must stand alone")
        m = _ORIGIN.match(entry.lower())
        if m is None:
            raise ValueError(
                f"{setting}: {entry!r} is not an origin; write scheme://host[:port] without a "
                "path or a trailing slash (e.g. https://catalog.example.com, "
                "https://*.example.com, http://127.0.0.1:8080), or '*' alone"
            )
        port = m.group("port")
        if port is not None and not 1 <= int(port) <= 65535:
            raise ValueError(f"{setting}: {entry!r} has port {port}; allowed: 1 .. 65535")
        if port == _DEFAULT_PORT[m.group("scheme")]:
            port = None  # browsers leave the scheme's default port out of Origin
        out.append(
            f"{m.group('scheme')}://{m.group('wild') or ''}{m.group('host')}"
            + (f":{port}" if port else "")
        )
    return tuple(dict.fromkeys(out))
