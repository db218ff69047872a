"""The engine's argv, built from the deployment recipe (``serving.launch`` of the estimate for
this workload and GPU), never from the request: the host's launcher replaces the recipe's
program words, the model word is replaced by what the engine loads (a preset's repository, or
its directory in a model directory; llama.cpp's GGUF file under ``VRAMBUDGET_AGENT_GGUF_DIR``),
and the address the agent chose is added in the engine's syntax.

Nothing of the request reaches the command as text: the recipe is made of the estimate's
numbers and literals, and the one word that comes from the spec (the model) is replaced. Every
word is checked anyway (shlex words, each of a small character set, a flag only where the
recipe has one; before the program only the ``NAME=VALUE`` settings of :data:`RECIPE_ENV`, which
go to the engine's environment), so a recipe that somehow carried more is refused rather than
run.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from .launchers import RECIPE_PROGRAM

__all__ = ["CommandError", "engine_command", "recipe_env"]

_WORD = re.compile(r"^[A-Za-z0-9_.,:/=+-]+$")
_FLAG = re.compile(r"^--?[a-z][a-z0-9-]*$")
_NUMBER = re.compile(r"^-[0-9]+(?:\.[0-9]+)?$")
_MODEL_FLAG = {"sglang": "--model-path", "llama_cpp": "-m"}
RECIPE_ENV: dict[str, frozenset[str]] = {"VLLM_USE_FLASHINFER_SAMPLER": frozenset({"0", "1"})}
"""Environment variables a recipe may set before its program (``NAME=VALUE`` words), with the
values allowed: the budget assumed them (``flashinfer_sampler``)."""


class CommandError(ValueError):
    """A recipe the agent will not run (the message says why)."""


def _address(engine: str, port: int) -> list[str]:
    """Where the engine listens, in its own flags (vLLM, SGLang and llama-server all spell them
    ``--host`` / ``--port``). SGLang serves ``/metrics`` (its retraction counter) only with
    ``--enable-metrics``."""
    extra = ["--enable-metrics"] if engine == "sglang" else []
    return ["--host", "127.0.0.1", "--port", str(port), *extra]


def gguf_path(recipe_file: str, gguf_dir: str | None) -> str:
    """llama.cpp's model file: the recipe's ``-m`` name under the GGUF directory (which it must
    not leave), or the name as it is without one."""
    if gguf_dir is None:
        return recipe_file
    base = Path(gguf_dir).resolve()
    path = (base / recipe_file).resolve()
    if not path.is_relative_to(base):
        raise CommandError(f"{recipe_file!r} is outside the GGUF directory")
    return str(path)


def _words(launch: str) -> list[str]:
    try:
        return shlex.split(launch)
    except ValueError as exc:
        raise CommandError(f"the recipe does not parse: {exc}") from None


def recipe_env(launch: str) -> dict[str, str]:
    """The ``NAME=VALUE`` words before the recipe's program: only the names and values of
    :data:`RECIPE_ENV`; anything else there is refused."""
    env: dict[str, str] = {}
    for word in _words(launch):
        name, eq, value = word.partition("=")
        if not eq or word.startswith("-"):
            break
        if value not in RECIPE_ENV.get(name, frozenset()):
            raise CommandError(f"the recipe may not set {word!r}")
        env[name] = value
    return env


def engine_command(
    engine: str,
    launch: str,
    prefix: tuple[str, ...],
    model: str,
    port: int,
    gguf_dir: str | None = None,
) -> list[str]:
    """The argv that starts ``engine`` as ``launch`` says, with ``prefix`` as its program,
    ``model`` (vLLM / SGLang: what the engine loads) in the model's place, on
    127.0.0.1:``port``."""
    words = _words(launch)
    words = words[len(recipe_env(launch)) :]
    program = list(RECIPE_PROGRAM[engine])
    if words[: len(program)] != program:
        raise CommandError(f"the recipe does not start with {' '.join(program)!r}: {launch!r}")
    rest = words[len(program) :]
    for word in rest:
        if not _WORD.match(word):
            raise CommandError(f"the recipe's word {word!r} is not allowed")
        if word.startswith("-") and not (_FLAG.match(word) or _NUMBER.match(word)):
            raise CommandError(f"the recipe's word {word!r} is not a flag")
        if word in ("--host", "--port"):
            raise CommandError("the recipe may not choose the address")
    if engine == "vllm":
        if len(rest) < 2 or rest[0] != "serve" or rest[1].startswith("-"):
            raise CommandError(f"not a 'vllm serve MODEL' recipe: {launch!r}")
        rest[1] = model
    else:
        flag = _MODEL_FLAG[engine]
        if rest.count(flag) != 1 or rest.index(flag) + 1 >= len(rest):
            raise CommandError(f"the recipe names no single model ({flag}): {launch!r}")
        at = rest.index(flag) + 1
        if rest[at].startswith("-"):
            raise CommandError(f"the recipe's model {rest[at]!r} is a flag")
        rest[at] = model if engine == "sglang" else gguf_path(rest[at], gguf_dir)
    return [*prefix, *rest, *_address(engine, port)]
