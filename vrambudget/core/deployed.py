"""The deployed format of a model workload: the dtypes and the quantization it runs in.

Left at their defaults (``precision.weights`` / ``compute`` ``auto``, ``quantization`` absent),
they are the checkpoint's, read from its ``config.json`` as the loaders read it:

- ``torch_dtype`` (``dtype`` in configs saved by transformers >= 4.56): the dtype
  ``from_pretrained`` loads the unquantized weights in (``dtype="auto"``, the default of
  transformers 5: ``modeling_utils.py`` ``_get_dtype``); fp32 checkpoints stay fp32. A model
  with no dtype is bf16.
- ``quantization_config``: the quantizer transformers and vLLM pick from it
  (:mod:`vrambudget.core.quant_config`); its non-quantized tensors are in ``torch_dtype``.

A value the request gives wins; when it differs from the checkpoint's, the answer says so.
Every path that computes with a workload (analytic, fits, trace, probes) deploys it first, so
nothing below sees ``auto`` or an absent quantization.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from .catalog import preset
from .dtypes import COMPUTE_DTYPES, float_dtype
from .errors import InvalidWorkload
from .memo import BoundedCache
from .quant_config import CheckpointQuantization, parse_quantization_config
from .resolved import ResolvedModel
from .result import DeployedFormat
from .spec import (
    AdapterDType,
    BitsAndBytes4bit,
    DimensionsModel,
    EncoderWorkload,
    HFConfigModel,
    HubModel,
    InferenceWorkload,
    Int8,
    LoRA,
    PresetModel,
    QLoRA,
    Quantization,
    Software,
    TrainingWorkload,
)
from .stack import Stack, resolve_stack

__all__ = [
    "CheckpointFormat",
    "adapter_dtype_of",
    "adapters_over_integers",
    "bnb_4bit",
    "bnb_loaded",
    "checkpoint_of",
    "checkpoint_quantization",
    "deploy",
    "deploy_all",
    "deployed_format",
    "deployed_quantization",
    "format_warnings",
    "has_headers",
    "stored_bytes_source",
    "with_adapters",
    "without_headers",
]

_Model = InferenceWorkload | TrainingWorkload | EncoderWorkload
_W = TypeVar("_W", bound=_Model)
_FLOATS = COMPUTE_DTYPES


@dataclass(frozen=True, slots=True)
class CheckpointFormat:
    """What a model's ``config.json`` says of its deployed format."""

    dtype: str | None
    """fp32 / fp16 / bf16, or None when the config names none (or another dtype)."""
    dtype_key: str | None
    """The key it was read from (``torch_dtype`` or ``dtype``)."""
    quantization: CheckpointQuantization | None
    """What ``quantization_config`` deploys, or None."""


_CHECKPOINTS: BoundedCache[object, CheckpointFormat] = BoundedCache(1024)


def _config_of(model: object) -> dict[str, Any] | None:
    match model:
        case PresetModel():
            return preset(model.id).config
        case HFConfigModel() | ResolvedModel():
            return model.config
    return None


def checkpoint_of(model: object) -> CheckpointFormat | None:
    """The checkpoint's deployed format (None: a model given by its dimensions)."""
    if isinstance(model, DimensionsModel | HubModel):
        return None
    key = model.key if isinstance(model, ResolvedModel) else model
    hit = _CHECKPOINTS.get(key)
    if hit is not None:
        return hit
    config = _config_of(model) or {}
    dtype_key = next((k for k in ("dtype", "torch_dtype") if isinstance(config.get(k), str)), None)
    dtype = float_dtype(config[dtype_key]) if dtype_key else None
    if dtype is None:  # no dtype in the config: transformers reads the stored tensors' dtype
        dtype = _stored_dtype(model)
        dtype_key = "stored tensors" if dtype is not None else None
    qc = config.get("quantization_config")
    quant = None
    if isinstance(qc, dict):
        try:
            quant = parse_quantization_config(qc, model_dtype=dtype)
        except InvalidWorkload as exc:
            raise InvalidWorkload(f"model.config.{exc.field}", exc.message) from None
    return _CHECKPOINTS.put(key, CheckpointFormat(dtype, dtype_key, quant))


def checkpoint_quantization(model: object) -> CheckpointQuantization | None:
    """What the checkpoint's ``quantization_config`` deploys (None: none, or no checkpoint)."""
    ckpt = checkpoint_of(model)
    return ckpt.quantization if ckpt is not None else None


def has_headers(model: object) -> bool:
    """The checkpoint's tensor headers are known: its stored bytes are exact."""
    return isinstance(model, ResolvedModel) and model.stored is not None


def without_headers(model: ResolvedModel) -> ResolvedModel:
    """``model`` budgeted from its shapes: it loads in another format than stored."""
    return msgspec.structs.replace(model, stored=None, key=model.key + ":computed")


def _stored_dtype(model: object) -> str | None:
    """The dtype the checkpoint stores its floating tensors in, where the config names none
    (GPT-2 and BERT's configs have no ``torch_dtype``): transformers' ``dtype="auto"`` then
    takes the first floating tensor's dtype (``modeling_utils.py`` ``_get_dtype``). From a
    preset's recorded checkpoint facts, or the headers (the dtype holding most bytes)."""
    if isinstance(model, PresetModel):
        return float_dtype(preset(model.id).checkpoint.stored_dtype)
    if isinstance(model, ResolvedModel) and model.stored:
        by_dtype: dict[str, int] = {}
        for g in model.stored:
            dtype = float_dtype(g.dtype)
            if dtype is not None:
                by_dtype[dtype] = by_dtype.get(dtype, 0) + g.total_bytes
        if by_dtype:
            return max(by_dtype, key=lambda k: by_dtype[k])
    return None


def _resolve_weights(requested: str, ckpt: CheckpointFormat | None, autocast: bool) -> str:
    if requested != "auto":
        return requested
    if autocast:
        return "fp32"  # autocast trains fp32 parameters
    if ckpt is not None and ckpt.dtype in _FLOATS:
        return ckpt.dtype
    return "bf16"


def _resolve_compute(
    requested: str, weights: str, ckpt: CheckpointFormat | None, autocast: bool = False
) -> str:
    if requested != "auto":
        return requested
    if autocast:  # torch.autocast computes in a 16-bit dtype: the checkpoint's, else bf16
        return ckpt.dtype if ckpt is not None and ckpt.dtype in ("fp16", "bf16") else "bf16"
    if weights in _FLOATS:
        return weights
    q = ckpt.quantization if ckpt is not None else None
    if q is not None and q.compute_dtype in _FLOATS:
        return str(q.compute_dtype)
    if ckpt is not None and ckpt.dtype in ("fp16", "bf16"):
        return ckpt.dtype
    return "bf16"


def deploy(w: _W) -> _W:
    """``w`` with its precision made concrete (the checkpoint's where the request left it), and
    its model's stored bytes dropped where it loads in another format than stored. Idempotent:
    a deployed workload comes back as it is."""
    p = w.precision
    model: Any = w.model
    headers = has_headers(model)
    concrete = p.weights != "auto" and p.compute != "auto" and p.quantization is not UNSET
    if concrete and not headers:
        return w
    ckpt = checkpoint_of(model)
    precision = p if concrete else _concrete(w, ckpt)
    if headers and not _as_stored(w, precision, ckpt):
        # The request loads it in another format than stored: bytes are computed, not read.
        model = without_headers(model)
    if precision is p and model is w.model:
        return w
    return msgspec.structs.replace(w, precision=precision, model=model)


def _concrete(w: _Model, ckpt: CheckpointFormat | None) -> Any:
    p = w.precision
    autocast = isinstance(w, TrainingWorkload) and w.mixed_precision == "autocast"
    quant: Quantization | None
    if p.quantization is UNSET:
        q = ckpt.quantization if ckpt is not None else None
        quant = q.scheme if q is not None and not _qlora(w) else None
    else:
        quant = p.quantization
    weights = _resolve_weights(p.weights, ckpt, autocast)
    if weights == "fp8" and quant is not None:
        weights = ckpt.dtype if ckpt is not None and ckpt.dtype in _FLOATS else "bf16"
    compute = _resolve_compute(p.compute, weights, ckpt, autocast)
    return msgspec.structs.replace(p, weights=weights, compute=compute, quantization=quant)


def deployed_quantization(q: Quantization | None | UnsetType) -> Quantization | None:
    """``precision.quantization`` of a deployed workload: ``deploy`` never leaves it absent."""
    assert q is not UNSET, "precision.quantization is absent: deploy() the workload first"
    return q


def _qlora(w: _Model) -> bool:
    return isinstance(w, TrainingWorkload) and isinstance(w.method, QLoRA)


def _as_stored(w: _Model, precision: Any, ckpt: CheckpointFormat | None) -> bool:
    """The deployed format loads the weights as the checkpoint stores them (so its stored bytes
    are the loaded bytes): the same quantization -- QLoRA's base quantization for a QLoRA run --
    and, where the config names one, the same dtype."""
    if ckpt is None:
        return False
    stored = ckpt.quantization.scheme if ckpt.quantization is not None else None
    loaded = w.method.base_quantization if _qlora(w) else precision.quantization  # type: ignore[union-attr]
    return loaded == stored and (ckpt.dtype is None or precision.weights == ckpt.dtype)


def format_warnings(w: _Model) -> list[str]:
    """Where the request's precision differs from the checkpoint's (said in the answer)."""
    ckpt = checkpoint_of(w.model)
    if ckpt is None:
        return []
    out: list[str] = []
    p = w.precision
    if p.weights not in ("auto", "fp8") and ckpt.dtype is not None and p.weights != ckpt.dtype:
        out.append(
            f"precision.weights {p.weights!r} differs from the checkpoint's {ckpt.dtype_key} "
            f"{ckpt.dtype!r}: the weights are budgeted in {p.weights} (converted at load)"
        )
    q = ckpt.quantization
    if p.quantization is UNSET or _qlora(w):
        if q is not None and _qlora(w):
            out.append(
                f"the checkpoint is quantized ({q.summary}); QLoRA's base_quantization is "
                "budgeted instead"
            )
        return out
    if q is not None and p.quantization != q.scheme:
        given = "none" if p.quantization is None else p.quantization.__struct_config__.tag
        out.append(
            f"precision.quantization ({given}) differs from the checkpoint's "
            f"quantization_config ({q.summary}): the request's is budgeted"
        )
    elif q is None and p.quantization is not None and has_headers(w.model):
        out.append(
            "precision.quantization quantizes a checkpoint stored unquantized: the weights "
            "are budgeted as quantized at load"
        )
    return out


def deployed_format(w: _Model) -> DeployedFormat:
    """What the deployed workload ``w`` runs in, and where each choice came from."""
    ckpt = checkpoint_of(w.model)
    stored_q = ckpt.quantization if ckpt is not None else None
    p = w.precision
    q = p.quantization if p.quantization is not UNSET else None
    from_ckpt = stored_q is not None and q == stored_q.scheme
    if q is None:
        quant_words = None
    elif stored_q is not None and from_ckpt:
        quant_words = stored_q.summary
    else:
        quant_words = str(q.__struct_config__.tag)
    return DeployedFormat(
        weights=str(p.weights),
        compute=str(p.compute),
        quantization=quant_words,
        weights_from="checkpoint" if ckpt is not None and p.weights == ckpt.dtype else "request",
        quantization_from=("checkpoint" if from_ckpt else ("request" if q is not None else "none")),
        stored_bytes=stored_bytes_source(w.model),
    )


def stored_bytes_source(model: object) -> Literal["safetensors headers", "computed"]:
    """Where the answer's weight bytes come from, in its words."""
    return "safetensors headers" if has_headers(model) else "computed"


def deploy_all(
    workloads: tuple[Any, ...], software: Software | None = None
) -> tuple[tuple[Any, ...], tuple[str, ...]]:
    """Every model workload deployed (others as they are), its LoRA adapters' dtype made
    concrete for the stack of ``software`` (:meth:`Stack.adapter_dtype`), and the format
    warnings, each prefixed with its workload when there are several."""
    out: list[Any] = []
    notes: list[str] = []
    for i, w in enumerate(workloads):
        if isinstance(w, _Model):
            prefix = f"workloads[{i}]: " if len(workloads) > 1 else ""
            deployed, said = _deployed(w, software)
            notes += [prefix + n for n in said]
            out.append(deployed)
        else:
            out.append(w)
    return tuple(out), tuple(notes)


_DEPLOYED: BoundedCache[tuple[Any, ...], tuple[Any, Any, Any, tuple[str, ...]]] = BoundedCache(1024)
"""Per (model, precision, layout, method, mixed precision, software): the deployed precision,
model and method, and the format warnings -- what deploying reads (``deploy``,
``with_adapters``, ``format_warnings``), so requests that differ in batch, context or
concurrency deploy once."""


def _deployed(w: Any, software: Software | None) -> tuple[Any, tuple[str, ...]]:
    """``w`` deployed with its adapters' dtype for ``software``'s stack, and its format
    warnings (cached: :data:`_DEPLOYED`)."""
    key = (
        type(w),
        w.model,
        w.precision,
        w.parallelism,
        getattr(w, "method", None),
        getattr(w, "mixed_precision", None),
        software,
    )
    hit = _DEPLOYED.get(key)
    if hit is None:
        d = with_adapters(deploy(w), resolve_stack(software))
        hit = _DEPLOYED.put(
            key, (d.precision, d.model, getattr(d, "method", None), tuple(format_warnings(w)))
        )
    precision, model, method, said = hit
    changes: dict[str, Any] = {}
    if precision != w.precision:
        changes["precision"] = precision
    if model is not w.model and model != w.model:
        changes["model"] = model
    if method is not None and method != w.method:
        changes["method"] = method
    return (msgspec.structs.replace(w, **changes) if changes else w), said


def adapters_over_integers(w: TrainingWorkload) -> bool:
    """Whether the adapted layers' weights are integer storage (4-bit / 8-bit bitsandbytes,
    GPTQ, AWQ), which PEFT does not cast adapters to; sharded QLoRA (ZeRO-3 / FSDP over
    several replicas) stores its 4-bit weights in the model's dtype (``bnb_4bit_quant_storage``,
    as PEFT's FSDP and DeepSpeed QLoRA guides set it), a floating-point dtype it does."""
    if bnb_4bit(w):
        par = w.parallelism
        return not (par.zero_stage >= 3 and par.data > 1)
    return bool(w.precision.quantization)


def bnb_4bit(w: TrainingWorkload) -> bool:
    """Whether the base is bitsandbytes 4-bit: QLoRA, or LoRA over ``bnb_4bit``."""
    return isinstance(w.method, QLoRA) or isinstance(w.precision.quantization, BitsAndBytes4bit)


def bnb_loaded(w: TrainingWorkload) -> bool:
    """Whether transformers loads the base through bitsandbytes (QLoRA, ``bnb_4bit``, LLM.int8
    ``int8``), setting ``is_loaded_in_4bit`` / ``is_loaded_in_8bit`` (transformers 5.23.0
    ``quantizers/quantizer_bnb_4bit.py`` line 138, ``quantizer_bnb_8bit.py`` line 114), which
    TRL's SFTTrainer reads."""
    return bnb_4bit(w) or isinstance(w.precision.quantization, Int8)


def adapter_dtype_of(w: TrainingWorkload, stack: Stack) -> AdapterDType:
    """A LoRA workload's adapters' dtype on ``stack`` (:meth:`Stack.adapter_dtype`): the
    request's, else what its PEFT and TRL leave them in over its base."""
    assert isinstance(w.method, LoRA)
    return stack.adapter_dtype(
        w.method.adapter_dtype, str(w.precision.weights), adapters_over_integers(w), bnb_loaded(w)
    )


def with_adapters(w: _W, stack: Stack) -> _W:
    """A deployed LoRA / QLoRA training workload with its adapters' dtype resolved for
    ``stack`` (:meth:`Stack.adapter_dtype`); any other workload as it is."""
    if not isinstance(w, TrainingWorkload) or not isinstance(w.method, LoRA):
        return w
    if w.method.adapter_dtype is not None:
        return w
    dtype = adapter_dtype_of(w, stack)
    return msgspec.structs.replace(w, method=msgspec.structs.replace(w.method, adapter_dtype=dtype))
