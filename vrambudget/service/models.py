"""The models of a request, resolved before the pure core computes with them: a Hub repository
fetched (``config.json`` and safetensors headers, in a thread), the framework's inventory of a
family without a closed form (in a trace worker), a checkpoint's stored tensors folded.

Everything is cached: a repository revision by the Hub cache, an inventory per config by the
trace pool, a resolved model by its source. A request for a model resolved before costs a dict
look-up, so a whole-catalog fit of a Hub model after its first resolution is as fast as a
preset's. Errors name the field (``workloads[0].model.id``): 422 for what the caller can change
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
from vrambudget.core.hf_config import (
    CLOSED_FORM_FAMILIES,
    check_config,
    check_framework_limits,
)
from vrambudget.core.inventory import ModelInventory
from vrambudget.core.memo import BoundedCache
from vrambudget.core.resolve import needs_resolution
from vrambudget.core.resolved import ResolvedModel, resolved_model
from vrambudget.core.spec import HFConfigModel, HubModel
from vrambudget.hub import HubCache, HubError, HubSettings

from .resolutions import Resolutions
from .trace_errors import TraceUnavailable
from .tracing import TracePool

__all__ = ["HubUnreachable", "ModelResolver", "encode_resolutions"]

log = logging.getLogger("vrambudget.service")


class HubUnreachable(Exception):
    """The Hub did not answer (503)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class ModelResolver:
    """Resolves the model sources of a request (one per app)."""

    def __init__(self, trace_pool: TracePool, hub: HubSettings) -> None:
        self.trace_pool = trace_pool
        self.hub = HubCache(hub)
        self._resolved: BoundedCache[object, ResolvedModel] = BoundedCache(256)

    async def resolve(self, workloads: Sequence[Any], field: str = "workloads") -> dict[int, Any]:
        """{workload index: ResolvedModel} for the workloads whose model needs it."""
        out: dict[int, Any] = {}
        for i, w in enumerate(workloads):
            model = getattr(w, "model", None)
            if model is not None and needs_resolution(model):
                out[i] = await self.resolve_one(model, f"{field}[{i}].model")
        return out

    async def resolve_one(self, model: HFConfigModel | HubModel, field: str) -> ResolvedModel:
        checkpoint: Checkpoint | None
        if isinstance(model, HubModel):
            config, checkpoint, origin = await self._fetch(model, field)  # cached by revision
            name = model.name or model.id
            cache_key: object = ("hub", origin, name)  # the origin names the commit
        else:
            config = model.config
            checkpoint = (
                Checkpoint(tensors=model.checkpoint.tensors, total_size=model.checkpoint.total_size)
                if model.checkpoint is not None
                else None
            )
            origin = "inline config.json" + (" and checkpoint headers" if checkpoint else "")
            name = model.name or str(config.get("model_type"))
            cache_key = model
        hit = self._resolved.get(cache_key)
        if hit is not None:
            return hit
        inventory = await self._inventory(config, checkpoint, f"{field}.config")
        resolved = await asyncio.to_thread(
            resolved_model, config, checkpoint, inventory, origin=origin, name=name
        )
        return self._resolved.put(cache_key, resolved)

    async def _fetch(
        self, model: HubModel, field: str
    ) -> tuple[dict[str, Any], Checkpoint | None, str]:
        try:
            found = await asyncio.to_thread(self.hub.get, model.id, model.revision)
        except HubError as exc:
            where = f"{field}.{exc.field}" if exc.field in ("id", "revision") else field
            if exc.kind == "unreachable":
                raise HubUnreachable(where, exc.message) from None
            raise InvalidWorkload(where, exc.message) from None
        config = found.config
        if not isinstance(config.get("model_type"), str):
            raise InvalidWorkload(
                f"{field}.id",
                f"{model.id} has no model_type in its config.json (a diffusers pipeline or "
                "another library's repository): give its component models",
            )
        try:
            check_config(config)  # the same checks as an inline config.json
        except ValueError as exc:
            raise InvalidWorkload(f"{field}.id", f"{model.id}'s config.json: {exc}") from None
        commit = found.commit or found.revision or "main"
        return config, found.checkpoint, f"hub {model.id}@{commit}"

    async def _inventory(
        self, config: dict[str, Any], checkpoint: Checkpoint | None, field: str
    ) -> ModelInventory | None:
        closed = config.get("model_type") in CLOSED_FORM_FAMILIES
        if closed and checkpoint is None:
            return None
        try:
            check_framework_limits(config)  # before any worker builds it
        except InvalidWorkload as exc:
            raise InvalidWorkload(field + exc.field.removeprefix("config"), exc.message) from None
        try:
            return await self.trace_pool.inventory(config)
        except InvalidWorkload as exc:
            rest = exc.field.removeprefix("model.config").removeprefix("config")
            raise InvalidWorkload(field + rest, exc.message) from None
        except TraceUnavailable:
            if closed:  # the closed form stands; the stored bytes match without module names
                log.warning("framework inventory unavailable; stored tensors matched by name")
                return None
            raise


_ENCODER = msgspec.json.Encoder()


def encode_resolutions(resolved: dict[int, Any]) -> Resolutions:
    """What crosses to a compute worker: (workload index, key, encoded ResolvedModel)."""
    return tuple((i, m.key, _ENCODER.encode(m)) for i, m in sorted(resolved.items()))
