"""Output quality after a precision or format change: the probe's model run teacher-forced over an
evaluation set in a reference precision and in each candidate, compared position by position.

Three parts:

* the metrics (pure functions of float32 logits and target ids): top-1 agreement, the KL
  divergence KL(reference || candidate) of the next-token distributions in nats (both
  ``log_softmax`` taken in float64, so an identical pair gives exactly 0), its mean and 99th
  percentile (linear interpolation, numpy's default), and each side's perplexity on the targets;
* the formats, emulated by their rounding where the host has no kernel for them (every linear
  weight quantized and dequantized in float32, then computed in the precision's compute dtype):
  fp8 e4m3 (``fp8_round``, vLLM's dynamic per-tensor scale amax / 448 and dynamic activation
  scales), bitsandbytes LLM.int8 (``int8_rowwise``, per output channel and per token, without
  the fp16 outlier columns), GPTQ / AWQ (``rtn``: round-to-nearest, asymmetric, an upper bound on
  their error), bitsandbytes NF4 / FP4 (``blockwise_4bit``: the code tables and blockwise absmax
  of bitsandbytes), compressed-tensors integer and fp8 weights, and an fp8 KV cache (the
  ``k_proj`` / ``v_proj`` outputs rounded through fp8 with scale 1.0);
* ``evaluate``: one set of master weights (the checkpoint's, or a seeded synthetic draw), copied
  into one model per precision, run one at a time.

Sources of the emulations (the files read): bitsandbytes 0.50.2.dev0 (commit 95f9af3)
``bitsandbytes/functional.py`` ``get_4bit_type`` 772-859 (the NF4 and FP4 tables),
``create_dynamic_map`` 296-348 and ``quantize_4bit`` 938-949 (double quantization: absmax minus
its mean, quantized blockwise in blocks of 256 with the dynamic map),
``bitsandbytes/backends/default/ops.py`` 142-167 (``int8_vectorwise_quant``: round(A * 127 /
row absmax)), 180-197 (``quantize_blockwise``) and 233-260 (``quantize_4bit``: absmax per block,
the scaled value bucketized between the sorted code's midpoints); AutoAWQ 0.2.9
``awq/quantize/quantizer.py`` ``pseudo_quantize_tensor`` (scales = (max - min).clamp(1e-5) /
(2^bits - 1), zeros = clamp(-round(min / scale))); GPTQ ``quant.py`` ``Quantizer.find_params``
(the range widened to include 0, zero = round(-min / scale)); vLLM ``scaled_fp8_quant`` (dynamic
per-tensor scale amax / 448, saturating conversion).
"""

from __future__ import annotations

import gc
import math
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec
import torch
from torch import nn

from vrambudget.core.deployed import deploy
from vrambudget.core.probe_quality import QualityCheck, QualityReport, QualityResult
from vrambudget.core.quality_formats import unsupported_quantization
from vrambudget.core.resolve import resolve_model
from vrambudget.core.spec import (
    AWQ,
    FP8,
    GPTQ,
    BitsAndBytes4bit,
    CompressedTensors,
    InferenceWorkload,
    Int8,
    Precision,
)

from .run import TORCH_DTYPES

__all__ = [
    "FP4_CODE",
    "NF4_CODE",
    "Scores",
    "blockwise_4bit",
    "compare",
    "dynamic_map",
    "evaluate",
    "fp8_round",
    "int8_rowwise",
    "judge",
    "kl_divergence",
    "load_passages",
    "perplexity",
    "rtn",
    "tokenize",
    "top1_agreement",
]

# bitsandbytes functional.py get_4bit_type (772-859): NF4 as listed; FP4 in bit-pattern order,
# normalized by its largest magnitude (12).
NF4_CODE: tuple[float, ...] = (
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
)
FP4_CODE: tuple[float, ...] = tuple(
    v / 12.0
    for v in (0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0, -0.0, -0.0625, -8.0, -12.0, -4.0, -6.0)
    + (-2.0, -3.0)
)
_FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
_CHUNK = 256  # positions per float64 log_softmax


# ----------------------------------------------------------------------------- metrics --


def _log_probs(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.to(torch.float64), dim=-1)


def kl_divergence(ref_logits: torch.Tensor, cand_logits: torch.Tensor) -> torch.Tensor:
    """KL(reference || candidate) per position, nats, float64: sum_v p_ref (log p_ref -
    log p_cand), both ``log_softmax`` in float64. Logits are (positions, vocab)."""
    out = []
    for start in range(0, ref_logits.shape[0], _CHUNK):
        lp = _log_probs(ref_logits[start : start + _CHUNK])
        lq = _log_probs(cand_logits[start : start + _CHUNK])
        out.append((lp.exp() * (lp - lq)).sum(dim=-1).clamp(min=0.0))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


def top1_agreement(ref_logits: torch.Tensor, cand_logits: torch.Tensor) -> float:
    """Fraction of positions where both put their largest logit on the same token."""
    if ref_logits.shape[0] == 0:
        return 1.0
    same = ref_logits.argmax(dim=-1) == cand_logits.argmax(dim=-1)
    return float(same.double().mean().item())


def _nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    out = []
    for start in range(0, logits.shape[0], _CHUNK):
        lp = _log_probs(logits[start : start + _CHUNK])
        t = targets[start : start + _CHUNK].to(lp.device)
        out.append(-lp.gather(-1, t[:, None]).squeeze(-1))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


def perplexity(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """exp(mean negative log-likelihood of ``targets``) under ``logits`` (position i predicts
    ``targets[i]``)."""
    nll = _nll(logits, targets)
    return math.exp(float(nll.mean().item())) if nll.numel() else 1.0


@dataclass(frozen=True, slots=True)
class Scores:
    """A candidate against the reference over every compared position."""

    positions: int
    token_agreement: float
    mean_kl: float
    p99_kl: float
    reference_perplexity: float
    perplexity: float

    @property
    def perplexity_increase(self) -> float:
        return self.perplexity / self.reference_perplexity - 1.0


@dataclass(slots=True)
class _Accumulator:
    agree: list[torch.Tensor] = field(default_factory=list)
    kl: list[torch.Tensor] = field(default_factory=list)
    ref_nll: list[torch.Tensor] = field(default_factory=list)
    nll: list[torch.Tensor] = field(default_factory=list)

    def add(self, ref: torch.Tensor, cand: torch.Tensor, targets: torch.Tensor) -> None:
        self.agree.append(ref.argmax(dim=-1) == cand.argmax(dim=-1))
        self.kl.append(kl_divergence(ref, cand))
        self.ref_nll.append(_nll(ref, targets))
        self.nll.append(_nll(cand, targets))

    def scores(self) -> Scores:
        if not self.kl:
            return Scores(0, 1.0, 0.0, 0.0, 1.0, 1.0)
        kl = torch.cat(self.kl)
        return Scores(
            positions=int(kl.numel()),
            token_agreement=float(torch.cat(self.agree).double().mean().item()),
            mean_kl=float(kl.mean().item()),
            p99_kl=float(torch.quantile(kl, 0.99).item()),
            reference_perplexity=math.exp(float(torch.cat(self.ref_nll).mean().item())),
            perplexity=math.exp(float(torch.cat(self.nll).mean().item())),
        )


def compare(ref_logits: torch.Tensor, cand_logits: torch.Tensor, targets: torch.Tensor) -> Scores:
    """Every metric of one candidate: logits (positions, vocab) float32, ``targets[i]`` the token
    position i predicts."""
    acc = _Accumulator()
    acc.add(ref_logits, cand_logits, targets)
    return acc.scores()


def judge(label: str, scores: Scores, check: QualityCheck, emulated: str | None) -> QualityResult:
    """The candidate's result with pass/fail against the request's thresholds (each miss in
    words)."""
    reasons = []
    if scores.mean_kl > check.max_mean_kl:
        reasons.append(
            f"mean KL {scores.mean_kl:.6g} nats per token is over max_mean_kl {check.max_mean_kl:g}"
        )
    if scores.token_agreement < check.min_token_agreement:
        reasons.append(
            f"top-1 agreement {scores.token_agreement:.4f} is under min_token_agreement "
            f"{check.min_token_agreement:g}"
        )
    increase = scores.perplexity_increase
    if check.max_perplexity_increase is not None and increase > check.max_perplexity_increase:
        reasons.append(
            f"perplexity {scores.perplexity:.6g} is {100 * increase:.3g} % over the "
            f"reference's {scores.reference_perplexity:.6g} (max_perplexity_increase "
            f"{check.max_perplexity_increase:g})"
        )
    return QualityResult(
        label=label,
        token_agreement=scores.token_agreement,
        mean_kl=scores.mean_kl,
        p99_kl=scores.p99_kl,
        perplexity=scores.perplexity,
        perplexity_increase=increase,
        passed=not reasons,
        reasons=tuple(reasons),
        emulated=emulated,
    )


# ----------------------------------------------------------------------------- formats --


def _padded(x: torch.Tensor, size: int, dim: int) -> torch.Tensor:
    """``x`` with ``dim`` grown to a multiple of ``size`` by repeating its last element: a ragged
    last group keeps its own min, max and absmax."""
    n = x.shape[dim]
    total = -(-n // size) * size
    if total == n:
        return x
    index = torch.arange(total, device=x.device).clamp(max=n - 1)
    return x.index_select(dim, index)


def _grouped(w: torch.Tensor, group: int) -> torch.Tensor:
    """(rows, cols) -> (rows, groups, group) along the last dimension (-1: one group)."""
    g = w.shape[-1] if group <= 0 else min(group, w.shape[-1])
    return _padded(w, g, -1).reshape(*w.shape[:-1], -1, g)


def _ungrouped(q: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return q.reshape(*like.shape[:-1], -1)[..., : like.shape[-1]]


def fp8_round(
    x: torch.Tensor, scale: torch.Tensor | float, dtype: torch.dtype = torch.float8_e4m3fn
) -> torch.Tensor:
    """``x`` quantized to fp8 with ``scale`` (x / scale, saturated at the format's largest
    finite value, rounded by torch's cast) and dequantized, float32."""
    fmax = float(torch.finfo(dtype).max)
    x32 = x.to(torch.float32)
    return (x32 / scale).clamp(-fmax, fmax).to(dtype).to(torch.float32) * scale


def _amax_scale(amax: torch.Tensor, fmax: float = _FP8_MAX) -> torch.Tensor:
    return amax.clamp(min=1e-12) / fmax


def fp8_weight(w: torch.Tensor, granularity: str, block: int = 128) -> torch.Tensor:
    """An fp8 e4m3 weight (out, in) with scales per tensor, per output channel or per
    ``block`` x ``block`` tile, each amax / 448 (vLLM's dynamic fp8)."""
    w = w.to(torch.float32)
    if granularity == "tensor":
        return fp8_round(w, _amax_scale(w.abs().amax()))
    if granularity == "channel":
        return fp8_round(w, _amax_scale(w.abs().amax(dim=1, keepdim=True)))
    rows, cols = w.shape
    tiles = _padded(_padded(w, block, 0), block, 1)
    r, c = tiles.shape[0] // block, tiles.shape[1] // block
    t = tiles.reshape(r, block, c, block)
    scale = _amax_scale(t.abs().amax(dim=(1, 3), keepdim=True))
    return fp8_round(t, scale).reshape(r * block, c * block)[:rows, :cols]


def fp8_activation(x: torch.Tensor, granularity: str, block: int = 128) -> torch.Tensor:
    """Activations rounded through fp8 e4m3 with a dynamic scale: one per tensor (``tensor``),
    per token (``channel``) or per token and ``block`` input features (``block``)."""
    x32 = x.to(torch.float32)
    if granularity == "tensor":
        out = fp8_round(x32, _amax_scale(x32.abs().amax()))
    elif granularity == "channel":
        out = fp8_round(x32, _amax_scale(x32.abs().amax(dim=-1, keepdim=True)))
    else:
        g = _grouped(x32, block)
        out = _ungrouped(fp8_round(g, _amax_scale(g.abs().amax(dim=-1, keepdim=True))), x32)
    return out.to(x.dtype)


def int8_rowwise(x: torch.Tensor) -> torch.Tensor:
    """bitsandbytes ``int8_vectorwise_quant`` (threshold 0) and its dequantization: each row
    (a weight's output channel, an activation's token) as round(x * 127 / row absmax), times
    row absmax / 127."""
    x32 = x.to(torch.float32)
    absmax = x32.abs().amax(dim=-1, keepdim=True)
    q = torch.round(x32 * (127.0 / absmax.clamp(min=1e-12))).clamp(-127, 127)
    return (q * (absmax / 127.0)).to(x.dtype)


def rtn(
    w: torch.Tensor,
    bits: int,
    group: int,
    *,
    symmetric: bool = False,
    zero_in_range: bool = False,
) -> torch.Tensor:
    """Round-to-nearest integer quantization of ``w`` (out, in) per output row and group of
    ``group`` input features (-1: the whole row), dequantized. Asymmetric: scale = (max - min) /
    (2^bits - 1), zero = round(-min / scale) clamped to the code range, q = clamp(round(w / scale)
    + zero) (AutoAWQ ``pseudo_quantize_tensor``; ``zero_in_range``: min <= 0 <= max first, as
    GPTQ's ``Quantizer.find_params``). Symmetric: scale = absmax / (2^(bits-1) - 1)."""
    g = _grouped(w.to(torch.float32), group)
    if symmetric:
        maxq = 2 ** (bits - 1) - 1
        scale = g.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / maxq
        q = torch.round(g / scale).clamp(-maxq - 1, maxq)
        return _ungrouped(q * scale, w)
    maxq = 2**bits - 1
    lo = g.amin(dim=-1, keepdim=True)
    hi = g.amax(dim=-1, keepdim=True)
    if zero_in_range:
        lo, hi = lo.clamp(max=0.0), hi.clamp(min=0.0)
    scale = (hi - lo).clamp(min=1e-5) / maxq
    zero = (-torch.round(lo / scale)).clamp(0, maxq)
    q = (torch.round(g / scale) + zero).clamp(0, maxq)
    return _ungrouped((q - zero) * scale, w)


def dynamic_map() -> torch.Tensor:
    """bitsandbytes' signed 8-bit dynamic map (``create_dynamic_map(signed=True,
    max_exponent_bits=7, total_bits=8)``, functional.py 296-348), 256 sorted values."""
    data: list[float] = []
    non_sign_bits, max_exponent_bits = 7, 7
    for i in range(max_exponent_bits):
        items = int(2 ** (i + non_sign_bits - max_exponent_bits) + 1)
        bounds = torch.linspace(0.1, 1, items, dtype=torch.float32)
        means = (bounds[:-1] + bounds[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    data += [0.0, 1.0]
    data += [0.0] * (256 - len(data))
    data.sort()
    return torch.tensor(data, dtype=torch.float32)


def _blockwise(flat: torch.Tensor, code: torch.Tensor, block: int) -> tuple[torch.Tensor, ...]:
    """bitsandbytes' blockwise quantization of a flat float32 tensor with a sorted ``code``:
    (code indices per block, absmax per block), the last block possibly ragged."""
    blocks = _padded(flat, block, 0).reshape(-1, block)
    absmax = blocks.abs().amax(dim=-1)
    scaled = torch.clamp(blocks / absmax.clamp(min=1e-38)[:, None], -1, 1)
    bounds = (code[:-1] + code[1:]) / 2
    return torch.bucketize(scaled, bounds), absmax


def blockwise_4bit(
    w: torch.Tensor, quant_type: str, block: int, *, double_quant: bool = False
) -> torch.Tensor:
    """bitsandbytes ``quantize_4bit`` then ``dequantize_4bit`` of ``w`` (flattened row-major):
    per block of ``block`` elements the absmax, each element the nearest code value of
    x / absmax; with ``double_quant`` the absmax values less their mean are quantized again
    with the 8-bit dynamic map in blocks of 256 and restored (plus the mean). float32."""
    flat = w.reshape(-1).to(torch.float32)
    table = torch.tensor(NF4_CODE if quant_type == "nf4" else FP4_CODE, dtype=torch.float32)
    code, _ = torch.sort(table)
    index, absmax = _blockwise(flat, code.to(flat.device), block)
    if double_quant:
        offset = absmax.mean()
        dmap = dynamic_map().to(flat.device)
        q2, absmax2 = _blockwise(absmax - offset, dmap, 256)
        absmax = (dmap[q2] * absmax2[:, None]).reshape(-1)[: absmax.numel()] + offset
    out = code.to(flat.device)[index] * absmax[:, None]
    return out.reshape(-1)[: flat.numel()].reshape(w.shape)


# ------------------------------------------------------------------ applying a precision --


@dataclass
class _Format:
    """How one precision changes a linear layer: the weight's rounding, the activations' (or
    None), and the words for the report."""

    weight: Callable[[torch.Tensor], torch.Tensor]
    activation: Callable[[torch.Tensor], torch.Tensor] | None
    words: str


def _linear_format(q: Any, weights: str) -> _Format | None:
    """The emulated format of a deployed precision's linear layers (None: stored natively)."""
    if q is None and weights == "fp8":
        q = FP8()
    match q:
        case None:
            return None
        case FP8(granularity=gran, block_size=block):
            what = {"tensor": "per tensor", "channel": "per output channel"}.get(
                gran, f"per {block}x{block} block"
            )
            act = {"tensor": "per tensor", "channel": "per token"}.get(
                gran, f"per token and {block} input features"
            )
            return _Format(
                lambda t: fp8_weight(t, gran, block),
                lambda x: fp8_activation(x, gran, block),
                f"fp8 e4m3 weights with scales {what} (amax / 448) and activations rounded "
                f"through fp8 e4m3 with dynamic scales {act} (vLLM's dynamic fp8)",
            )
        case Int8():
            return _Format(
                int8_rowwise,
                int8_rowwise,
                "int8 weights per output channel and int8 activations per token (bitsandbytes "
                "LLM.int8 at threshold 0: without the fp16 outlier columns its default "
                "threshold 6.0 keeps, so pessimistic)",
            )
        case GPTQ(bits=bits, group_size=group):
            return _Format(
                lambda t: rtn(t, bits, group, zero_in_range=True),
                None,
                f"round-to-nearest {bits}-bit asymmetric, group {group} (GPTQ's quantizer "
                "without its error-compensating updates: an upper bound on GPTQ's error)",
            )
        case AWQ(bits=bits, group_size=group):
            return _Format(
                lambda t: rtn(t, bits, group),
                None,
                f"round-to-nearest {bits}-bit asymmetric, group {group} (AWQ's quantizer "
                "without its activation-aware scales and clipping: an upper bound on AWQ's "
                "error)",
            )
        case BitsAndBytes4bit(quant_type=qt, block_size=block, double_quant=dq):
            nested = ", absmax double-quantized to 8 bits in blocks of 256" if dq else ""
            return _Format(
                lambda t: blockwise_4bit(t, qt, block, double_quant=dq),
                None,
                f"{qt} quantize -> dequantize of every linear weight, blocksize {block}{nested} "
                "(bitsandbytes' code table and blockwise absmax)",
            )
        case CompressedTensors():
            return _ct_format(q)
    raise ValueError(unsupported_quantization(q) or f"{q!r} is not emulated")


def _ct_format(q: CompressedTensors) -> _Format:
    group = q.group_size or 128
    if q.type == "float":
        gran = {"tensor": "tensor", "channel": "channel"}.get(q.strategy, "block")
        block = q.block_structure[0] if q.block_structure else group

        def weight(t: torch.Tensor) -> torch.Tensor:
            if q.strategy == "group":
                g = _grouped(t.to(torch.float32), group)
                scale = _amax_scale(g.abs().amax(dim=-1, keepdim=True))
                return _ungrouped(fp8_round(g, scale), t)
            return fp8_weight(t, gran, block)

        return _Format(
            weight,
            None,
            f"compressed-tensors fp8 e4m3 weights, strategy {q.strategy} (activations not "
            "quantized)",
        )
    g = {"tensor": -1, "channel": -1}.get(q.strategy, group)

    def int_weight(t: torch.Tensor) -> torch.Tensor:
        if q.strategy == "tensor":
            flat = t.reshape(1, -1)
            return rtn(flat, q.num_bits, -1, symmetric=q.symmetric).reshape(t.shape)
        return rtn(t, q.num_bits, g, symmetric=q.symmetric)

    kind = "symmetric" if q.symmetric else "asymmetric"
    return _Format(
        int_weight,
        None,
        f"compressed-tensors round-to-nearest {q.num_bits}-bit {kind} weights, strategy "
        f"{q.strategy} (activations not quantized)",
    )


def _round_kv(dtype: torch.dtype) -> Callable[[nn.Module, Any, torch.Tensor], torch.Tensor]:
    def hook(module: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
        if dtype.is_floating_point and dtype.itemsize == 1:
            return fp8_round(out, 1.0, dtype).to(out.dtype)
        return out.to(dtype).to(out.dtype)

    return hook


def _activation_hook(
    fn: Callable[[torch.Tensor], torch.Tensor],
) -> Callable[[nn.Module, tuple[Any, ...]], tuple[Any, ...]]:
    def hook(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (fn(args[0]), *args[1:])

    return hook


_KV = re.compile(r"(^|\.)(k_proj|v_proj)$")


@dataclass
class _Built:
    model: nn.Module
    emulated: str | None


def _build(
    w: InferenceWorkload,
    master: dict[str, torch.Tensor],
    builder: Callable[[torch.dtype, torch.device], nn.Module],
    device: torch.device,
) -> _Built:
    """One model in ``w``'s (deployed) precision on ``device``, every value copied from
    ``master``: linear weights the format quantizes rounded and dequantized in float32, the
    others rounded to the storage dtype, all held in the compute dtype."""
    from .hf.program import _quantization_keep

    p = w.precision
    quant = w.precision.quantization
    reason = unsupported_quantization(quant)
    if reason is not None:
        raise ValueError(reason)
    fmt = _linear_format(quant, p.weights)
    if fmt is not None and resolve_model(w.model).moe is not None:
        raise ValueError("quantized expert tensors are not emulated by the quality check")
    compute = TORCH_DTYPES[p.compute]
    storage = TORCH_DTYPES[p.weights] if p.weights != "fp8" else compute
    model = builder(compute, device)
    keep = _quantization_keep(model, w)
    quantized = {
        f"{name}.weight": module
        for name, module in model.named_modules()
        if type(module) is nn.Linear and fmt is not None and not keep(name, module)
    }
    with torch.no_grad():
        for name, param in model.named_parameters():
            src = master[name].to(device=device, dtype=torch.float32)
            src = fmt.weight(src) if name in quantized and fmt is not None else src.to(storage)
            param.copy_(src)
            del src
        for name, buf in model.named_buffers():
            if name in master:
                buf.copy_(master[name])
    notes = []
    if fmt is not None:
        if fmt.activation is not None:
            for module in quantized.values():
                module.register_forward_pre_hook(_activation_hook(fmt.activation))
        notes.append(f"{fmt.words}; {len(quantized)} linear layers, computed in {p.compute}")
    kv = p.kv_cache if p.kv_cache != "auto" else p.compute
    if kv != p.compute:
        kv_dtype = TORCH_DTYPES[kv]
        hooked = [m for n, m in model.named_modules() if _KV.search(n)]
        if not hooked:
            raise ValueError(
                f"a {kv} KV cache is emulated on separate k_proj / v_proj layers; "
                f"{type(model).__name__} has none"
            )
        for module in hooked:
            module.register_forward_hook(_round_kv(kv_dtype))
        scale = " with scale 1.0 (vLLM's kv_cache_dtype=fp8 without scales)" if "fp8" in kv else ""
        notes.append(
            f"keys and values rounded through {kv}{scale} at the k_proj / v_proj outputs "
            "(the real cache rounds keys after RoPE)"
        )
    model.eval()
    return _Built(model, "; ".join(notes) or None)


# -------------------------------------------------------------------------- evaluation --


def load_passages(path: Path | None = None) -> list[str]:
    """Passages of an evaluation file: paragraphs separated by blank lines, a paragraph's lines
    joined by spaces, lines starting with ``#`` left out. None: the shipped passages."""
    if path is None:
        text = resources.files("vrambudget.workloads.data").joinpath("eval_passages.txt")
        raw = text.read_text(encoding="utf-8")
    else:
        raw = path.read_text(encoding="utf-8", errors="replace")
    out: list[str] = []
    current: list[str] = []
    for line in [*raw.splitlines(), ""]:
        if line.lstrip().startswith("#"):
            continue
        if line.strip():
            current.append(line.strip())
        elif current:
            out.append(" ".join(current))
            current = []
    return out


def tokenize(text: str, vocab_size: int, limit: int, tokenizer: Any = None) -> list[int]:
    """The passage's token ids, at most ``limit``: the checkpoint's tokenizer when there is one,
    else each UTF-8 byte ``b`` as id ``b % vocab_size``."""
    if tokenizer is not None:
        ids = list(tokenizer(text)["input_ids"])
    else:
        ids = [b % vocab_size for b in text.encode("utf-8")]
    return ids[:limit]


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


@torch.inference_mode()
def _logits(
    model: nn.Module, sequences: list[torch.Tensor], device: torch.device
) -> Iterator[torch.Tensor]:
    for ids in sequences:
        out = model(input_ids=ids[None, :].to(device), use_cache=False, return_dict=True)
        yield out.logits[0, :-1].to(device="cpu", dtype=torch.float32)
        del out


MasterLoader = Callable[[nn.Module], None]


def evaluate(
    workload: InferenceWorkload,
    check: QualityCheck,
    device: torch.device | None = None,
    *,
    eval_path: Path | None = None,
    checkpoint: str | None = None,
    load_master: MasterLoader | None = None,
) -> QualityReport:
    """Run ``check`` on ``workload``'s model (a resolved model with a ``config.json``).

    Master weights: the checkpoint's (``from_pretrained`` of ``checkpoint``, in its stored
    16-bit dtype or float32; its tokenizer when it has one), ``load_master(model)`` (a hook
    filling the float32 master model), or synthetic (``torch.manual_seed(0)`` and the model's
    own ``_init_weights``; bytes as tokens). Each precision's model is built from them on
    ``device`` (None: the current CUDA device, else the CPU), run over the passages, and freed
    before the next."""
    from .hf.attention import attn_implementation
    from .hf.config import _quiet, build_config, model_class
    from .hf.program import framework_config

    if device is None:
        cuda = torch.cuda.is_available()
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    _free(device)  # what the measurement left (its program is out of scope by now)
    config = framework_config(workload.model)
    if config is None:
        raise ValueError("the quality check needs a model with a config.json")
    cfg = build_config(config, "model.config")
    cls = model_class(cfg, config)
    cfg._attn_implementation = (
        "eager" if workload.attention == "eager" else attn_implementation("sdpa", False)
    )

    tokenizer = None
    weights = "synthetic"
    with _quiet(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if checkpoint is not None:
            if "quantization_config" in config:
                raise ValueError(
                    "the checkpoint is stored quantized: it has no full-precision reference "
                    "to compare with"
                )
            stored = str(config.get("torch_dtype") or config.get("dtype") or "")
            dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(
                stored.removeprefix("torch."), torch.float32
            )
            master_model = cls.from_pretrained(checkpoint, dtype=dtype)
            weights = "checkpoint"
            tokenizer = _tokenizer(checkpoint)
        else:
            torch.manual_seed(0)
            master_model = cls._from_config(cfg, dtype=torch.float32)
            if load_master is not None:
                load_master(master_model)
    master = {**dict(master_model.named_buffers()), **master_model.state_dict()}
    del master_model

    from transformers.initialization import no_init_weights

    def builder(dtype: torch.dtype, on: torch.device) -> nn.Module:
        with _quiet(), no_init_weights(), on:
            model: nn.Module = cls._from_config(cfg, dtype=dtype)
        model.tie_weights()  # type: ignore[operator]
        return model

    vocab = int(cfg.get_text_config().vocab_size)
    positions = getattr(cfg.get_text_config(), "max_position_embeddings", None)
    limit = min(check.sequence_tokens, positions or check.sequence_tokens)
    sequences = []
    for text in load_passages(eval_path):
        ids = tokenize(text, vocab, limit, tokenizer)
        if len(ids) >= 2:
            sequences.append(torch.tensor(ids, dtype=torch.long))
        if len(sequences) == check.max_sequences:
            break
    if not sequences:
        raise ValueError("the evaluation set has no passage of 2 tokens or more")
    targets = [s[1:] for s in sequences]

    def deployed(p: Precision) -> InferenceWorkload:
        return deploy(msgspec.structs.replace(workload, precision=p))

    ref = _build(deployed(check.reference), master, builder, device)
    reference = list(_logits(ref.model, sequences, device))
    del ref
    _free(device)
    results = []
    ref_ppl = 1.0  # every candidate's Scores carries the same reference perplexity
    for candidate in check.candidates:
        built = _build(deployed(candidate.precision), master, builder, device)
        acc = _Accumulator()
        for r, c, t in zip(
            reference, _logits(built.model, sequences, device), targets, strict=True
        ):
            acc.add(r, c, t)
        emulated = built.emulated
        del built
        _free(device)
        scores = acc.scores()
        ref_ppl = scores.reference_perplexity
        results.append(judge(candidate.label, scores, check, emulated))
    return QualityReport(
        eval_set=check.eval_set,
        sequences=len(sequences),
        tokens=sum(int(t.numel()) for t in targets),
        weights=weights,
        reference_perplexity=ref_ppl,
        candidates=tuple(results),
        passed=all(r.passed for r in results),
    )


def _tokenizer(checkpoint: str) -> Any:
    root = Path(checkpoint)
    names = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    if not any((root / n).is_file() for n in names):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoint)
