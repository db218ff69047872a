"""llama.cpp's allocations for a GGUF model, per device: what ``llama-server`` logs as each
backend's model buffer, KV buffer and compute buffer.

- **Model buffers** (``llama_model::load_tensors``, src/llama-model.cpp:1556-1612): the input
  layer (token embeddings) always on the CPU; of the ``n_layer`` repeating layers and the output
  layer, the last ``n_gpu_layers`` go to the GPUs (``i_gpu_start = max(n_layer + 1 - ngl, 0)``),
  split over the GPUs by the cumulative ``--tensor-split`` fractions (``upper_bound`` of
  ``(il - i_gpu_start) / act_gpu_layers``, in float32). A model with tied embeddings keeps a
  duplicate of ``token_embd`` in the output layer (``TENSOR_DUPLICATED``).
- **KV cache** (src/llama-kv-cache.cpp, llama-kv-cache-iswa.cpp:73): ``n_ctx`` cells, padded to
  256 (src/llama-context.cpp:290); per layer ``cells x (row(type_k, n_embd_k_gqa) +
  row(type_v, n_embd_v_gqa))`` on the layer's device; sliding-window layers get
  ``pad(min(n_ctx, n_swa x (unified ? n_seq : 1) + n_ubatch), 256)`` cells.
- **Compute buffers** (``graph_reserve`` at ``n_ubatch`` tokens with every token an output,
  or llama-server's ``n_outputs_max`` from b9460, src/llama-context.cpp:670,896): the peak of
  the graph allocator per backend. Modelled as the largest of the attention scores (without
  flash attention), the FFN intermediates and the logits of the output layer, plus
  activations of width ``n_embd`` (``compute_buffer``), and on the first GPU the copies of
  host-resident weights and caches that partial offload makes (``offloaded_ops``).
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass
from functools import lru_cache

from ...arch import Arch, AttentionKind
from ...errors import InvalidWorkload
from ...spec import GGUFTensorSpec
from ...units import MiB
from .tensors import INPUT, GGUFTensor, file_tensors, gguf_tensors
from .types import BLOCKS, row_bytes

__all__ = [
    "DeviceUse",
    "LlamaAccount",
    "LlamaSettings",
    "compute_buffer",
    "device_buffer",
    "kv_cells",
    "layer_devices",
    "llama_account",
    "pipeline_parallel",
    "unmodelled_compute",
]

QUANTIZED_KV_COMPUTE_FACTOR = 1.3
"""A quantized KV cache with flash attention: measured 0.93 - 1.29 x the f16 compute buffer
(bench/llamacpp_compare.py)."""
QUANTIZED_K_COMPUTE_FACTOR = 1.08
"""A quantized K cache without flash attention: measured 0.93 - 1.07 x the f16 buffer."""
_QUANTIZED_KV = ("q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


@dataclass(frozen=True, slots=True)
class LlamaSettings:
    """The context llama.cpp builds once its defaults and rules are applied."""

    n_ctx: int
    """KV cells (the requested context padded to 256)."""
    n_ctx_seq: int
    """The context of one slot (n_ctx when the KV cache is unified, else n_ctx / n_parallel)."""
    n_parallel: int
    kv_unified: bool
    n_gpu_layers: int
    """Layers on the GPUs, the output layer counted (n_layer + 1 = everything)."""
    flash_attn: bool
    n_ubatch: int
    n_batch: int
    type_k: str
    type_v: str
    devices: int
    splits: tuple[float, ...]
    kv_offload: bool
    output_first: bool = True
    """``-ngl`` counts the output layer first (builds from ggml-org/llama.cpp#18148)."""
    f16_mask: bool = True
    """With flash attention the KQ mask is an f16 input (builds from b9410); else an f32 input
    that a GPU copies and casts."""
    n_outputs: int | None = None
    """The logits' rows a graph is reserved for: None for every token of the micro-batch;
    llama-server from b9460 reserves ``n_parallel x (1 + n_draft)`` (``n_outputs_max``,
    tools/server/server-context.cpp:41-53)."""
    n_cpu_moe: int = 0
    """``--n-cpu-moe N``: the expert weights of the first N repeating layers stay in host
    memory (common/arg.cpp, ``LLM_FFN_EXPS_REGEX``; ``--cpu-moe``: every layer)."""
    op_offload: bool = True
    """``--no-op-offload`` off: the GPU runs the ops of host-resident weights for micro-batches
    of 32 tokens or more (``cparams.op_offload``, ggml-org/llama.cpp#13386)."""


@dataclass(frozen=True, slots=True)
class DeviceUse:
    """One GPU's buffers."""

    index: int
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    layers: tuple[int, ...]
    """Repeating layers on this GPU."""
    output: bool
    """Holds the output layer (norm + head, and the logits)."""

    @property
    def buffers_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes


@dataclass(frozen=True, slots=True)
class LlamaAccount:
    settings: LlamaSettings
    devices: tuple[DeviceUse, ...]
    host_weights_bytes: int
    """CPU model buffer: the input layer and every layer not offloaded (memory-mapped)."""
    host_kv_bytes: int
    host_compute_bytes: int
    output_buffer_bytes: int
    """Logits of n_parallel sequences in host memory (``output_reserve``)."""
    kv_bytes_per_cell: int
    """K+V bytes of one cell over the full-attention layers (sliding-window layers excluded)."""
    file_bytes: int
    """Tensor data of the GGUF file."""
    tensors: tuple[GGUFTensor, ...]
    layer_weights: tuple[int, ...]
    """Bytes of each layer index: the n_layer repeating layers, then the output layer (with a
    tied head's duplicate of the token embeddings)."""
    host_expert_layers: int = 0
    """GPU layers whose expert weights ``--n-cpu-moe`` keeps in host memory (a leading dense
    layer has none)."""


def _f32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def layer_devices(
    n_layer: int, n_gpu_layers: int, splits: tuple[float, ...], output_first: bool = True
) -> tuple[int, ...]:
    """The device of each layer index 0 .. n_layer (the last is the output layer): -1 for
    the CPU, else the GPU index (src/llama-model.cpp:1578-1612). Before
    ggml-org/llama.cpp#18148 (``output_first`` False) ``i_gpu_start`` was ``n_layer - ngl``:
    the output layer went to a GPU only with ``ngl > n_layer``."""
    n = len(splits)
    cum: list[float] = []
    total = 0.0
    for s in splits:
        total = _f32(total + s)
        cum.append(total)
    cum = [_f32(c / total) for c in cum]
    i_gpu_start = max(n_layer + (1 if output_first else 0) - n_gpu_layers, 0)
    act = min(n_gpu_layers, n_layer + 1) if n else 0
    out: list[int] = []
    for il in range(n_layer + 1):
        if il < i_gpu_start or (il - i_gpu_start) >= act:
            out.append(-1)
            continue
        x = _f32((il - i_gpu_start) / act)
        j = 0
        while j < n and cum[j] <= x:  # std::upper_bound
            j += 1
        out.append(min(j, n - 1))
    return tuple(out)


def _pad(x: int, to: int = 256) -> int:
    return (x + to - 1) // to * to


def kv_cells(arch: Arch, s: LlamaSettings) -> tuple[int, ...]:
    """Cells of each repeating layer's cache: n_ctx for full attention, the iSWA size for
    sliding-window layers (llama-kv-cache-iswa.cpp:73)."""
    out: list[int] = []
    for layer, count in arch.layer_runs:
        if layer.attention is AttentionKind.SLIDING and layer.window:
            swa = _pad(
                min(s.n_ctx, layer.window * (s.n_parallel if s.kv_unified else 1) + s.n_ubatch)
            )
            out.extend([swa] * count)
        else:
            out.extend([s.n_ctx] * count)
    return tuple(out)


def _kv_widths(arch: Arch) -> tuple[int, int]:
    """(n_embd_k_gqa, n_embd_v_gqa) per cell of one layer (MLA: the compressed latent and
    the rope part in K, the latent in V)."""
    if arch.mla is not None:
        m = arch.mla
        return m.kv_lora_rank + m.qk_rope_head_dim, m.kv_lora_rank
    w = arch.num_kv_heads * arch.head_dim
    return w, w


def kv_layer_bytes(arch: Arch, s: LlamaSettings, cells: int) -> int:
    k, v = _kv_widths(arch)
    return cells * (_kv_row(s.type_k, k, "k") + _kv_row(s.type_v, v, "v"))


def _kv_row(type_name: str, n: int, which: str) -> int:
    """One cell's K or V row: a quantized cache type stores whole blocks, which rows of ``n``
    elements must fill (llama.cpp cannot create the cache otherwise)."""
    block, _ = BLOCKS[type_name.upper()]
    if n % block:
        raise InvalidWorkload(
            f"gguf.cache_type_{which}",
            f"a {type_name} cache stores blocks of {block} elements; this model's "
            f"{which.upper()} rows have {n} (KV heads x head size): use f16",
        )
    return row_bytes(type_name, n)


def fa_f16_copies(arch: Arch, s: LlamaSettings, cells: int) -> int:
    """Flash attention's f16 copies of a layer's quantized K and V on a CUDA GPU, allocated
    with its output (ggml-cuda.cu:903-908, fattn.cu:722-756): of a quantized K, and of a
    quantized V unless V is a view of K (MLA); not per token."""
    k, v = _kv_widths(arch)
    quantized_v = s.type_v in _QUANTIZED_KV and arch.mla is None
    return cells * 2 * (k * (s.type_k in _QUANTIZED_KV) + v * quantized_v)


def _ff(arch: Arch) -> int:
    if arch.moe is not None:
        return arch.moe.expert_intermediate_size * arch.moe.experts_per_token
    return arch.intermediate_size


def device_buffer(name: str) -> bool:
    """Whether a buffer llama.cpp names in its log lies in device memory (``CUDA0``,
    ``Vulkan1``, ``MTL0_Mapped``), not the host's (``CPU``, ``CPU_Mapped``, ``CUDA_Host``,
    ``Vulkan_Host``, ``CPU_REPACK``)."""
    return not name.startswith("CPU") and not name.endswith("_Host")


def _tokens(s: LlamaSettings) -> int:
    """The tokens a graph is reserved for: ``min(n_ctx, n_ubatch)`` (graph_reserve)."""
    return min(s.n_ctx, s.n_ubatch)


def pipeline_parallel(s: LlamaSettings, n_layer: int) -> bool:
    """llama.cpp's pipeline parallelism (src/llama-context.cpp:429-458): more than one GPU,
    every layer and the output layer offloaded (``n_gpu_layers > n_layer``), the KV cache on
    the GPUs, split mode ``layer`` (the only one modelled), no tensor overrides (``--n-cpu-moe``
    and ``--fit``'s own placement of experts are overrides: src/llama-context.cpp:437
    ``!model.has_tensor_overrides()``); llama.cpp also needs devices with async compute and
    events (not modelled: they would only turn it off). Its scheduler then keeps
    ``GGML_SCHED_MAX_COPIES`` (4) copies of each split's inputs
    in the compute buffers (ggml/src/ggml-backend.cpp:771-773). When that allocation fails,
    llama.cpp retries without the pipeline (CTX:676-683); the estimate keeps the pipeline's
    buffers, the larger."""
    return s.devices > 1 and s.n_gpu_layers > n_layer and s.kv_offload and not s.n_cpu_moe


def compute_buffer(
    arch: Arch,
    s: LlamaSettings,
    layers: tuple[int, ...],
    output: bool,
    cells: tuple[int, ...],
    gpu: bool = True,
    pipeline: bool = True,
    first: bool = True,
) -> int:
    """One backend's compute buffer: ``T x`` the largest per-token term of the stages it runs,
    ``T = min(n_ctx, n_ubatch)`` (graph_reserve, src/llama-context.cpp:629-670: every token an
    output, or ``n_outputs`` rows of logits, llama-server from b9460):

    - logits (the output layer's backend): ``4 n_vocab + 8 n_embd + 4`` (``4 n_vocab x
      n_outputs`` bytes beside ``T x (8 n_embd + 4)`` where llama-server limits the outputs);
    - FFN with flash attention: ``2 n_kv + 16 n_embd + 12 n_ff + 28`` (the f16 mask);
    - attention without flash attention: ``n_kv (4 n_head + 4) + 20 n_embd + 8 n_embd_kv + 20``
      (the f32 scores and mask);
    - FFN without flash attention: ``4 n_kv + 16 n_embd + 12 n_ff + 28``;

    ``n_kv`` the cells one stream attends over. Fitted on 345 real llama.cpp loads on the CPU
    backend (bench/llamacpp_cpu.py, llama.cpp 0c1e570; bench/llamacpp_compare.py): exact for
    every f16-cache run with flash attention, within 4.1% without. A quantized cache with flash
    attention adds f16 copies of K and V whose reuse by the allocator follows no simple rule:
    measured 0.93 - 1.29 x the f16 buffer, so the budget takes ``QUANTIZED_KV_COMPUTE_FACTOR``
    (1.3) x.

    A GPU's graph keeps more alive than the CPU's when the model is split over several GPUs.
    Published llama.cpp buffer lines of Llama 3.1 70B split over two CUDA GPUs (Ollama 0.11 /
    0.13 logs, research/data/engine_logs.json; both at n_kv 4,096) give, per token: without
    flash attention ``4 n_head n_kv + 12 n_ff + 2 n_embd`` (688.02 MiB), with it ``12 n_ff +
    36 n_embd + 2 n_kv`` on a GPU without the output layer (316.04 MiB) and ``4 n_vocab + 24
    n_embd`` on the one with it (346.55 MiB); such a GPU's buffer is the larger of those and
    the CPU terms. Under the pipeline (``pipeline``: :func:`pipeline_parallel`) those
    flash-attention terms are what the CPU-backend terms (the single-GPU CUDA logs' ``4
    n_vocab + 4 n_embd`` for the logits) plus four copies of each split's inputs, the f32
    hidden state and the f16 mask (``16 n_embd + 8 n_kv``), come to at n_kv 4,096; beyond it
    the mask's copies grow with n_kv, so a pipeline GPU takes the larger of the measured term
    and that sum. Without flash attention the pipeline's copies are of the f32 mask (``16
    n_embd + 16 n_kv`` beside the CPU terms, bench/llamacpp_rpc.py). One GPU runs no pipeline:
    with flash attention it takes the CPU terms (every single-GPU log prints ``4 n_vocab + 4
    n_embd`` for the logits, 4 n_embd + 4 B per token below the CPU's); without it, and on
    several GPUs without the pipeline, it keeps the two-GPU terms (over by up to 16% on the one
    single-GPU log without flash attention that prints them, Ollama 0.5.11's).

    Builds before b9410 (``f16_mask`` False) with flash attention: the first GPU holds the f32
    mask copied from the host beside its f16 cast (``6 n_kv + 16 n_embd`` per token), the hole
    the freed copy leaves sits below the FFN's intermediates (``4 n_kv + 12 n_ff + 12 n_embd``)
    and below logits that do not fit in it (``4 n_vocab + 12 n_embd + 4 n_kv``); a pipeline's
    first GPU keeps four f32 copies (``16 n_kv``), the next ones four of the f16 cast
    (``first``). Measured on llama.cpp's own scheduler (bench/llamacpp_rpc.py); the b7780 and
    Ollama 0.21 / 0.22 logs at 32K - 128K cells print it to the 0.01 MiB. Where the scheduler
    puts the cast depends on the graph's order: b7896's and Ollama 0.13's logs show no copy on
    the GPU, and the estimate, taking the copy, reads 6 - 27% high there. A quantized cache
    with flash attention adds the kernel's f16 copies of the layer's K and V to the GPU's
    buffer (``kv_f16``, not per token). Host-resident weights: :func:`offloaded_ops`.

    On the host's backend (``gpu`` False: the CPU alone, or the host layers of a partial
    offload), builds before b9410 hold the f32 mask beside the FFN's intermediates (``2 n_kv``
    more) and beside its f16 cast at the attention (``6 n_kv + 20 n_embd + 20``); logits larger
    than that hole are placed past the mask (``+ 4 n_kv``; measured on the CPU alone). The FFN's
    ``12 n_ff`` throughout is :func:`_ffn_per_token` (with experts, ``+ 4 k n_embd``).

    ``--no-kv-offload`` (the cache in host memory): with flash attention the attention runs on
    the GPU all the same, the layer's K and V (and flash attention's f16 copies of a quantized
    cache) copied into this buffer, x ``NO_KV_OFFLOAD_SLACK`` beside the mask, ``8 n_embd`` and
    ``12 n_ff`` per token; without it the attention runs on the host
    (src/llama-graph.cpp:2752-2755) and a GPU keeps ``16 n_embd + 12 n_ff + 28`` per token for
    its layers. Measured on llama.cpp's own scheduler (bench/llamacpp_rpc.py).
    """
    t = _tokens(s)
    several = s.devices > 1
    pipeline = pipeline and several
    e = arch.hidden_size
    k, _ = _kv_widths(arch)
    ffn = _ffn_per_token(arch)
    per = 0
    factor = 1.0
    # the cells one stream attends over on this backend (0 for the output layer alone)
    n_kv = _attended(s, max((cells[i] for i in layers), default=0))
    # the pipeline's four copies of each split's inputs: the f32 hidden state and the mask
    # (f16 with flash attention from b9410, else f32; before b9410 the first GPU casts the f32
    # mask and the next GPUs are sent its f16 cast: bench/llamacpp_rpc.py)
    f32_mask = not s.flash_attn or (not s.f16_mask and first)
    copies = 16 * e + (16 if f32_mask else 8) * n_kv
    kv_f16 = 0  # flash attention's f16 copies of a quantized cache on a GPU (fa_f16_copies)
    host_attention = gpu and not s.kv_offload and not s.flash_attn
    if layers and host_attention:
        # --no-kv-offload without flash attention: the attention runs on the host
        # (src/llama-graph.cpp:2752-2755); the GPU keeps the projections and the FFN
        per = 16 * e + ffn + 28
    elif layers:
        if s.flash_attn:
            per = 2 * n_kv + 16 * e + ffn + 28
            if s.type_k in _QUANTIZED_KV or s.type_v in _QUANTIZED_KV:
                factor = QUANTIZED_KV_COMPUTE_FACTOR
        else:
            per = max(
                n_kv * (4 * arch.num_heads + 4) + 20 * e + 8 * k + 20,
                4 * n_kv + 16 * e + ffn + 28,
            )
            if s.type_k in _QUANTIZED_KV:
                factor = QUANTIZED_K_COMPUTE_FACTOR
        if not gpu and s.flash_attn and not s.f16_mask:
            # builds before b9410 on the CPU: the f32 mask beside the FFN's intermediates, and
            # beside its f16 cast at the attention (bench/llamacpp_rpc.py's build, CPU only)
            per = max(per + 2 * n_kv, 6 * n_kv + 20 * e + 20)
        if gpu:
            base = per  # the CPU backend's terms, before what only a GPU holds
            if s.flash_attn and not s.f16_mask and first:
                # builds before b9410: the f32 mask copied from the host beside its f16 cast
                # (6 n_kv + 16 n_embd per token at the attention), and the hole the copy leaves
                # below the FFN's intermediates (bench/llamacpp_rpc.py)
                per = max(per, 6 * n_kv + 16 * e, 4 * n_kv + ffn + 12 * e)
            if s.flash_attn:
                if several:
                    per = max(per, ffn + 36 * e + 2 * n_kv)
                kv_f16 = fa_f16_copies(arch, s, max(cells[i] for i in layers))
                if kv_f16:  # replaces the CPU backend's factor: the copies are the kernel's
                    factor = 1.0
            else:
                per = max(per, 4 * arch.num_heads * n_kv + ffn + 2 * e)
            if pipeline:
                per = max(per, base + copies)
    layer_bytes = math.ceil(t * per * factor) + kv_f16
    if layers and gpu and s.flash_attn and not s.kv_offload:
        # --no-kv-offload with flash attention: the scheduler runs the attention on the GPU and
        # copies the layer's whole K and V from the host cache into this buffer
        # (bench/llamacpp_rpc.py)
        n_cells = max(cells[i] for i in layers)
        mask = (6 if not s.f16_mask and first else 2) * n_kv
        copies_kv = kv_layer_bytes(arch, s, n_cells) + fa_f16_copies(arch, s, n_cells)
        layer_bytes = max(
            layer_bytes,
            math.ceil(copies_kv * NO_KV_OFFLOAD_SLACK) + t * (mask + 8 * e + ffn),
        )
    if not output:
        return layer_bytes
    # the logits: every token of the micro-batch, or the outputs llama-server reserves (b9460)
    rows = t if s.n_outputs is None else min(t, s.n_outputs)
    logits = 4 * arch.vocab_size * rows
    per = 8 * e + 4
    hole = gpu and first and layers and s.flash_attn and not s.f16_mask
    if not gpu and layers and s.flash_attn and not s.f16_mask and logits > t * (6 * n_kv + 20 * e):
        # before b9410 on the CPU: logits too large for the attention's freed f32 mask and its
        # cast may be placed past the mask (bench/llamacpp_rpc.py's build, CPU only)
        per += 4 * n_kv
    if hole and logits > 4 * n_kv * t:
        # the freed f32 mask copy (4 n_kv per token) is a hole the logits do not fit in:
        # they are placed past it (bench/llamacpp_rpc.py; the b7780 Qwen 2.5 7B log)
        per = max(per, 12 * e + 4 * n_kv)
    if gpu and several:
        per = max(per, 24 * e)
    if gpu and pipeline:  # the CUDA graph's logits (4 n_vocab + 4 n_embd) + the copies
        per = max(per, 4 * e + copies)
    return max(layer_bytes, math.ceil((logits + t * per) * factor))


NO_KV_OFFLOAD_SLACK = 1.06
"""``--no-kv-offload`` with flash attention: a GPU's buffer stayed within 1.06 x one layer's K
and V copied from the host (and flash attention's f16 copies of a quantized cache) beside the
mask, ``8 n_embd`` and the FFN's ``12 n_ff`` per token on llama.cpp's own allocator
(bench/llamacpp_rpc.py, 4K - 64K cells). Beside the mask alone the copies reached 1.5 x at 16K
cells: the allocator places them past the freed FFN intermediates, which the ``12 n_ff`` term
stands for."""

KV_COPY_SLACK = 1.6
"""A host layer's K and V copied to the GPU leave a hole that the next layer's copies do not
always fit in (the allocator places other tensors in it first): on llama.cpp's own allocator the
buffer reached 1.57 x one layer's K and V beside the mask (bench/llamacpp_rpc.py, 64K cells,
512-token micro-batch); 1.07 - 1.57 across the grid."""

PARTIAL_OFFLOAD_SLACK = 0.22
"""The most the first GPU's compute buffer exceeded :func:`offloaded_ops` under partial offload
on llama.cpp's own scheduler and allocator (bench/llamacpp_rpc.py: 21.7%, no layer on the GPU,
a 256-token micro-batch, where a layer's weight copy sat beside the head's)."""

OFFLOAD_MIN_BATCH = 32
"""The CUDA backend runs an op whose weight lies in host memory on the GPU when its batch is
at least this (``GGML_OP_OFFLOAD_MIN_BATCH``; ggml-cuda.cu:5636-5655, 5825)."""


_EXPERTS = re.compile(r"\.ffn_(up|down|gate|gate_up)_(ch|)exps")
"""The tensors ``--n-cpu-moe`` keeps in host memory (common/common.h ``LLM_FFN_EXPS_REGEX``)."""


def host_experts(
    s: LlamaSettings, tensors: tuple[GGUFTensor, ...], where: tuple[int, ...]
) -> tuple[GGUFTensor, ...]:
    """The expert weights of GPU layers that ``--n-cpu-moe`` keeps in host memory."""
    if not s.n_cpu_moe:
        return ()
    return tuple(
        t
        for t in tensors
        if 0 <= t.layer < s.n_cpu_moe and where[t.layer] >= 0 and _EXPERTS.search(t.name)
    )


def _ffn_per_token(arch: Arch) -> int:
    """The FFN's intermediates per token in a compute buffer: ``12 n_ff`` (the gate, the up
    projection and their product, f32); with experts (``n_ff`` the selected experts' width,
    ``k x n_ff_exp``) also the selected experts' outputs, ``4 k n_embd``
    (bench/llamacpp_rpc.py's MoE models: exact with every layer on one GPU)."""
    if arch.moe is None:
        return 12 * _ff(arch)
    return 12 * _ff(arch) + 4 * arch.moe.experts_per_token * arch.hidden_size


def _ffn_beside_weight(arch: Arch) -> int:
    """Bytes per token beside a copied FFN weight: ``8 n_ff + 8 n_embd`` for a dense FFN; for
    experts (``n_ff`` the selected experts' width, ``k x n_ff_exp``) the router's outputs and
    the selected experts' intermediates, ``8 n_ff + 4 k n_embd + 4 n_embd + 24``
    (bench/llamacpp_rpc.py, exact on both MoE shapes)."""
    e = arch.hidden_size
    if arch.moe is None:
        return 8 * _ff(arch) + 8 * e
    return 8 * _ff(arch) + 4 * arch.moe.experts_per_token * e + 4 * e + 24


def _cuda_bytes(t: GGUFTensor) -> int:
    """A weight's size in a CUDA buffer: quantized rows whose length is not a multiple of 512
    are padded by the rest of a 512-element row (ggml-cuda.cu:903-920)."""
    block, _ = BLOCKS[t.type.upper()]
    ne0 = t.shape[0]
    if block == 1 or ne0 % 512 == 0:
        return t.nbytes
    return t.nbytes + row_bytes(t.type, 512 - ne0 % 512)


def _attended(s: LlamaSettings, n_cells: int) -> int:
    """The cells one stream attends over: all of them in a unified cache, else one slot's."""
    return n_cells if s.kv_unified else min(n_cells, s.n_ctx_seq)


def cpu_moe_flag(n_cpu_moe: int, n_layer: int) -> str:
    """llama.cpp's flag for the experts of the first ``n_cpu_moe`` layers in host memory."""
    return "--cpu-moe" if n_cpu_moe >= n_layer else f"--n-cpu-moe {n_cpu_moe}"


def offloaded_ops(
    arch: Arch,
    s: LlamaSettings,
    tensors: tuple[GGUFTensor, ...],
    where: tuple[int, ...],
    cells: tuple[int, ...],
    output_bytes: int,
    experts: tuple[GGUFTensor, ...] = (),
) -> int:
    """What the first GPU's compute buffer holds for ops whose weights lie in host memory
    (host layers, and the ``--n-cpu-moe`` ``experts`` of GPU layers) that llama.cpp's
    scheduler runs there (``offload_op``: a micro-batch of ``OFFLOAD_MIN_BATCH`` tokens or
    more; ggml/src/ggml-backend.cpp ``ggml_backend_sched_backend_id_from_cur``): each such op's
    weight is copied into that buffer, one weight per split, and a host layer's attention,
    which follows its projections onto the GPU, copies that layer's whole K and V (the host KV
    cache) and the KQ mask. The largest of:

    - an expert tensor of a GPU layer (``--n-cpu-moe``): one whole copy beside the expert
      matmul's per-token terms (:func:`_ffn_beside_weight`) and the KQ mask (f16 ``2 n_kv``;
      before b9410 the f32 copy's hole, ``4 n_kv + 12 n_embd``: a published b5192 log of
      Qwen3-235B-A22B to the 0.01 MiB; ``4 n_kv`` without flash attention); a second copy
      when expert layers lie on a later GPU;
    - the output layer on the host: its weight, the logits and the normed input (``rows x 4
      (n_embd + n_vocab)``, ``rows`` the micro-batch or llama-server's outputs from b9460; with
      fewer than 32 rows the head's matmul stays on the host): what Ollama's own estimate adds
      for it (``embedding x vocab x 105/128`` for a Q6_K head, llm/ggml.go), and to the 0.01
      MiB what nine published logs print with the head on the host or no layer on the GPU
      (docs/ACCURACY.md);
    - the host layers' own per-token terms (:func:`compute_buffer` as if they lay on the GPU:
      their ops run there);
    - a host layer's attention: its K and V (x ``KV_COPY_SLACK``, the allocator's hole), the
      mask (f16 ``2 n_kv``; before b9410 the f32 copy and its cast, ``6 n_kv``; without flash
      attention the f32 scores of every head and the f32 mask; none under
      ``--no-kv-offload`` without flash attention, where it stays on the host) and ``8
      n_embd`` per token;
    - its largest weight beside an FFN matmul's input and output (:func:`_ffn_beside_weight`;
      a MoE layer's beside its K and V and the mask too; under ``--no-kv-offload`` without
      flash attention beside the host layers' own terms).

    Measured on llama.cpp's own scheduler and allocator with a CUDA-like device
    (bench/llamacpp_rpc.py, the buffers with weights in host memory): at most 21.7% above this
    (``unmodelled_compute`` warns). 0 when no weight is on the host or the micro-batch is
    below 32 tokens."""
    t = _tokens(s)
    n_layer = arch.num_layers
    if not s.devices or t < OFFLOAD_MIN_BATCH or not s.op_offload:
        return 0
    e = arch.hidden_size
    out = 0
    beside_weight = _ffn_beside_weight(arch)
    n_kv_all = _attended(s, max(cells, default=0))
    if s.flash_attn and s.f16_mask:
        expert_mask = 2 * n_kv_all
    elif s.flash_attn:
        expert_mask = 4 * n_kv_all + 12 * e
    else:
        expert_mask = 4 * n_kv_all
    if experts:
        # only the selected experts' rows are sent, but the copy is reserved whole
        # (ggml/src/ggml-backend.cpp ggml_backend_sched_compute_splits)
        expert_weight = max(_cuda_bytes(x) for x in experts)
        out = expert_weight + t * (beside_weight + expert_mask)
        if any(where[x.layer] > 0 for x in experts):
            n_expert = arch.moe.num_experts if arch.moe is not None else 0
            out = max(out, 2 * expert_weight + t * (4 * e + 8 * n_expert))
    rows = t if s.n_outputs is None else min(t, s.n_outputs)
    if where[n_layer] < 0 and rows >= OFFLOAD_MIN_BATCH:
        # the head's matmul over fewer rows (llama-server's slots, b9460 on) stays on the host
        out = max(out, 4 * rows * (e + arch.vocab_size) + output_bytes)
    host = tuple(i for i in range(n_layer) if where[i] < 0)
    if not host:
        return out
    # the host layers' ops run on this GPU: their per-token terms, as if they lay there
    ops = compute_buffer(arch, s, host, False, cells, pipeline=False)
    out = max(out, ops)
    widest = max(host, key=lambda i: cells[i])
    n_kv = _attended(s, cells[widest])
    kv = kv_layer_bytes(arch, s, cells[widest])
    if s.flash_attn:
        attention: int | None = (2 if s.f16_mask else 6) * n_kv
        copied = kv + fa_f16_copies(arch, s, cells[widest])
    else:  # the scores and the f32 mask; with --no-kv-offload this attention stays on the host
        attention = n_kv * (4 * arch.num_heads + 4) if s.kv_offload else None
        copied = kv
    if attention is not None:
        out = max(out, math.ceil(copied * KV_COPY_SLACK) + t * (attention + 8 * e))
    on_host = set(host)
    host_weight = max((_cuda_bytes(w) for w in tensors if w.layer in on_host), default=0)
    out = max(out, host_weight + t * beside_weight)
    if arch.moe is not None:
        # a host MoE layer: its expert weight's copy beside the layer's K and V copies and the
        # mask (bench/llamacpp_rpc.py, half the layers on the GPU)
        out = max(out, host_weight + kv + t * (beside_weight + expert_mask))
    if not s.kv_offload and not s.flash_attn:
        # the host layer's FFN on this GPU, its intermediates beside its copied weight
        out = max(out, host_weight + ops)
    return out


@lru_cache(maxsize=1024)
def llama_account(
    arch: Arch,
    file_type: str,
    s: LlamaSettings,
    given: tuple[GGUFTensorSpec, ...] | None = None,
) -> LlamaAccount:
    """The buffers of the file type's recipe, or of the file's own tensors (``given``)."""
    tensors = (
        gguf_tensors(arch, file_type) if given is None else file_tensors(given, arch.num_layers)
    )
    n_layer = arch.num_layers
    where = layer_devices(n_layer, s.n_gpu_layers if s.devices else 0, s.splits, s.output_first)
    # bytes of each layer index 0 .. n_layer (the output layer last; a tied head loads a
    # duplicate of the token embeddings there: TENSOR_DUPLICATED)
    per_layer = [0] * (n_layer + 1)
    host_weights = 0
    for t in tensors:
        if t.layer == INPUT:
            host_weights += t.nbytes
        else:
            per_layer[t.layer] += t.nbytes
    if not any(t.name == "output.weight" for t in tensors):
        per_layer[n_layer] += next((t.nbytes for t in tensors if t.name == "token_embd.weight"), 0)
    weights = [0] * s.devices
    for il, b in enumerate(per_layer):
        if where[il] < 0:
            host_weights += b
        else:
            weights[where[il]] += b
    moved = host_experts(s, tensors, where)  # --n-cpu-moe
    for t in moved:
        weights[where[t.layer]] -= t.nbytes
        host_weights += t.nbytes
    cells = kv_cells(arch, s)
    kv = [0] * s.devices
    host_kv = 0
    for i in range(n_layer):
        b = kv_layer_bytes(arch, s, cells[i])
        if where[i] >= 0 and s.kv_offload:
            kv[where[i]] += b
        else:
            host_kv += b
    devices = []
    pipeline = pipeline_parallel(s, n_layer)
    head = [t for t in tensors if t.layer == n_layer and t.name == "output.weight"]
    if not head:  # a tied head: the duplicate of the token embeddings
        head = [t for t in tensors if t.name == "token_embd.weight"]
    copies = offloaded_ops(arch, s, tensors, where, cells, sum(_cuda_bytes(t) for t in head), moved)
    for d in range(s.devices):
        layers = tuple(i for i in range(n_layer) if where[i] == d)
        out = where[n_layer] == d
        # the GPU that runs the first offloaded layer casts the mask
        layers_before = any(0 <= where[i] < d for i in range(n_layer))
        compute = (
            compute_buffer(arch, s, layers, out, cells, pipeline=pipeline, first=not layers_before)
            if layers or out
            else 0
        )
        if d == 0:  # the scheduler offloads to the first GPU that takes the op
            compute = max(compute, copies)
        devices.append(
            DeviceUse(
                index=d,
                weights_bytes=weights[d],
                kv_bytes=kv[d],
                compute_bytes=compute,
                layers=layers,
                output=out,
            )
        )
    cpu_layers = tuple(i for i in range(n_layer) if where[i] < 0)
    host_compute = compute_buffer(arch, s, cpu_layers, where[n_layer] < 0, cells, gpu=False)
    if not cpu_layers and where[n_layer] >= 0:
        # the input layer's get_rows and the graph inputs (CUDA_Host compute buffer): without
        # the pipeline llama.cpp logs print T x (4 n_embd + 4 n_kv) (Llama 3.1 70B: 24.01 MiB
        # at 4,096 cells and 32.01 at 8,192; Llama 3.2 1B 12.01; Pythia 2.8B 9.01; gpt-oss-20b
        # 71.15 and 135.15 at 32K and 64K, 1.5 MiB above it); the two two-GPU pipelines of
        # Llama 3.1 70B at 4,096 cells print 48.05 (flash attention) and 64.04 MiB (without):
        # the larger of twice the one-GPU figure and 16 n_embd x T (64 MiB for both)
        e = arch.hidden_size
        one = 4 * e + 4 * max(cells, default=0)
        host_compute = _tokens(s) * (max(2 * one, 16 * e) if pipeline else one)
    if (_tokens(s) < OFFLOAD_MIN_BATCH or not s.op_offload) and moved:
        # --n-cpu-moe below 32 tokens or with --no-op-offload: the host runs the expert
        # matmuls itself, beside the
        # inputs the GPUs' splits hand it (4 n_kv + 8 n_embd per token covers the emulation's
        # 16-token loads, up to 16% above the expert term alone)
        n_kv = _attended(s, max(cells, default=0))
        host_compute += _tokens(s) * (_ffn_beside_weight(arch) + 4 * n_kv + 8 * arch.hidden_size)
    gpu_layers = tuple(i for i in range(n_layer) if where[i] >= 0)
    if not s.kv_offload and gpu_layers:
        # --no-kv-offload: the host stores every layer's new K and V rows (the mask and 8
        # n_embd per token beside them, bench/llamacpp_rpc.py); without flash attention the GPU
        # layers' attention runs there too (src/llama-graph.cpp:2752-2755), its f32 scores
        # in the host's compute buffer
        e = arch.hidden_size
        n_kv = _attended(s, max(cells[i] for i in gpu_layers))
        # the f16 mask from b9410, else f32; a quantized cache's row store takes up to 184 B
        # per token more (bench/llamacpp_rpc.py), which the f32 mask's 4 n_kv covers
        quantized = s.type_k in _QUANTIZED_KV or s.type_v in _QUANTIZED_KV
        mask = 2 if s.flash_attn and s.f16_mask and not quantized else 4
        host_compute = max(host_compute, _tokens(s) * (mask * n_kv + 8 * e + 20))
        if not s.flash_attn:
            host_compute = max(
                host_compute, compute_buffer(arch, s, gpu_layers, False, cells, gpu=False)
            )
    per_cell = sum(
        kv_layer_bytes(arch, s, 1)
        for layer, count in arch.layer_runs
        for _ in range(count)
        if layer.attention is not AttentionKind.SLIDING
    )
    return LlamaAccount(
        settings=s,
        devices=tuple(devices),
        host_weights_bytes=host_weights,
        host_kv_bytes=host_kv,
        host_compute_bytes=host_compute,
        output_buffer_bytes=arch.vocab_size * 4 * s.n_parallel,
        kv_bytes_per_cell=per_cell,
        file_bytes=sum(t.nbytes for t in tensors),
        tensors=tensors,
        layer_weights=tuple(per_layer),
        host_expert_layers=len({t.layer for t in moved}),
    )


def unmodelled_compute(arch: Arch, a: LlamaAccount) -> tuple[str, ...]:
    """What the first GPU's compute buffer may hold beyond :func:`offloaded_ops` under partial
    offload, as a warning with the bytes for this layout (MiB): on the newest allocator two
    copied weights sometimes sit side by side (bench/llamacpp_rpc.py: up to
    ``PARTIAL_OFFLOAD_SLACK`` above the estimate), where the nine published logs of older builds
    print exactly the estimate (docs/ACCURACY.md, held-out sets H and I)."""
    s = a.settings
    n_layer = arch.num_layers
    on_gpu = {i for d in a.devices for i in d.layers}
    if any(d.output for d in a.devices):
        on_gpu.add(n_layer)
    if (
        not a.devices
        or len(on_gpu) == n_layer + 1
        or _tokens(s) < OFFLOAD_MIN_BATCH
        or not s.op_offload
    ):
        return ()
    more = a.devices[0].compute_bytes * PARTIAL_OFFLOAD_SLACK / MiB
    return (
        f"partial offload: llama.cpp runs a micro-batch's matmuls of host-resident weights on "
        f"the first GPU, copying each weight into its compute buffer (offload_op); the "
        f"estimate counts them, and llama.cpp's newest allocator measured up to "
        f"{PARTIAL_OFFLOAD_SLACK:.0%} more, about {more:,.0f} MiB here (docs/ACCURACY.md)",
    )


def split_fractions(devices: int, tensor_split: tuple[float, ...] | None) -> tuple[float, ...]:
    """``--tensor-split`` (all zero or absent: equal GPUs split evenly)."""
    if tensor_split is None or not any(tensor_split):
        return (1.0,) * devices
    return tuple(float(x) for x in tensor_split)
