"""A checkpoint's config and tensor headers, from the Hugging Face Hub or a local directory.

Layer ``hub`` (docs/ARCHITECTURE.md): imports ``vrambudget.core``, the standard library,
msgspec and huggingface_hub -- never torch or transformers. Everything network goes through
huggingface_hub (``remote``: which calls, which paths); nothing reads tensor data, only the
safetensors headers (``headers``: the format and its checks). Failures are one exception,
``HubError``, with a kind (``not_found``, ``gated``, ``unreachable``, ``invalid``), the request
field it is about and a sentence for a user that never carries the token.
"""

from __future__ import annotations

from vrambudget.hub.cache import HubCache
from vrambudget.hub.errors import HubError, HubErrorKind
from vrambudget.hub.local import read_local
from vrambudget.hub.remote import fetch
from vrambudget.hub.resolved import ResolvedCheckpoint
from vrambudget.hub.settings import HubSettings
from vrambudget.hub.snapshots import cached_snapshot

__all__ = [
    "HubCache",
    "HubError",
    "HubErrorKind",
    "HubSettings",
    "ResolvedCheckpoint",
    "cached_snapshot",
    "fetch",
    "read_local",
]
