"""The caching allocator's setting a probe runs under: ``expandable_segments`` in
``PYTORCH_ALLOC_CONF`` (torch 2.9's name) or ``PYTORCH_CUDA_ALLOC_CONF``, which torch reads when
the process first allocates on the device, so the child sets it before any CUDA work."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

__all__ = ["ENV_KEYS", "apply", "expandable_from"]

ENV_KEYS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
"""Read in this order: torch 2.9+ takes ``PYTORCH_ALLOC_CONF`` where it is set (c10
``AllocatorConfig``), earlier releases only ``PYTORCH_CUDA_ALLOC_CONF``."""


def apply(expandable: bool | None, environ: MutableMapping[str, str]) -> None:
    """Set both variables to ``expandable_segments:True`` / ``:False``; None leaves them."""
    if expandable is None:
        return
    value = f"expandable_segments:{'True' if expandable else 'False'}"
    for key in ENV_KEYS:
        environ[key] = value


def expandable_from(environ: Mapping[str, str]) -> bool:
    """Whether the first of :data:`ENV_KEYS` that is set turns expandable segments on
    (``key:value`` pairs separated by commas; torch accepts ``True`` and ``False``)."""
    for key in ENV_KEYS:
        conf = environ.get(key)
        if conf is None:
            continue
        for pair in conf.split(","):
            name, _, value = pair.partition(":")
            if name.strip() == "expandable_segments":
                return value.strip() == "True"
        return False
    return False
