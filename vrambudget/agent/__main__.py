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
        # Open (integrity-check, migrate) the store before serving: a file the agent cannot
        # use is a one-line startup error naming it, not a traceback from the startup hook.
        Store(settings.data_dir / "agent.sqlite3").close()
    except (AgentSettingsError, StoreOpenError, OSError) as exc:
        print(f"vrambudget agent: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    uvicorn.run(
        create_agent_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        # An idle keep-alive connection is closed after 5 s; a request body must arrive within
        # body_timeout_s (POST /v1/probes answers 408); beyond 1,024 connections, 503.
        timeout_keep_alive=5,
        limit_concurrency=1024,
    )


if __name__ == "__main__":
    main()
