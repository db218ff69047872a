"""What every resolver of a model source says alike -- the service
(:mod:`vrambudget.service.models`), the CLI and the probe child (:mod:`vrambudget.trace.models`)
and the framework resolver (:mod:`vrambudget.workloads.hf.resolve`): the origin in words, the
checkpoint headers given inline, the checks of a Hub repository's ``config.json``, whether the
framework's inventory is built, and the field its errors name. Pure and torch-free; the
fetching and the framework stay with the callers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .checkpoint import Checkpoint
from .errors import InvalidWorkload
from .hf_config import CLOSED_FORM_FAMILIES, check_config, check_framework_limits
from .spec import HFConfigModel

__all__ = [
    "check_framework_config",
    "check_hub_config",
    "config_error",
    "hub_origin",
    "inline_checkpoint",
    "inline_origin",
    "needs_inventory",
]


def inline_checkpoint(model: HFConfigModel) -> Checkpoint | None:
    """The safetensors headers given with an inline ``config.json`` (None: none given)."""
    ckpt = model.checkpoint
    if ckpt is None:
        return None
    return Checkpoint(tensors=ckpt.tensors, total_size=ckpt.total_size)


def inline_origin(checkpoint: Checkpoint | None) -> str:
    """Where an inline model came from, in words (the start of its ``model.source``)."""
    return "inline config.json" + (" and checkpoint headers" if checkpoint is not None else "")


def hub_origin(repo_id: str, commit: str | None, revision: str | None) -> str:
    """Where a Hub model came from, in words: the commit it resolved to (else the revision
    asked for, else ``main``). It names the content, so it keys a resolved model too."""
    return f"hub {repo_id}@{commit or revision or 'main'}"


def check_hub_config(repo_id: str, config: Mapping[str, Any], field: str) -> None:
    """A Hub repository's ``config.json``, checked as an inline one (``InvalidWorkload`` naming
    ``field``, the repository's id field): a ``model_type`` first -- a repository without one
    is a diffusers pipeline or another library's."""
    if not isinstance(config.get("model_type"), str):
        raise InvalidWorkload(
            field,
            f"{repo_id} has no model_type in its config.json (a diffusers pipeline or "
            "another library's repository): give its component models",
        )
    try:
        check_config(config)  # the same checks as an inline config.json
    except ValueError as exc:
        raise InvalidWorkload(field, f"{repo_id}'s config.json: {exc}") from None


def needs_inventory(config: Mapping[str, Any], checkpoint: Checkpoint | None) -> bool:
    """The framework's inventory is built for a family without a closed form, and for any
    checkpoint whose stored tensors are matched against the modules the framework builds."""
    return config.get("model_type") not in CLOSED_FORM_FAMILIES or checkpoint is not None


def config_error(exc: InvalidWorkload, field: str) -> InvalidWorkload:
    """``exc``, an error about a ``config.json`` (naming ``config.<key>`` or
    ``model.config.<key>``), naming the same key under ``field``, the config's own path
    (``workloads[0].model.config``)."""
    rest = exc.field.removeprefix("model.config").removeprefix("config")
    return InvalidWorkload(field + rest, exc.message)


def check_framework_config(config: Mapping[str, Any], field: str) -> None:
    """:func:`~vrambudget.core.hf_config.check_framework_limits`, before any framework builds
    the model; errors name the key under ``field`` (:func:`config_error`)."""
    try:
        check_framework_limits(config)
    except InvalidWorkload as exc:
        raise config_error(exc, field) from None
