"""How the hub layer reaches the Hub: endpoint, token, timeout, huggingface_hub's disk cache and
the safetensors header bound, from the deployment's environment."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from huggingface_hub import constants

__all__ = ["DEFAULT_MAX_HEADER_BYTES", "MAX_TIMEOUT_S", "HubSettings"]

DEFAULT_MAX_HEADER_BYTES = 100 * 1024 * 1024
"""Safetensors headers larger than this are refused. The safetensors crate's own bound is
100,000,000 bytes (``MAX_HEADER_SIZE``, huggingface/safetensors ``safetensors/src/tensor.rs``);
huggingface_hub refuses remote headers over 25,000,000 bytes before fetching them
(``constants.SAFETENSORS_MAX_HEADER_LENGTH``)."""

MAX_TIMEOUT_S = 600.0
"""The largest timeout accepted from the environment: a request to the Hub that may hang for
longer holds a worker for longer than any caller waits."""


@dataclass(frozen=True, slots=True)
class HubSettings:
    """Where and how to read checkpoints from the Hub. The token is never shown: not in
    ``repr``, not in any error message, not in a log record."""

    endpoint: str | None = None
    """The Hub's base URL; ``None``: huggingface_hub's default (``HF_ENDPOINT`` or
    https://huggingface.co)."""
    token: str | None = field(default=None, repr=False)
    """Sent as ``Authorization: Bearer``; ``None`` sends none (a locally saved token is never
    used)."""
    timeout_s: float = 10.0
    """Per request: huggingface_hub passes it to httpx as the connect/read/write timeout."""
    cache_dir: str | None = None
    """huggingface_hub's cache directory for ``config.json`` and index files; ``None``: its
    default (``HF_HUB_CACHE``)."""
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES

    def __post_init__(self) -> None:
        if self.endpoint is not None:
            _check_endpoint(self.endpoint, "endpoint")
        if not (math.isfinite(self.timeout_s) and 0 < self.timeout_s <= MAX_TIMEOUT_S):
            raise ValueError(f"timeout_s must be in (0, {MAX_TIMEOUT_S:g}] seconds")
        if self.max_header_bytes < 2:
            raise ValueError("max_header_bytes must be at least 2 (the header '{}')")

    @property
    def resolved_endpoint(self) -> str:
        """The endpoint huggingface_hub will call (``constants.ENDPOINT`` when unset)."""
        return (self.endpoint or constants.ENDPOINT).rstrip("/")

    @property
    def hf_token(self) -> str | bool:
        """The token argument for huggingface_hub: the token, or ``False`` -- never ``None``,
        which would make huggingface_hub read a token saved on the machine (``hf auth login``)
        or ``HF_TOKEN`` (``huggingface_hub.utils._headers.get_token_to_send``)."""
        return self.token if self.token else False

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> HubSettings:
        """``VRAMBUDGET_HUB_ENDPOINT``, ``VRAMBUDGET_HUB_TOKEN`` (else ``HF_TOKEN``),
        ``VRAMBUDGET_HUB_TIMEOUT_S``, ``VRAMBUDGET_HUB_CACHE_DIR``. Empty values count as unset;
        a bad value raises ``ValueError`` naming the variable (never quoting a token)."""
        endpoint = environ.get("VRAMBUDGET_HUB_ENDPOINT", "").strip() or None
        if endpoint is not None:
            _check_endpoint(endpoint, "VRAMBUDGET_HUB_ENDPOINT")
            endpoint = endpoint.rstrip("/")
        token = environ.get("VRAMBUDGET_HUB_TOKEN", "").strip() or None
        if token is None:
            token = environ.get("HF_TOKEN", "").strip() or None
        if token is not None and any(c.isspace() or ord(c) < 0x20 for c in token):
            raise ValueError("VRAMBUDGET_HUB_TOKEN / HF_TOKEN must not contain whitespace")
        timeout_s = 10.0
        raw_timeout = environ.get("VRAMBUDGET_HUB_TIMEOUT_S", "").strip()
        if raw_timeout:
            try:
                timeout_s = float(raw_timeout)
            except ValueError:
                raise ValueError(
                    f"VRAMBUDGET_HUB_TIMEOUT_S must be a number of seconds, not {raw_timeout!r}"
                ) from None
            if not (math.isfinite(timeout_s) and 0 < timeout_s <= MAX_TIMEOUT_S):
                raise ValueError(
                    f"VRAMBUDGET_HUB_TIMEOUT_S must be in (0, {MAX_TIMEOUT_S:g}], "
                    f"not {raw_timeout!r}"
                )
        cache_dir = environ.get("VRAMBUDGET_HUB_CACHE_DIR", "").strip() or None
        if cache_dir is not None and "\x00" in cache_dir:
            raise ValueError("VRAMBUDGET_HUB_CACHE_DIR must be a path")
        return cls(endpoint=endpoint, token=token, timeout_s=timeout_s, cache_dir=cache_dir)


def _check_endpoint(endpoint: str, name: str) -> None:
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{name} must be an http(s) URL such as https://huggingface.co")
    if parts.query or parts.fragment:
        raise ValueError(f"{name} must not carry a query or fragment")
