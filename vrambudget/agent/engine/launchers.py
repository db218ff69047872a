"""The serving engines a host lets the agent start, from ``VRAMBUDGET_AGENT_ENGINES``: a JSON
object of engine -> the argv prefix that starts it, e.g.

    {"vllm": ["/opt/vllm/bin/vllm"],
     "sglang": ["/opt/sgl/bin/python", "-m", "sglang.launch_server"],
     "llama_cpp": ["/usr/local/bin/llama-server"]}

The prefix replaces the program words of the deployment recipe (``serving.launch``: ``vllm``,
``python -m sglang.launch_server``, ``llama-server``); the rest of the command is the recipe's.
The program must be an absolute path to an executable file (no ``PATH`` lookup decides what
runs). Ollama is not an engine a probe can start (its recipe is a server plus an API call).
"""

from __future__ import annotations

import json
import os

__all__ = ["ENGINES", "RECIPE_PROGRAM", "UNSUPPORTED", "parse_engines"]

RECIPE_PROGRAM: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm",),
    "sglang": ("python", "-m", "sglang.launch_server"),
    "llama_cpp": ("llama-server",),
}
"""The words that start each engine in a recipe (``serving.launch``)."""

ENGINES = tuple(RECIPE_PROGRAM)
UNSUPPORTED = {"ollama": "ollama is not supported for engine probes (vllm, sglang, llama_cpp are)"}


def parse_engines(raw: str | None) -> dict[str, tuple[str, ...]]:
    """engine -> argv prefix; raises ``ValueError`` saying what is wrong (the caller names the
    variable)."""
    if raw is None or not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(  # noqa: TRY004 -- one error type for every malformed setting
            'must be a JSON object, e.g. {"vllm": ["/opt/vllm/bin/vllm"]}'
        )
    out: dict[str, tuple[str, ...]] = {}
    for engine, prefix in value.items():
        if engine in UNSUPPORTED:
            raise ValueError(UNSUPPORTED[engine])
        if engine not in RECIPE_PROGRAM:
            raise ValueError(f"unknown engine {engine!r}; engines: {', '.join(ENGINES)}")
        if (
            not isinstance(prefix, list)
            or not prefix
            or not all(isinstance(x, str) and x and "\0" not in x for x in prefix)
        ):
            raise ValueError(f"{engine}: the argv prefix must be a non-empty list of strings")
        program = prefix[0]
        if not os.path.isabs(program):
            raise ValueError(f"{engine}: {program!r} is not an absolute path")
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            raise ValueError(f"{engine}: {program} is not an executable file")
        out[engine] = tuple(prefix)
    return out
