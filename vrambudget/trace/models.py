"""Models resolved in this process, as the service resolves them (the CLI and the probe agent's
children use this): a Hub repository fetched (``config.json`` and safetensors headers), a local
checkpoint directory read (headers only), a family without a closed form built by the
framework."""

from __future__ import annotations

import os
from typing import Any

import msgspec

from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.resolve import model_name, needs_resolution
from vrambudget.core.sources import check_hub_config, hub_origin
from vrambudget.core.spec import HFConfigModel, HubModel

__all__ = ["local_checkpoint_model", "resolve_models"]


def local_checkpoint_model(path: str) -> dict[str, Any]:
    """A checkpoint directory as an inline model: its ``config.json`` and the headers of its
    safetensors files (the exact stored bytes of every tensor; no tensor data is read)."""
    from vrambudget.hub import HubError, read_local

    try:
        found = read_local(path)
    except HubError as exc:
        raise InvalidWorkload("model.checkpoint", exc.message) from None
    model: dict[str, Any] = {"source": "hf_config", "config": found.config}
    if found.checkpoint is not None:
        model["checkpoint"] = msgspec.to_builtins(
            {"tensors": found.checkpoint.tensors, "total_size": found.checkpoint.total_size}
        )
    return model


def resolve_models(workloads: tuple[Any, ...]) -> tuple[Any, ...]:
    """The workloads with the models that need it resolved (Hub fetched, framework run), an
    ``llm_serving`` workload's speculative drafter too."""
    out = []
    for i, w in enumerate(workloads):
        model = getattr(w, "model", None)
        if model is not None and needs_resolution(model):
            w = msgspec.structs.replace(w, model=_resolved(model, f"workloads[{i}]"))
        spec = getattr(w, "speculative", None)
        draft = getattr(spec, "model", None) if spec is not None else None
        if spec is not None and draft is not None and needs_resolution(draft):
            resolved = _resolved(draft, f"workloads[{i}].speculative")
            w = msgspec.structs.replace(
                w, speculative=msgspec.structs.replace(spec, model=resolved)
            )
        out.append(w)
    return tuple(out)


def _resolved(model: HFConfigModel | HubModel, where: str) -> Any:
    try:
        return _resolve(model)
    except InvalidWorkload as exc:
        raise InvalidWorkload(f"{where}.{exc.field}", exc.message) from None


def _resolve(model: HFConfigModel | HubModel) -> Any:
    from vrambudget.workloads.hf.resolve import resolve_config, resolve_source

    if isinstance(model, HFConfigModel):
        return resolve_source(model)
    from vrambudget.hub import HubError, HubSettings, fetch

    try:
        found = fetch(model.id, model.revision, settings=HubSettings.from_env(os.environ))
    except HubError as exc:
        field = f"model.{exc.field}" if exc.field in ("id", "revision") else "model"
        raise InvalidWorkload(field, exc.message) from None
    check_hub_config(model.id, found.config, "model.id")  # as the service checks it
    return resolve_config(
        found.config,
        name=model_name(model),
        origin=hub_origin(model.id, found.commit, found.revision),
        checkpoint=found.checkpoint,
    )
