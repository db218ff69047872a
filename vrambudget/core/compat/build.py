"""The torch and CUDA build a stack runs: named in the request, else what the framework brings.
One place for the compatibility rules (``needs_of``) and for the serving answers that depend on
the build (which NVIDIA drivers can run it: :mod:`vrambudget.core.serving.driver`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..serving.releases import vllm_pinned_torch
from ..spec import Software
from ..spec.serving import GGUF_ENGINES
from ..stack import CURRENT, version_tuple
from .facts import TORCH_PYPI_CUDA

__all__ = ["Build", "parse_cuda", "stack_build", "torch_cuda"]


@dataclass(frozen=True, slots=True)
class Build:
    torch_version: str
    """The torch release (``""`` where the framework runs without torch: llama.cpp, Ollama)."""
    torch_basis: str
    cuda: tuple[int, int] | None
    """The CUDA runtime (major, minor); None where it is not known or there is none."""
    cuda_basis: str


def parse_cuda(text: str) -> tuple[int, int] | None:
    """``"12.8"`` / ``"cu128"`` (a torch local version) -> (12, 8)."""
    if text.startswith("cu") and text[2:].isdigit() and len(text) >= 5:
        digits = text[2:]
        return int(digits[:-1]), int(digits[-1])
    parts = version_tuple(text)
    return (parts[0], parts[1] if len(parts) > 1 else 0) if parts else None


def torch_cuda(torch_version: str) -> tuple[tuple[int, int] | None, str]:
    """The CUDA runtime of a torch release: its ``+cuXYZ`` local version, else its default PyPI
    wheel's (the newest row read for a newer release, said so)."""
    _, _, local = torch_version.partition("+")
    if local.startswith("cu"):
        return parse_cuda(local), f"torch {torch_version}'s build"
    if local:  # +cpu, +rocm6.4: no CUDA runtime
        return None, f"torch {torch_version} has no CUDA runtime"
    t = version_tuple(torch_version)[:2]
    if not t:
        return None, f"torch {torch_version!r} is not a version"
    rows = sorted(TORCH_PYPI_CUDA)
    if t < rows[0]:
        return None, f"torch {torch_version} is older than the releases read (2.4)"
    at = max(r for r in rows if r <= t)
    cuda = TORCH_PYPI_CUDA[at]
    how = f"torch {torch_version}'s PyPI wheel"
    if at != t:
        how += f", assumed as {at[0]}.{at[1]}'s: the nearest release read"
    return cuda, how


def stack_build(framework: str, version: str, software: Software | None) -> Build:
    """The build of ``framework`` at ``version`` under ``software``: the torch named, else the
    one vLLM's release pins, else none for llama.cpp / Ollama (ggml), else the current release;
    the CUDA named, else unknown for ggml's own build, else the torch's."""
    sw = software or Software()
    torch_v, torch_basis = sw.torch_version, "named"
    if torch_v is None and framework == "vllm":
        vllm_pin = vllm_pinned_torch(version)
        if vllm_pin is not None:
            at, torch_v = vllm_pin
            torch_basis = f"pinned by vllm {at[0]}.{at[1]}" + (
                "" if at == version_tuple(version)[:2] else f"; vllm {version} assumed the same"
            )
    ggml = framework in GGUF_ENGINES  # ggml's own CUDA build, no torch
    if torch_v is None and ggml:
        torch_v, torch_basis = "", "none: llama.cpp runs on ggml"
    if torch_v is None:
        torch_v, torch_basis = CURRENT["torch"], "not named: the current release"
    cuda: tuple[int, int] | None
    if sw.cuda_version is not None:
        cuda, cuda_basis = parse_cuda(sw.cuda_version), "named"
    elif ggml:
        cuda, cuda_basis = None, "llama.cpp's own CUDA build, not named"
    else:
        cuda, cuda_basis = torch_cuda(torch_v)
        if torch_basis != "named":
            cuda_basis += f"; torch {torch_basis}"
    return Build(torch_v, torch_basis, cuda, cuda_basis)
