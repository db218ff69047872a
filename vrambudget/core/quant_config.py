"""A checkpoint's ``quantization_config`` (from its ``config.json``) as the scheme the analytic
tier computes with, read the way the loaders read it.

Supported ``quant_method`` values and the tensors each selects (byte rules:
:mod:`vrambudget.core.quantization`):

- ``awq`` (transformers 5.23.0 ``utils/quantization_config.py`` ``AwqConfig``: ``bits`` /
  ``w_bit``, ``group_size`` / ``q_group_size``, ``version`` (legacy) or ``format``,
  ``zero_point``, ``modules_to_not_convert``) -> :class:`~vrambudget.core.spec.AWQ`.
- ``gptq`` (``bits``, ``group_size``, ``desc_act``, ``sym``, ``checkpoint_format`` / ``format``
  (GPTQModel 7.7.0 ``quantization/config.py`` 69-72, 1948-1951), ``lm_head``, GPTQModel's
  ``dynamic`` with ``-:`` skip patterns) -> :class:`~vrambudget.core.spec.GPTQ`.
- ``bitsandbytes`` (``load_in_4bit`` / ``load_in_8bit``, also as ``_load_in_*``;
  ``bnb_4bit_quant_type``, ``bnb_4bit_use_double_quant``, ``bnb_4bit_compute_dtype``,
  ``llm_int8_skip_modules``) -> :class:`~vrambudget.core.spec.BitsAndBytes4bit` (block 64,
  bitsandbytes' default) or :class:`~vrambudget.core.spec.Int8`.
- ``fp8`` (``weight_block_size`` -> 2-D blocks, else one scale per tensor as vLLM's
  ``Fp8Config`` reads an absent key; ``activation_scheme``; ``modules_to_not_convert`` /
  ``ignored_layers``) and ``fbgemm_fp8`` (per output channel) -> :class:`~vrambudget.core.spec.FP8`.
- ``compressed-tensors`` (``config_groups[*].weights``, ``format`` (top level or per group),
  ``ignore``, ``targets``) -> :class:`~vrambudget.core.spec.CompressedTensors`,
  :class:`~vrambudget.core.spec.NVFP4` (``nvfp4-pack-quantized``) or
  :class:`~vrambudget.core.spec.MXFP4` (``mxfp4-pack-quantized``).
- ``mxfp4`` (gpt-oss) -> :class:`~vrambudget.core.spec.MXFP4`.
- ``modelopt`` (``quant_algo`` NVFP4 / W4A16_NVFP4 / FP8 / FP8_PER_CHANNEL_PER_TOKEN / FP8_PB_WO,
  flat as in ``config.json`` or nested under ``quantization`` as in ``hf_quant_config.json``;
  ``ignore`` / ``exclude_modules``; vLLM 0.34.0 ``quantization/modelopt.py`` 328-365) ->
  :class:`~vrambudget.core.spec.NVFP4` or :class:`~vrambudget.core.spec.FP8`.

Errors are :class:`~vrambudget.core.errors.InvalidWorkload` with the field relative to the
model's config (``quantization_config.bits``) and the allowed values.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, get_args

import msgspec

from .errors import InvalidWorkload
from .spec import (
    AWQ,
    FP8,
    GPTQ,
    MXFP4,
    NVFP4,
    BitsAndBytes4bit,
    CompressedTensors,
    Int8,
    Quantization,
)
from .spec.precision import AWQVersion, CTFormat, CTStrategy, GPTQFormat

__all__ = [
    "SUPPORTED_METHODS",
    "CheckpointQuantization",
    "is_not_converted",
    "parse_quantization_config",
]

SUPPORTED_METHODS: tuple[str, ...] = (
    "awq",
    "bitsandbytes",
    "compressed-tensors",
    "fbgemm_fp8",
    "fp8",
    "gptq",
    "modelopt",
    "mxfp4",
)
"""The ``quant_method`` values this module reads (``modelopt_fp4`` is vLLM's name for
``modelopt`` NVFP4 and is read as ``modelopt``)."""

_ROOT = "quantization_config"

_DTYPE_NAMES = {
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "fp16": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "fp32": "fp32",
    "float8_e4m3fn": "fp8_e4m3",
    "fp8_e4m3": "fp8_e4m3",
    "uint8": "uint8",
}

_CT_FORMATS: tuple[str, ...] = get_args(CTFormat)
_CT_ALL_FORMATS = (*_CT_FORMATS, "nvfp4-pack-quantized", "mxfp4-pack-quantized")
_CT_STRATEGIES: tuple[str, ...] = get_args(CTStrategy)
_AWQ_VERSIONS: tuple[str, ...] = get_args(AWQVersion)
_GPTQ_FORMATS: tuple[str, ...] = get_args(GPTQFormat)
_MODELOPT_ALGOS = ("NVFP4", "W4A16_NVFP4", "FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO")


@dataclass(frozen=True, slots=True)
class CheckpointQuantization:
    """What a checkpoint's ``quantization_config`` deploys."""

    scheme: Quantization
    """What the analytic tier computes with."""
    method: str
    """``quant_method`` as written (awq, gptq, bitsandbytes, fp8, fbgemm_fp8, compressed-tensors,
    mxfp4, modelopt)."""
    not_converted: tuple[str, ...]
    """Module-name patterns left unquantized, as written (``modules_to_not_convert``,
    ``ignore``, ``llm_int8_skip_modules``, ``exclude_modules``, ``ignored_layers``, GPTQModel
    ``-:`` patterns); match them with :func:`is_not_converted`."""
    compute_dtype: str | None
    """The compute dtype the config names (``bnb_4bit_compute_dtype``): bf16 / fp16 / fp32."""
    summary: str
    """Words for the answer."""

    def leaves_unquantized(self, module_path: str) -> bool:
        """Whether the checkpoint leaves ``module_path`` unquantized, by the matching rule of
        the library that reads this ``quant_method`` (:func:`is_not_converted`)."""
        return bool(self.not_converted) and is_not_converted(
            module_path, self.not_converted, method=self.method
        )


def _fail(field: str, message: str) -> InvalidWorkload:
    return InvalidWorkload(f"{_ROOT}.{field}" if field else _ROOT, message)


def _allowed(values: Sequence[object]) -> str:
    return ", ".join(str(v) for v in values)


def _int(qc: Mapping[str, Any], keys: tuple[str, ...], default: int, path: str = "") -> int:
    for key in keys:
        if key in qc and qc[key] is not None:
            value = qc[key]
            if isinstance(value, bool) or not isinstance(value, int):
                raise _fail(f"{path}{key}", f"must be an integer, got {value!r}")
            return value
    return default


def _bool(qc: Mapping[str, Any], key: str, default: bool, path: str = "") -> bool:
    value = qc.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _fail(f"{path}{key}", f"must be true or false, got {value!r}")
    return value


def _str(qc: Mapping[str, Any], keys: tuple[str, ...], path: str = "") -> str | None:
    for key in keys:
        value = qc.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise _fail(f"{path}{key}", f"must be a string, got {value!r}")
            return value
    return None


def _patterns(qc: Mapping[str, Any], keys: tuple[str, ...], path: str = "") -> tuple[str, ...]:
    out: list[str] = []
    for key in keys:
        value = qc.get(key)
        if value is None:
            continue
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise _fail(f"{path}{key}", f"must be a list of module names, got {value!r}")
        for item in value:
            if not isinstance(item, str):
                raise _fail(f"{path}{key}", f"must be a list of module names, got {item!r}")
            if item not in out:
                out.append(item)
    return tuple(out)


def _dtype(value: object, field: str) -> str:
    name = str(value).removeprefix("torch.")
    if name not in _DTYPE_NAMES:
        raise _fail(field, f"unknown dtype {value!r}; allowed: {_allowed(sorted(_DTYPE_NAMES))}")
    return _DTYPE_NAMES[name]


def _group_words(group_size: int) -> str:
    return "one group per row" if group_size == -1 else f"group {group_size}"


def _group_size(qc: Mapping[str, Any], keys: tuple[str, ...], default: int) -> int:
    value = _int(qc, keys, default)
    if value == 0 or value < -1:
        raise _fail(keys[0], f"must be -1 (one group) or >= 1, got {value}")
    return value


def _skip_note(patterns: tuple[str, ...]) -> str:
    return f"; not quantized: {', '.join(patterns)}" if patterns else ""


# --- per method -------------------------------------------------------------------------------


def _awq(qc: Mapping[str, Any], model_dtype: str) -> CheckpointQuantization:
    bits = _int(qc, ("bits", "w_bit"), 4)
    if bits != 4:
        raise _fail("bits", f"AWQ checkpoints store 4-bit weights; allowed: 4, got {bits}")
    group_size = _group_size(qc, ("group_size", "q_group_size"), 128)
    # transformers AwqConfig: a legacy `version` overrides `format` (lower-cased).
    version = (_str(qc, ("version", "format")) or "gemm").lower()
    if version not in _AWQ_VERSIONS:
        key = "version" if qc.get("version") is not None else "format"
        raise _fail(key, f"unknown AWQ layout {version!r}; allowed: {_allowed(_AWQ_VERSIONS)}")
    zero_point = _bool(qc, "zero_point", True)
    skip = _patterns(qc, ("modules_to_not_convert",))
    scheme = AWQ(bits=4, group_size=group_size, version=version)  # type: ignore[arg-type]
    zeros = "zero points" if zero_point else "no zero points"
    if version == "marlin":
        zeros = "no zeros stored"
    summary = (
        f"AWQ 4-bit {version.upper()}, {_group_words(group_size)}, {zeros} "
        f"({_ROOT}){_skip_note(skip)}"
    )
    return CheckpointQuantization(scheme, "awq", skip, None, summary)


def _gptq(qc: Mapping[str, Any], model_dtype: str) -> CheckpointQuantization:
    bits = _int(qc, ("bits",), 4)
    if bits not in (2, 3, 4, 8):
        raise _fail("bits", f"GPTQ bits must be one of 2, 3, 4, 8, got {bits}")
    group_size = _group_size(qc, ("group_size",), 128)
    desc_act = _bool(qc, "desc_act", False)
    sym = _bool(qc, "sym", True)
    fmt = _str(qc, ("checkpoint_format", "format"))
    if fmt is None:
        fmt = "marlin" if _bool(qc, "is_marlin_format", False) else "gptq"
    fmt = fmt.lower()
    if fmt not in _GPTQ_FORMATS:
        key = "checkpoint_format" if qc.get("checkpoint_format") is not None else "format"
        raise _fail(key, f"unknown GPTQ checkpoint format {fmt!r}; allowed: gptq, gptq_v2, marlin")
    if fmt == "marlin" and bits != 4:
        raise _fail("bits", f"the marlin checkpoint format stores 4-bit weights, got {bits}")
    dynamic = qc.get("dynamic")
    negative: tuple[str, ...] = ()
    notes = ""
    if isinstance(dynamic, Mapping):
        negative = tuple(k for k in dynamic if isinstance(k, str) and k.startswith("-:"))
        if len(negative) < len(dynamic):
            notes = "; per-module overrides in `dynamic` not modelled"
    skip = (*_patterns(qc, ("modules_to_not_convert",)), *negative)
    scheme = GPTQ(
        bits=bits,  # type: ignore[arg-type]
        group_size=group_size,
        checkpoint_format=fmt,  # type: ignore[arg-type]
        quantize_lm_head=_bool(qc, "lm_head", False),
    )
    summary = (
        f"GPTQ {bits}-bit, {_group_words(group_size)}, desc_act {str(desc_act).lower()}, "
        f"{'symmetric' if sym else 'asymmetric'}, {fmt} format ({_ROOT}){_skip_note(skip)}{notes}"
    )
    return CheckpointQuantization(scheme, "gptq", skip, None, summary)


def _bitsandbytes(qc: Mapping[str, Any], model_dtype: str) -> CheckpointQuantization:
    four = bool(qc.get("load_in_4bit") or qc.get("_load_in_4bit"))
    eight = bool(qc.get("load_in_8bit") or qc.get("_load_in_8bit"))
    skip = _patterns(qc, ("llm_int8_skip_modules", "modules_to_not_convert"))
    if eight and not four:
        summary = (
            f"bitsandbytes LLM.int8: int8 weights with an fp32 scale per row (SCB) "
            f"({_ROOT}){_skip_note(skip)}"
        )
        return CheckpointQuantization(Int8(scale_dtype="fp32"), "bitsandbytes", skip, None, summary)
    if not four:
        raise _fail("load_in_4bit", "a bitsandbytes config sets load_in_4bit or load_in_8bit")
    quant_type = (_str(qc, ("bnb_4bit_quant_type",)) or "nf4").lower()
    if quant_type not in ("nf4", "fp4"):
        raise _fail("bnb_4bit_quant_type", f"allowed: nf4, fp4, got {quant_type!r}")
    double = _bool(qc, "bnb_4bit_use_double_quant", False)
    compute_value = qc.get("bnb_4bit_compute_dtype")
    compute = None if compute_value is None else _dtype(compute_value, "bnb_4bit_compute_dtype")
    if compute is not None and compute not in ("bf16", "fp16", "fp32"):
        raise _fail("bnb_4bit_compute_dtype", f"allowed: bfloat16, float16, float32, got {compute}")
    scheme = BitsAndBytes4bit(
        quant_type=quant_type,  # type: ignore[arg-type]
        double_quant=double,
        prequantized=True,
    )
    summary = (
        f"bitsandbytes {quant_type.upper()} 4-bit, blocks of 64"
        f"{', double quantization' if double else ''}"
        f"{f', compute {compute}' if compute else ''} ({_ROOT}){_skip_note(skip)}"
    )
    return CheckpointQuantization(scheme, "bitsandbytes", skip, compute, summary)


def _fp8(qc: Mapping[str, Any], model_dtype: str) -> CheckpointQuantization:
    block = qc.get("weight_block_size")
    scheme_words: str
    activation = (_str(qc, ("activation_scheme",)) or "dynamic").lower()
    if activation not in ("dynamic", "static"):
        raise _fail("activation_scheme", f"allowed: dynamic, static, got {activation!r}")
    static = activation == "static"
    expert_dtype = _str(qc, ("expert_dtype",))
    if expert_dtype is not None and expert_dtype.lower() != "fp8":
        # transformers 5.23.0 FineGrainedFP8Config.expert_dtype: "fp4" stores routed experts in
        # fp4, a second layout this scheme does not describe.
        raise _fail(
            "expert_dtype", f"fp4 experts are not modelled; allowed: fp8, got {expert_dtype!r}"
        )
    if block is None:
        scheme = FP8(granularity="tensor", input_scale=static)
        scheme_words = "one fp32 scale per tensor"
    else:
        if (
            not isinstance(block, Sequence)
            or len(block) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in block)
        ):
            raise _fail(
                "weight_block_size", f"must be [rows, cols] of positive ints, got {block!r}"
            )
        if block[0] != block[1]:
            raise _fail(
                "weight_block_size",
                f"square blocks [n, n] are modelled, got {list(block)}",
            )
        scheme = FP8(granularity="block", block_size=int(block[0]), input_scale=static)
        scheme_words = f"{block[0]}x{block[1]} blocks (fp32 weight_scale_inv)"
    fmt = _str(qc, ("fmt",)) or "e4m3"
    notes = ""
    if _str(qc, ("scale_fmt",)) == "ue8m0":
        notes = "; scale_fmt ue8m0 (power-of-two scales, stored fp32)"
    skip = _patterns(qc, ("modules_to_not_convert", "ignored_layers"))
    summary = (
        f"fp8 {fmt}, {scheme_words}, {activation} activations ({_ROOT}){notes}{_skip_note(skip)}"
    )
    return CheckpointQuantization(scheme, "fp8", skip, None, summary)


def _fbgemm_fp8(qc: Mapping[str, Any], model_dtype: str) -> CheckpointQuantization:
    skip = _patterns(qc, ("modules_to_not_convert",))
    summary = (
        f"FBGEMM fp8 e4m3, one fp32 scale per output channel, dynamic activations "
        f"({_ROOT}){_skip_note(skip)}"
    )
    return CheckpointQuantization(FP8(granularity="channel"), "fbgemm_fp8", skip, None, summary)


def _mxfp4(qc: Mapping[str, Any], model_dtype: str) -> CheckpointQuantization:
    skip = _patterns(qc, ("modules_to_not_convert",))
    summary = (
        f"MXFP4 (fp4 e2m1, one e8m0 scale per 32) on the routed experts ({_ROOT}){_skip_note(skip)}"
    )
    return CheckpointQuantization(MXFP4(), "mxfp4", skip, None, summary)


def _modelopt(qc: Mapping[str, Any], model_dtype: str) -> CheckpointQuantization:
    nested = qc.get("quantization")
    body: Mapping[str, Any] = nested if isinstance(nested, Mapping) else qc
    prefix = "quantization." if isinstance(nested, Mapping) else ""
    algo_value = _str(body, ("quant_algo",), prefix)
    if algo_value is None:
        raise _fail(f"{prefix}quant_algo", f"missing; allowed: {_allowed(_MODELOPT_ALGOS)}")
    algo = algo_value.upper()
    if algo not in _MODELOPT_ALGOS:
        raise _fail(
            f"{prefix}quant_algo",
            f"unsupported ModelOpt algorithm {algo_value!r} (MIXED_PRECISION per-layer "
            f"algorithms are not modelled); allowed: {_allowed(_MODELOPT_ALGOS)}",
        )
    skip = _patterns(body, ("ignore", "exclude_modules"), prefix) or _patterns(
        qc, ("ignore", "exclude_modules")
    )
    group = next(iter(_mapping(qc.get("config_groups")).values()), None)
    group_map = group if isinstance(group, Mapping) else {}
    weights = _mapping(group_map.get("weights"))
    activations = group_map.get("input_activations")
    dynamic_inputs = isinstance(activations, Mapping) and activations.get("dynamic") is True
    kv = _str(body, ("kv_cache_quant_algo",), prefix)
    kv_words = f"; KV cache {kv}" if kv else ""
    scheme: Quantization
    if algo in ("NVFP4", "W4A16_NVFP4"):
        group_size = _int(body, ("group_size",), _int(weights, ("group_size",), 16), prefix)
        if group_size != 16:
            raise _fail(
                f"{prefix}group_size", f"NVFP4 scales 16 elements; allowed: 16, got {group_size}"
            )
        w4a4 = algo == "NVFP4"
        scheme = NVFP4(input_scale=w4a4 and not dynamic_inputs)
        words = (
            "NVFP4 W4A4: fp4 e2m1, fp8 scale per 16, fp32 global and input scales"
            if w4a4
            else "NVFP4 W4A16: fp4 e2m1, fp8 scale per 16, fp32 global scale"
        )
    elif algo == "FP8":
        scheme = FP8(granularity="tensor", input_scale=not dynamic_inputs)
        words = "fp8 e4m3, fp32 weight and input scales per tensor"
    elif algo == "FP8_PER_CHANNEL_PER_TOKEN":
        scheme = FP8(granularity="channel")
        words = "fp8 e4m3, fp32 scale per output channel, per-token activations"
    else:
        scheme = FP8(granularity="block", block_size=128)
        words = "fp8 e4m3, 128x128 blocks (weight only)"
    summary = f"ModelOpt {words} ({_ROOT}){kv_words}{_skip_note(skip)}"
    return CheckpointQuantization(scheme, "modelopt", skip, None, summary)


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


# --- compressed-tensors -----------------------------------------------------------------------


def _ct_infer_format(weights: Mapping[str, Any], activations: object) -> str:
    """compressed-tensors 0.20.1 ``compressors/format.py`` 18-28 priority: mxfp4 (fp4 group 32),
    nvfp4 (fp4 group 16), int-quantized (int with activations), pack-quantized (int),
    float-quantized (float with activations), naive-quantized."""
    kind = str(weights.get("type", "int")).lower()
    bits = weights.get("num_bits", 8)
    group = weights.get("group_size")
    if kind == "float" and bits == 4:
        return "mxfp4-pack-quantized" if group == 32 else "nvfp4-pack-quantized"
    if kind == "int":
        return "int-quantized" if activations is not None else "pack-quantized"
    return "float-quantized" if activations is not None else "naive-quantized"


def _ct_strategy(weights: Mapping[str, Any], path: str) -> str:
    strategy = weights.get("strategy")
    group_size = weights.get("group_size")
    if strategy is None:  # quant_args.py 353-365
        if group_size is None:
            return "tensor"
        return "channel" if group_size == -1 else "group"
    name = str(strategy).lower()
    if name not in _CT_STRATEGIES:
        raise _fail(
            f"{path}strategy",
            f"unsupported strategy {strategy!r}; allowed: {_allowed(_CT_STRATEGIES)}",
        )
    return name


def _ct_scheme(
    fmt: str,
    weights: Mapping[str, Any],
    activations: object,
    path: str,
    model_dtype: str,
) -> tuple[Quantization, str]:
    kind = str(weights.get("type", "int")).lower()
    if kind not in ("int", "float"):
        raise _fail(f"{path}type", f"allowed: int, float, got {kind!r}")
    bits = _int(weights, ("num_bits",), 8, path)
    static_inputs = isinstance(activations, Mapping) and activations.get("dynamic") is False
    if fmt == "nvfp4-pack-quantized":
        if kind != "float" or bits != 4:
            raise _fail(f"{path}num_bits", "nvfp4-pack-quantized stores float 4-bit weights")
        w4a4 = isinstance(activations, Mapping) and activations.get("dynamic") is not True
        words = "NVFP4 W4A4" if w4a4 else "NVFP4 W4A16 (NVFP4A16)"
        return NVFP4(input_scale=w4a4), f"{words}: fp4 e2m1, fp8 scale per 16, fp32 global scale"
    if fmt == "mxfp4-pack-quantized":
        if kind != "float" or bits != 4:
            raise _fail(f"{path}num_bits", "mxfp4-pack-quantized stores float 4-bit weights")
        return MXFP4(), "MXFP4: fp4 e2m1, one e8m0 scale per 32"
    strategy = _ct_strategy(weights, path)
    group_size = weights.get("group_size")
    block = weights.get("block_structure")
    if isinstance(block, str):  # quant_args.py 289-293: "128x128"
        block = [int(b) for b in block.split("x")] if re.fullmatch(r"\d+x\d+", block) else block
    scale = weights.get("scale_dtype")
    scale_dtype = model_dtype if scale is None else _dtype(scale, f"{path}scale_dtype")
    actorder = weights.get("actorder")
    g_idx = actorder is True or str(actorder).lower() in ("group", "dynamic")
    fields = {
        "scheme": "compressed_tensors",
        "format": fmt,
        "num_bits": bits,
        "type": kind,
        "strategy": strategy,
        "group_size": group_size if strategy in ("group", "tensor_group") else None,
        "block_structure": block if strategy == "block" else None,
        "symmetric": _bool(weights, "symmetric", True, path),
        "scale_dtype": scale_dtype,
        "g_idx": g_idx,
        "input_scale": static_inputs,
    }
    try:
        scheme = msgspec.convert(fields, CompressedTensors)
    except (msgspec.ValidationError, ValueError) as exc:
        raise _fail(path.rstrip("."), str(exc)) from None
    width = f"{kind}{bits}" if kind == "int" else f"fp{bits}"
    granularity = {
        "tensor": "one scale per tensor",
        "channel": "one scale per output channel",
        "group": f"group {scheme.group_size}",
        "tensor_group": f"group {scheme.group_size} with a global scale",
        "block": f"{_block_words(scheme)} blocks",
    }[strategy]
    words = (
        f"{fmt}: {width} weights, {granularity}, "
        f"{'symmetric' if scheme.symmetric else 'asymmetric (zero points)'}, "
        f"{scheme.scale_dtype} scales"
    )
    return scheme, words


def _block_words(scheme: CompressedTensors) -> str:
    rows, cols = scheme.block_structure or (0, 0)
    return f"{rows}x{cols}"


def _compressed_tensors(qc: Mapping[str, Any], model_dtype: str) -> CheckpointQuantization:
    top = _str(qc, ("format",))
    groups = qc.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise _fail("config_groups", "a compressed-tensors config needs config_groups")
    found: list[tuple[str, Quantization, str, tuple[str, ...]]] = []
    for name, group in groups.items():
        path = f"config_groups.{name}."
        if not isinstance(group, Mapping):
            raise _fail(path.rstrip("."), "must be an object")
        weights = group.get("weights")
        if weights is None:
            continue  # an activation- or KV-only group
        if not isinstance(weights, Mapping):
            raise _fail(f"{path}weights", "must be an object")
        fmt = _str(group, ("format",), path) or top
        if fmt is None or fmt == "mixed-precision":
            fmt = _ct_infer_format(weights, group.get("input_activations"))
        if fmt not in _CT_ALL_FORMATS:
            field = f"{path}format" if group.get("format") is not None else "format"
            raise _fail(
                field,
                f"unsupported compressed-tensors format {fmt!r} (dense and sparse formats store "
                f"no quantized weights); allowed: {_allowed(_CT_ALL_FORMATS)}",
            )
        scheme, words = _ct_scheme(
            fmt, weights, group.get("input_activations"), f"{path}weights.", model_dtype
        )
        targets = _patterns(group, ("targets",), path)
        found.append((str(name), scheme, words, targets))
    if not found:
        raise _fail("config_groups", "no group quantizes weights")
    first = found[0][1]
    if any(s != first for _, s, _, _ in found[1:]):
        names = ", ".join(f"{n} ({w})" for n, _, w, _ in found)
        raise _fail(
            "config_groups",
            f"groups quantize weights differently ({names}); one scheme per model is modelled",
        )
    skip = _patterns(qc, ("ignore",))
    targets = tuple(t for _, _, _, ts in found for t in ts)
    target_words = "" if targets in ((), ("Linear",)) else f"; targets: {', '.join(targets)}"
    summary = f"compressed-tensors {found[0][2]} ({_ROOT}){target_words}{_skip_note(skip)}"
    return CheckpointQuantization(first, "compressed-tensors", skip, None, summary)


_PARSERS: dict[str, Callable[[Mapping[str, Any], str], CheckpointQuantization]] = {
    "awq": _awq,
    "bitsandbytes": _bitsandbytes,
    "compressed-tensors": _compressed_tensors,
    "fbgemm_fp8": _fbgemm_fp8,
    "fp8": _fp8,
    "gptq": _gptq,
    "modelopt": _modelopt,
    "modelopt_fp4": _modelopt,
    "mxfp4": _mxfp4,
}


def parse_quantization_config(
    qc: Mapping[str, Any], *, model_dtype: str | None = None
) -> CheckpointQuantization:
    """The scheme a ``quantization_config`` deploys. ``model_dtype`` is the checkpoint's
    ``torch_dtype`` (bf16 / fp16 / fp32, default bf16): compressed-tensors keeps its scales in it
    unless the config names a ``scale_dtype``. Like transformers
    (``quantizers/auto.py`` ``AutoQuantizationConfig.from_dict``), ``load_in_4bit`` /
    ``load_in_8bit`` select bitsandbytes whatever the method; a config without ``quant_method``
    but with ``quant_algo`` is ModelOpt's (vLLM ``modelopt.py`` 328-365)."""
    dtype = "bf16" if model_dtype is None else _DTYPE_NAMES.get(model_dtype.removeprefix("torch."))
    if dtype not in ("bf16", "fp16", "fp32"):
        raise InvalidWorkload(
            "torch_dtype", f"allowed: bfloat16, float16, float32, got {model_dtype!r}"
        )
    if any(qc.get(k) for k in ("load_in_4bit", "load_in_8bit", "_load_in_4bit", "_load_in_8bit")):
        return _bitsandbytes(qc, dtype)
    method = qc.get("quant_method")
    if method is None:
        nested = qc.get("quantization")
        if "quant_algo" in qc or (isinstance(nested, Mapping) and "quant_algo" in nested):
            return _modelopt(qc, dtype)
        raise _fail(
            "quant_method", f"missing; supported quant_method values: {_allowed(SUPPORTED_METHODS)}"
        )
    if not isinstance(method, str) or method.lower() not in _PARSERS:
        raise _fail(
            "quant_method",
            f"unsupported quant_method {method!r}; supported: {_allowed(SUPPORTED_METHODS)}",
        )
    return _PARSERS[method.lower()](qc, dtype)


# --- which modules stay unquantized -----------------------------------------------------------

_BOUNDARY = r"(?:(?<=\.)|(?=\.|$))"


def _transformers_match(module_path: str, pattern: str) -> bool:
    """transformers 5.23.0 ``quantizers/quantizers_utils.py`` 26-37 ``should_convert_module``:
    the pattern as a regex from the start up to a module boundary, or as a suffix. A pattern
    that is no valid regex (ModelOpt's ``*.mlp.gate``) is matched as a shell wildcard."""
    try:
        if re.match(rf"(?:{pattern}){_BOUNDARY}", module_path):
            return True
    except re.error:
        return fnmatch.fnmatchcase(module_path, pattern)
    return module_path.endswith(pattern)


def _modelopt_match(module_path: str, pattern: str) -> bool:
    """vLLM 0.34.0 ``quantization/modelopt.py`` 198-235 ``is_layer_excluded``: exact, substring
    (older exports), then ``fnmatch`` wildcards."""
    return pattern == module_path or pattern in module_path or fnmatch.fnmatch(module_path, pattern)


def is_not_converted(
    module_path: str, patterns: Sequence[str], *, method: str | None = None
) -> bool:
    """Whether ``module_path`` (``model.layers.0.mlp.down_proj``) matches one of the patterns a
    config leaves unquantized, by the rule of the library that reads them:

    - ``re:<regex>``: compressed-tensors 0.20.1 ``utils/match.py`` 442-443 ``match_name``
      (``re.match``, anchored at the start only); other compressed-tensors patterns are exact
      names (445) when ``method`` is ``compressed-tensors`` (class names such as ``Linear`` are
      not module paths and never match here).
    - ``-:<regex>``: GPTQModel 7.7.0 ``quantization/config.py`` 2541-2607 (a negative
      ``dynamic`` rule, ``compiled.match``).
    - ``method`` ``modelopt``: vLLM's ``is_layer_excluded`` (exact, substring, wildcard).
    - otherwise transformers' ``should_convert_module`` (prefix up to a module boundary, regex,
      or suffix): ``lm_head`` matches ``lm_head``, ``model.layers.*.self_attn`` matches
      ``model.layers.3.self_attn.q_proj``, ``mlp.gate`` does not match ``mlp.gate_proj``.
    """
    for pattern in patterns:
        if pattern.startswith("re:"):
            if re.match(pattern[3:], module_path):
                return True
        elif pattern.startswith("-:"):
            if re.match(pattern[2:], module_path):
                return True
        elif method == "compressed-tensors":
            if pattern == module_path:
                return True
        elif method in ("modelopt", "modelopt_fp4"):
            if _modelopt_match(module_path, pattern):
                return True
        elif _transformers_match(module_path, pattern):
            return True
    return False
