"""``python -m vrambudget.agent [serve|openapi]``: run the probe agent (the same as
``vrambudget agent``), or print its OpenAPI document."""

from __future__ import annotations

import json
import sys


def openapi_document() -> dict[str, object]:
    from .api import create_agent_app
    from .openapi import agent_openapi_document
    from .settings import AgentSettings

    return agent_openapi_document(create_agent_app(AgentSettings()))


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["openapi"]:
        print(json.dumps(openapi_document(), indent=2, sort_keys=True))
        return
    import uvicorn

    from .api import create_agent_app
    from .settings import AgentSettings, AgentSettingsError
    from .store import Store, StoreOpenError

    try:
        settings = AgentSettings.from_env()
        _check_address(settings.host, settings.port)
        # Open (integrity-check, migrate) the store before serving: a file the agent cannot
        # use is a one-line startup error naming it, not a traceback from the startup hook.
        Store(settings.data_dir / "agent.sqlite3").close()
        app = create_agent_app(settings)  # (VRAMBUDGET_LOG_FORMAT is read here)
    except (AgentSettingsError, StoreOpenError, OSError, ValueError) as exc:
        print(f"vrambudget agent: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        # An idle keep-alive connection is closed after 5 s; a request body must arrive within
        # body_timeout_s (POST /v1/probes answers 408); beyond 1,024 connections, 503.
        timeout_keep_alive=5,
        limit_concurrency=1024,
    )


def _check_address(host: str, port: int) -> None:
    """The address resolves (else a one-line error naming VRAMBUDGET_AGENT_HOST, before
    uvicorn tries to bind it)."""
    import socket

    from .settings import AgentSettingsError

    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise AgentSettingsError(
            f"VRAMBUDGET_AGENT_HOST: cannot listen on {host!r}: {exc.strerror or exc} "
            "(allowed: an address of this host, e.g. 127.0.0.1, 0.0.0.0, ::)"
        ) from None


if __name__ == "__main__":
    main()
