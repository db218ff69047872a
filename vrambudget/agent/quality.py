"""What the agent checks of a probe's output-quality check at submission (pure: no torch), and the
evaluation file a request names.

Refused with a 422 naming the field: a candidate (or the reference) in a format the check does
not emulate (:func:`vrambudget.core.quality_formats.unsupported_quantization`), a model without a
``config.json`` (one given by its dimensions: the check runs the framework's model), quantized
experts, and an ``eval_set`` that is not a plain file of the agent's evaluation directory
(``VRAMBUDGET_AGENT_EVAL_DIR``): ``..``, a name that resolves outside it (a symbolic link), a
missing file, or any file when the agent has no such directory."""

from __future__ import annotations

from pathlib import Path

from msgspec import UNSET

from vrambudget.core.errors import BudgetError
from vrambudget.core.probe_quality import QualityCheck
from vrambudget.core.quality_formats import unsupported_quantization
from vrambudget.core.resolve import needs_resolution, resolve_model
from vrambudget.core.spec import DimensionsModel

from .spec import ProbeRequest

__all__ = ["BUILTIN_EVAL_SET", "eval_file", "quality_refusal"]

BUILTIN_EVAL_SET = "builtin"


def eval_file(eval_dir: str | Path | None, name: str) -> Path | None:
    """The evaluation file ``name`` names (None: the shipped passages). Raises ``ValueError``
    with the reason for a name the agent will not open."""
    if name == BUILTIN_EVAL_SET:
        return None
    if eval_dir is None:
        raise ValueError(
            "this agent has no evaluation directory (VRAMBUDGET_AGENT_EVAL_DIR): only "
            f"{BUILTIN_EVAL_SET!r} is available"
        )
    if name in (".", "..") or "/" in name or "\\" in name:
        raise ValueError("must be a file name in the agent's evaluation directory")
    root = Path(eval_dir).resolve()
    path = (root / name).resolve()
    if not path.is_relative_to(root) or path == root:
        raise ValueError("resolves outside the agent's evaluation directory")
    if not path.is_file():
        raise ValueError(f"no evaluation file {name!r} in the agent's evaluation directory")
    return path


def quality_refusal(eval_dir: Path | None, request: ProbeRequest) -> tuple[str, str] | None:
    """(field, reason) when the request's quality check cannot run here; None when it can (or
    there is none)."""
    check: QualityCheck | None = request.quality
    if check is None:
        return None
    precisions = [("$.quality.reference", check.reference)] + [
        (f"$.quality.candidates[{i}].precision", c.precision)
        for i, c in enumerate(check.candidates)
    ]
    for path, precision in precisions:
        reason = unsupported_quantization(precision.quantization)
        if reason is not None:
            return f"{path}.quantization", reason
    model = getattr(request.workload, "model", None)
    if isinstance(model, DimensionsModel):
        return (
            "$.workload.model",
            "the quality check runs the framework's model built from a config.json: give "
            "the model as a preset, hf_config or hub",
        )
    quantized = any(
        p.weights == "fp8" or p.quantization not in (None, UNSET) for _, p in precisions
    )
    if quantized and model is not None and not needs_resolution(model):
        try:
            moe = resolve_model(model).moe is not None
        except (BudgetError, ValueError):
            moe = False  # the workload's own validation names what is wrong with the model
        if moe:
            return (
                "$.quality.candidates",
                "quantized expert tensors are not emulated by the quality check",
            )
    try:
        eval_file(eval_dir, check.eval_set)
    except ValueError as exc:
        return "$.quality.eval_set", str(exc)
    return None
