"""The models of a request, resolved before the pure core computes with them: a Hub repository
fetched (``config.json`` and safetensors headers, in a thread), the framework's inventory of a
family without a closed form (in a trace worker), a checkpoint's stored tensors folded.

Everything is cached: a repository revision by the Hub cache, an inventory per config by the
trace pool, a resolved model by its source. A request for a model resolved before costs a dict
look-up on the event loop (a Hub model's: one in the Hub cache too, while its revision is fresh
there; no thread), so a whole-catalog fit of a Hub model after its first resolution is as fast
as a preset's. Errors name the field (``workloads[0].model.id``): 422 for what the caller can change
(an unknown repository or revision, a gated repository the service's token cannot read, a
config ``transformers`` refuses), 503 when the Hub cannot be reached, 501 when the framework is
not installed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import msgspec

from vrambudget.core.checkpoint import Checkpoint
from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.inventory import ModelInventory
from vrambudget.core.memo import BoundedCache
from vrambudget.core.resolve import model_name, needs_resolution
from vrambudget.core.resolved import resolved_model
from vrambudget.core.sources import (
    check_framework_config,
    check_hub_config,
    config_error,
    hub_origin,
    inline_checkpoint,
    inline_origin,
    needs_inventory,
)
from vrambudget.core.spec import HFConfigModel, HubModel
from vrambudget.hub import HubCache, HubError, HubSettings, ResolvedCheckpoint

from .resolutions import Resolutions, draft_index
from .trace_errors import TraceUnavailable
from .tracing import TracePool

__all__ = ["HubUnreachable", "ModelResolver", "pending"]

log = logging.getLogger("vrambudget.service")


class HubUnreachable(Exception):
    """The Hub did not answer (503)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def _draft(w: Any) -> Any:
    """An ``llm_serving`` workload's speculative drafter model, or None."""
    spec = getattr(w, "speculative", None)
    return getattr(spec, "model", None) if spec is not None else None


def pending(workloads: Sequence[Any]) -> bool:
    """Whether a workload's model (or its speculative drafter) needs resolution: checked before
    awaiting :meth:`ModelResolver.resolve`, so a request of presets pays no coroutine."""
    for w in workloads:
        for model in (getattr(w, "model", None), _draft(w)):
            if model is not None and needs_resolution(model):
                return True
    return False


class ModelResolver:
    """Resolves the model sources of a request (one per app)."""

    def __init__(self, trace_pool: TracePool, hub: HubSettings) -> None:
        self.trace_pool = trace_pool
        self.hub = HubCache(hub)
        self._resolved: BoundedCache[object, tuple[str, bytes]] = BoundedCache(256)
        """(key, encoded ResolvedModel) by source: encoded once, sent with every request."""

    async def resolve(self, workloads: Sequence[Any], field: str = "workloads") -> Resolutions:
        """What crosses to a worker with the request: (workload index, key, encoded
        ResolvedModel) of each workload whose model needs resolution, by index (``()``: none
        does)."""
        out = []
        for i, w in enumerate(workloads):
            model = getattr(w, "model", None)
            if model is not None and needs_resolution(model):
                key, encoded = await self.resolve_one(model, f"{field}[{i}].model")
                out.append((i, key, encoded))
            draft = _draft(w)
            if draft is not None and needs_resolution(draft):
                where = f"{field}[{i}].speculative.model"
                key, encoded = await self.resolve_one(draft, where)
                out.append((draft_index(i), key, encoded))
        return tuple(out)

    async def resolve_one(self, model: HFConfigModel | HubModel, field: str) -> tuple[str, bytes]:
        """(key, encoded ResolvedModel) of a model. A Hub repository fresh in the Hub cache and
        resolved before costs a look-up in each cache, on the event loop: no thread, no check of
        its config again."""
        name = model_name(model)
        if isinstance(model, HubModel):
            # a thread only on a miss (or a branch past the cache's TTL)
            found = self.hub.peek(model.id, model.revision) or await self._fetch(model, field)
            origin = hub_origin(model.id, found.commit, found.revision)
            cache_key: object = ("hub", origin, name)  # the origin names the commit
            hit = self._resolved.get(cache_key)
            if hit is not None:
                return hit
            check_hub_config(model.id, found.config, f"{field}.id")  # once per commit
            config, checkpoint = found.config, found.checkpoint
        else:
            cache_key = model
            hit = self._resolved.get(cache_key)
            if hit is not None:
                return hit
            config = model.config
            checkpoint = inline_checkpoint(model)
            origin = inline_origin(checkpoint)
        inventory = await self._inventory(config, checkpoint, f"{field}.config")
        resolved = await asyncio.to_thread(_encoded, config, checkpoint, inventory, origin, name)
        return self._resolved.put(cache_key, resolved)

    async def _fetch(self, model: HubModel, field: str) -> ResolvedCheckpoint:
        try:
            return await asyncio.to_thread(self.hub.get, model.id, model.revision)
        except HubError as exc:
            where = f"{field}.{exc.field}" if exc.field in ("id", "revision") else field
            if exc.kind == "unreachable":
                raise HubUnreachable(where, exc.message) from None
            raise InvalidWorkload(where, exc.message) from None

    async def _inventory(
        self, config: dict[str, Any], checkpoint: Checkpoint | None, field: str
    ) -> ModelInventory | None:
        if not needs_inventory(config, checkpoint):
            return None
        check_framework_config(config, field)  # before any worker builds it
        try:
            return await self.trace_pool.inventory(config)
        except InvalidWorkload as exc:
            raise config_error(exc, field) from None
        except TraceUnavailable:
            if not needs_inventory(config, None):
                # A closed form: it stands, and the stored bytes match without module names.
                log.warning("framework inventory unavailable; stored tensors matched by name")
                return None
            raise


def _encoded(
    config: dict[str, Any],
    checkpoint: Checkpoint | None,
    inventory: ModelInventory | None,
    origin: str,
    name: str,
) -> tuple[str, bytes]:
    """(key, encoded ResolvedModel): in a thread (a large checkpoint's headers take
    milliseconds to fold and encode)."""
    resolved = resolved_model(config, checkpoint, inventory, origin=origin, name=name)
    return resolved.key, msgspec.json.encode(resolved)
