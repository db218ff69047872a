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
    from .settings import AgentSettings

    settings = AgentSettings.from_env()
    uvicorn.run(
        create_agent_app(settings), host=settings.host, port=settings.port, log_level="warning"
    )


if __name__ == "__main__":
    main()
