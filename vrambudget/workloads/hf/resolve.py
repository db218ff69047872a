"""Model sources to :class:`~vrambudget.core.resolved.ResolvedModel` in this process: the
framework's inventory for a family without a closed form, the stored tensors of a checkpoint
header. The service does the same in its worker processes (and fetches Hub repositories first);
the CLI, the trace tier and the probe agent call this."""

from __future__ import annotations

from typing import Any

import msgspec

from vrambudget.core.checkpoint import Checkpoint
from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.hf_config import check_framework_limits
from vrambudget.core.inventory import ModelInventory
from vrambudget.core.memo import BoundedCache
from vrambudget.core.resolve import AnyModel, model_name, needs_resolution
from vrambudget.core.resolved import ResolvedModel, resolved_model
from vrambudget.core.sources import config_error, inline_checkpoint, inline_origin, needs_inventory
from vrambudget.core.spec import HFConfigModel

from .inventory import inventory

__all__ = ["cached_inventory", "resolve_config", "resolve_source"]

_INVENTORIES: BoundedCache[bytes, ModelInventory] = BoundedCache(64)


def cached_inventory(config: dict[str, Any]) -> ModelInventory:
    """The framework inventory of ``config``, once per process per config."""
    key = msgspec.json.encode(config, order="sorted")
    hit = _INVENTORIES.get(key)
    if hit is not None:
        return hit
    try:
        check_framework_limits(config)
        inv = inventory(config)
    except InvalidWorkload as exc:
        raise config_error(exc, "model.config") from None
    return _INVENTORIES.put(key, inv)


def resolve_config(
    config: dict[str, Any],
    *,
    name: str,
    origin: str,
    checkpoint: Checkpoint | None = None,
    with_inventory: bool | None = None,
) -> ResolvedModel:
    """A config (and its checkpoint's stored tensors) resolved; the inventory is built when
    the family has no closed form, or when ``with_inventory`` asks for it (the stored tensors
    of a checkpoint are matched against the modules the framework builds)."""
    if with_inventory is None:
        with_inventory = needs_inventory(config, checkpoint)
    inv = cached_inventory(config) if with_inventory else None
    return resolved_model(config, checkpoint, inv, origin=origin, name=name)


def resolve_source(source: AnyModel) -> AnyModel:
    """``source`` resolved when it needs it (a config of a family without a closed form, or
    with a checkpoint header); other sources as they are. Hub repositories are fetched by the
    caller (:mod:`vrambudget.hub`) and passed to :func:`resolve_config`."""
    if not needs_resolution(source) or not isinstance(source, HFConfigModel):
        return source
    checkpoint = inline_checkpoint(source)
    return resolve_config(
        source.config,
        name=model_name(source),
        origin=inline_origin(checkpoint),
        checkpoint=checkpoint,
    )
