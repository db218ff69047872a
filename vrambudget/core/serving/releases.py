"""Which release's accounting answers a request: per engine, the modelled releases (each with
its own rules), a requested version mapped onto the newest modelled release at or before it.

A request names ``engine_version`` as the engine does (``0.11.2``, ``0.5.4.post1``, ``b6500``);
a release between two modelled ones uses the earlier one and the answer says so. A version
before the first modelled release, or after the newest, is refused with the range: the rules
of releases nobody has read are not guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache, lru_cache

from ..errors import InvalidWorkload
from ..stack import version_tuple
from .engines import NEWEST_READ, modelled_releases

__all__ = ["VLLM_TORCH", "EngineRelease", "engine_release", "parse_version", "vllm_pinned_torch"]


@dataclass(frozen=True, slots=True)
class EngineRelease:
    engine: str
    requested: str
    """The version the request named (or the default: the newest modelled)."""
    modelled: str
    """The release whose rules apply."""
    note: str | None
    """Why ``modelled`` differs from ``requested``, or None."""


_NUM = re.compile(
    r"^(?:b(?P<build>[0-9]+)|(?P<dotted>[0-9]+(?:\.[0-9]+)*)(?:\.post(?P<post>[0-9]+))?)$"
)


def parse_version(engine: str, v: str) -> tuple[int, ...]:
    """``0.11.2`` → (0, 11, 2, 0); ``0.5.4.post1`` → (0, 5, 4, 1); ``b6500`` → (6500,).
    Raises ValueError for a version of another scheme than the engine's."""
    m = _NUM.match(v)
    if m is None:
        raise ValueError(v)
    if engine == "llama_cpp":
        if m["build"] is None:
            raise ValueError(v)
        return (int(m["build"]),)
    if m["dotted"] is None:
        raise ValueError(v)
    parts = [int(x) for x in m["dotted"].split(".")]
    parts += [0] * (3 - len(parts))
    return (*parts[:3], int(m["post"] or 0))


@cache
def _sorted(engine: str) -> tuple[tuple[tuple[int, ...], str], ...]:
    return tuple(sorted((parse_version(engine, r), r) for r in modelled_releases(engine)))


@lru_cache(maxsize=256)
def engine_release(engine: str, requested: str | None) -> EngineRelease:
    """The modelled release for ``requested`` (field ``engine_version`` in errors)."""
    releases = _sorted(engine)
    first, newest = releases[0][1], releases[-1][1]
    if requested is None:
        return EngineRelease(engine, newest, newest, None)
    scheme = "a build number like b6500" if engine == "llama_cpp" else "a version like 0.11.2"
    try:
        key = parse_version(engine, requested)
    except ValueError:
        raise InvalidWorkload(
            "engine_version", f"{engine} releases are named as {scheme}, not {requested!r}"
        ) from None
    read = NEWEST_READ.get(engine)
    last = (
        read
        if read is not None
        else (f"{newest.rsplit('.', 1)[0]}.x" if engine == "vllm" else newest)
    )
    allowed = f"{engine} releases {first} to {last} are modelled"
    too_new = (
        key > parse_version(engine, read)
        if read is not None
        else (engine != "llama_cpp" and key[:2] > releases[-1][0][:2])
    )
    if too_new:
        raise InvalidWorkload("engine_version", f"{requested} is newer than modelled: {allowed}")
    if engine == "llama_cpp" and key > releases[-1][0]:
        # builds are daily: a newer build keeps the newest modelled rules until one is read
        return EngineRelease(
            engine,
            requested,
            newest,
            f"build {requested} is newer than the newest modelled ({newest}); its rules apply",
        )
    earlier = [r for k, r in releases if k <= key]
    if not earlier:
        raise InvalidWorkload("engine_version", f"{requested} is older than modelled: {allowed}")
    modelled = earlier[-1]
    note = None
    if parse_version(engine, modelled) != key:
        note = (
            f"{requested} uses the rules of {modelled}, the newest modelled release at or before it"
        )
    return EngineRelease(engine, requested, modelled, note)


VLLM_TORCH: dict[tuple[int, int], tuple[int, int]] = {
    (0, 10): (2, 7),
    (0, 11): (2, 8),
    (0, 12): (2, 9),
    (0, 13): (2, 9),
    (0, 14): (2, 9),
    (0, 15): (2, 9),
    (0, 16): (2, 9),
    (0, 17): (2, 10),
    (0, 18): (2, 10),
    (0, 19): (2, 10),
    (0, 20): (2, 11),
    (0, 21): (2, 11),
    (0, 22): (2, 11),
    (0, 23): (2, 11),
    (0, 24): (2, 11),
    (0, 25): (2, 11),
    (0, 26): (2, 11),
    (0, 27): (2, 13),
    (0, 28): (2, 13),
    (0, 29): (2, 13),
    (0, 30): (2, 13),
    (0, 31): (2, 13),
    (0, 32): (2, 13),
    (0, 33): (2, 14),
}
"""The torch minor each vLLM minor pins (its wheel's ``Requires-Dist: torch==``, read to the
minor: vLLM 0.16.0's image runs torch 2.9.1)."""


def vllm_pinned_torch(version: str) -> tuple[tuple[int, int], str] | None:
    """(the vLLM minor whose pin applies, the torch minor it pins as ``"2.10"``): the newest
    pinned minor at or before ``version``; None before the first one read. The table holds
    the minor only, so the answer does not name a patch release it did not read."""
    vt = version_tuple(version)[:2]
    rows = sorted(VLLM_TORCH)
    if not vt or vt < rows[0]:
        return None
    at = max(row for row in rows if row <= vt)
    return at, "{}.{}".format(*VLLM_TORCH[at])
