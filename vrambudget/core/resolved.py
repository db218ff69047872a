"""A model reference after the service has looked it up: the ``config.json`` (pasted, or fetched
from the Hub), the checkpoint's stored tensors when known, and the framework's inventory when
the family has no closed form.

It never crosses the wire: the service builds it (fetching, and running the framework in its
worker processes), hands it to the pure core with the request, and the core answers from it
exactly as from a preset. Its ``key`` is a digest of everything in it, so caches key on a short
string and a moved Hub branch is a new key.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from .checkpoint import Checkpoint, StoredGroup, collapse
from .hf_config import config_key
from .inventory import ModelInventory

__all__ = ["ResolvedModel", "resolved_key", "resolved_model"]


class ResolvedModel(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    """sha256 of the config, the stored tensors and the inventory (hex)."""
    name: str
    """Label in the answer (the repository id, or the config's model_type)."""
    origin: str
    """Where it came from, in words: ``hub Qwen/Qwen2.5-7B@<sha>``, ``inline config.json``,
    ``checkpoint directory``."""
    config: dict[str, Any]
    inventory: ModelInventory | None = None
    stored: tuple[StoredGroup, ...] | None = None
    """The checkpoint's stored tensors, folded by layer and expert (None: not known)."""
    stored_total: int | None = None
    """Bytes of every stored tensor (the index's ``total_size`` when it has one)."""

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ResolvedModel) and other.key == self.key


def resolved_key(
    config: dict[str, Any],
    stored: tuple[StoredGroup, ...] | None,
    inventory: ModelInventory | None,
    origin: str,
) -> str:
    h = hashlib.sha256()
    h.update(config_key(config))
    h.update(b"\0")
    h.update(msgspec.json.encode(stored))
    h.update(b"\0")
    h.update(msgspec.json.encode(inventory))
    h.update(b"\0")
    h.update(origin.encode())
    return h.hexdigest()


def resolved_model(
    config: dict[str, Any],
    checkpoint: Checkpoint | None,
    inventory: ModelInventory | None,
    *,
    origin: str,
    name: str,
) -> ResolvedModel:
    """The resolution of a config, its checkpoint's stored tensors (folded by layer and
    expert) and the framework's inventory; the stored total is the index's ``total_size``
    when it has one, else the sum of the headers."""
    stored = collapse(checkpoint.tensors) if checkpoint is not None else None
    total = None
    if checkpoint is not None:
        total = checkpoint.total_size
        if total is None:
            total = checkpoint.stored_bytes
    return ResolvedModel(
        key=resolved_key(config, stored, inventory, origin),
        name=name,
        origin=origin,
        config=config,
        inventory=inventory,
        stored=stored,
        stored_total=total,
    )
