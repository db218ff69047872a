"""The quantities vLLM subtracts from ``requested``, one function each with its formula: the
requested memory, the profile run's activation peak, the non-torch increase, the baseline
before the snapshot (CUDA context, NCCL) and the CUDA graphs."""

from __future__ import annotations

import math

from ..arch import Arch
from ..formulas.activations import inference_working_set
from ..statics import StageStatic
from ..units import ceil_div
from .calibration import CALIBRATED_VERSION
from .engine_args import PCIE_DISTRIBUTED_BYTES, Resolved, pcie_cost

__all__ = [
    "AWQ_FP16_MATMUL_TOKENS",
    "activation_peak_bytes",
    "awq_dequant_bytes",
    "baseline_bytes",
    "cuda_graph_bytes",
    "graph_bytes",
    "non_torch_bytes",
    "requested_bytes",
    "sort_sampler_bytes_per_logit",
]

# ------------------------------------------------------------------------- the quantities --


def requested_bytes(total: int, utilization: float, ceil: bool = True) -> int:
    """``requested_memory = ceil(total x gpu_memory_utilization)`` (vllm/v1/worker/utils.py
    ``request_memory``, 0.14 on; before, the float product, whose fraction of a byte the
    blocks' floor division drops), with the fraction taken to a millionth. H100 80GB HBM3
    (85,030,… B, 79.19 GiB) x 0.95 = 75.23 GiB."""
    ppm = round(utilization * 1_000_000)
    return ceil_div(total * ppm, 1_000_000) if ceil else total * ppm // 1_000_000


def _moe_workspace(arch: Arch, st: StageStatic, tokens: int, e: int) -> int:
    """Fused-MoE workspaces of one layer as the modular kernel's Triton experts ask the
    worker's workspace manager for them from 0.14 (held, so live while the profile run's
    hidden states are sampled: ``moe_workspace_persistent``): ``workspace1`` of ``M x top_k x
    max(f', h)`` (the activation's output width, half of the fused gate/up ``N = 2 f'``) and
    ``workspace2`` of ``M x top_k x max(2 f', h)``, in the model dtype (0.28.0
    ``fused_moe/experts/triton_moe.py`` ``workspace_shapes`` lines 213-216; 0.14.0 and 0.20.0
    ``fused_moe.py`` the same); the output ``M x h`` reuses ``workspace1``. Qwen3-30B-A3B, M
    8,192: 8,192 x 8 x (2,048 + 2,048) x 2 = 536,870,912 B."""
    if arch.moe is None or not any(layer.moe for layer, _ in st.layer_kinds):
        return 0
    f, h = st.dims.f_expert, arch.hidden_size
    return tokens * arch.moe.experts_per_token * (max(f, h) + max(2 * f, h)) * e


AWQ_FP16_MATMUL_TOKENS = 256
"""vllm/model_executor/layers/quantization/awq.py ``AWQLinearMethod.apply``:
``FP16_MATMUL_HEURISTIC_CONDITION = x.shape[:-1].numel() >= 256`` -- from 256 tokens the
kernel dequantizes the whole weight (``ops.awq_dequantize``) and multiplies in 16 bits."""


def awq_dequant_bytes(st: StageStatic, e: int) -> int:
    """The largest weight vLLM's plain AWQ kernel dequantizes at once, in the model dtype: its
    merged projections per GPU (``QKVParallelLinear``, ``MergedColumnParallelLinear``), live
    with the matmul's output. Qwen2.5-14B at TP1: gate_up 5,120 x 27,648 x 2 B = 283,115,520 B."""
    d = st.dims
    qkv = d.h * (d.heads * d.qk_head_dim + d.kv_heads * (d.qk_head_dim + d.v_head_dim))
    o = d.heads * d.v_head_dim * d.h
    return max(qkv, o, 2 * d.f * d.h, d.f * d.h) * e


SORT_BYTES_PER_LOGIT_MANY = 36
SORT_BYTES_PER_LOGIT_FEW = 44


def sort_sampler_bytes_per_logit(rows: int, e: int) -> int:
    """Bytes per (row x vocabulary) element at the peak of the dummy sampler run when it sorts
    (``apply_top_k_top_p``: ``logits.sort(dim=-1)`` on the float32 logits), counted from the
    source: the caller's logits in the model dtype (``e``), their float32 copy (4,
    ``Sampler.forward``), the sorted values and indices (4 + 8), and what torch's CUDA stable
    sort allocates beside them (``aten/src/ATen/native/cuda/SortStable.cu``): from 128 rows
    ``segmented_sort_pairs`` -- reverse indices (8) and CUB's alternate key and value buffers
    (4 + 8) -- and below that ``segmented_sort_pairs_by_full_sort`` -- two ``int2`` index-and-
    segment arrays (8 + 8) and the alternate buffers (4 + 8)."""
    return e + (SORT_BYTES_PER_LOGIT_FEW if 2 <= rows < 128 else SORT_BYTES_PER_LOGIT_MANY)


def activation_peak_bytes(
    arch: Arch, st: StageStatic, r: Resolved, sort: bool | None = None
) -> int:
    """The torch peak increase of ``profile_run``: a dummy forward of ``T =
    max_num_batched_tokens`` tokens spread over ``S = min(max_num_seqs, T)`` requests, then (last
    stage) a dummy sampler run over ``S`` rows of the full vocabulary.

    forward = fwd_scale x working set of the largest layer
    (``formulas.activations.inference_working_set``:
              residual 4 T h e + max(attention, MLP))
              + pp_hidden x T x h x e on stages before the last (the intermediate tensors sent
              on: hidden states and residual)
    sampler = per_logit x S x V + sampler_hidden x T x h x e + MoE workspace
    peak    = max(forward, sampler) on the last stage, forward elsewhere

    per_logit is ``sampler_bytes_per_logit`` (fitted on 0.19.0, whose Triton top-k/top-p
    kernel sorts nothing) or, where the release sorts (``sort``; default
    ``Resolved.sampler_sort``), :func:`sort_sampler_bytes_per_logit`: 38 B for bf16 from 128 rows.

    Llama 3.1 8B, T 8,192, S 1,024 (H100 defaults): sampler 15.2 x 1,024 x 128,256 + 2 x 8,192 x
    4,096 x 2 = 2.13 GB > forward 0.97 GB; vLLM 0.19.0 logs 1.89 GiB.
    """
    c = r.cal.c
    T = r.max_num_batched_tokens
    S = min(r.max_num_seqs, T)
    q = ceil_div(T, S)
    # vLLM's fused MoE sizes its buffers by the rows it is handed, whatever the expert map (an
    # expert-parallel rank computes every row, masked: TritonExperts.workspace_shapes reads M
    # and top_k only), and data-parallel replicas hand it every replica's rows (the all-gather
    # below): a MoE sublayer takes the layer's S x q rows times data, not divided by the
    # expert ranks
    ws = max(
        inference_working_set(
            layer,
            arch,
            st.dims,
            S,
            q,
            q,
            r.e,
            "flash",
            moe_rows=S * q * r.data if layer.moe else None,
        )
        for layer, _ in st.layer_kinds
    )
    forward = math.ceil(c("forward_working_set_scale") * ws)
    if r.plain_awq and T >= AWQ_FP16_MATMUL_TOKENS and arch.moe is None:
        forward += awq_dequant_bytes(st, r.e)
    if not st.stage.last:
        return forward + math.ceil(c("pp_hidden_copies") * T * arch.hidden_size * r.e)
    if sort is None:
        sort = r.sampler_sort
    per_logit = sort_sampler_bytes_per_logit(S, r.e) if sort else c("sampler_bytes_per_logit")
    sampler = math.ceil(
        per_logit * S * arch.vocab_size + c("sampler_hidden_copies") * T * arch.hidden_size * r.e
    )
    if r.cal.moe_workspace_persistent:  # still allocated when the sampler runs
        # data-parallel replicas all-gather their tokens before the experts (0.28.0
        # fused_moe/all2all_utils.py: lines 140-149 without expert parallelism, the
        # allgather_reducescatter manager with it; the profile run of every replica has T):
        # the workspaces take T x data rows, unchunked in 0.20.0 and 0.28.0 (modular_kernel.py
        # passes M_full as the chunk); 0.14.0 chunks them at VLLM_FUSED_MOE_CHUNK_SIZE, 16,384
        # rows, which is not modelled (counted unchunked: the larger)
        rows = T * r.data
        sampler += math.ceil(c("moe_workspace_scale") * _moe_workspace(arch, st, rows, r.e))
    # (before 0.14 the caches are freed with the layer: the forward's working set has them)
    return max(forward, sampler)


def non_torch_bytes(r: Resolved) -> tuple[int, int]:
    """(non-torch increase during profiling, the part of it due to communication): cuBLAS and
    attention workspaces on one GPU; with tensor parallelism, the all-reduce buffers -- which
    depend on the fabric (:func:`~.engine_args.tp_fabric`):

    - ``nvlink`` (NVSwitch, NVLink, xGMI, unknown GPUs): custom all-reduce with its IPC
      buffers, symmetric memory on Hopper / Blackwell, NCCL over NVLink. Fitted per layout class
      on the calibrated release's H100 launches; any other release takes the larger of that and
      the most any calibrate launch of that release family showed (``non_torch_tp*_transfer``:
      the cost moved by tens of percent between releases, and over-counting it only costs KV
      tokens).
    - ``pcie``: custom all-reduce off beyond two GPUs and no symmetric memory
      (``tp_comm_pcie_bytes``, fitted on PCIe launches of several releases).
    - ``no_p2p`` (no peer access: across nodes, or P2P disabled by the host): custom all-reduce
      and symmetric memory off, NCCL through host memory; ``tp_comm_pcie_bytes`` as for PCIe
      (whose launches include custom all-reduce's buffers: an upper bound here).

    Less with pipeline parallelism only (buffers already made before the snapshot)."""
    c = r.cal.c
    base = round(c("non_torch_tp1_bytes"))
    calibrated = r.cal.version == CALIBRATED_VERSION
    if r.tensor >= 2 and pcie_cost(r.fabric):
        value = base + round(c("tp_comm_pcie_bytes"))
    elif r.tensor >= 4:
        value = round(c("non_torch_tp4_bytes" if calibrated else "non_torch_tp4_transfer_bytes"))
    elif r.tensor >= 2:
        value = round(c("non_torch_tp2_bytes" if calibrated else "non_torch_tp2_transfer_bytes"))
    elif r.pipeline > 1:
        value = round(c("non_torch_pp_bytes"))
    else:
        value = base
    return value, max(value - base, 0)


def baseline_bytes(r: Resolved) -> tuple[int, int]:
    """(CUDA context, NCCL communicators) that exist before the engine's memory snapshot.
    The communicators take ``nccl_init_bytes`` (fitted on NVSwitch H100s); without peer access
    (``no_p2p``) at most what a PCIe start took (:data:`~.engine_args.PCIE_DISTRIBUTED_BYTES`)."""
    c = r.cal.c
    if r.tensor <= 1 and r.pipeline <= 1:
        nccl = 0
    elif r.fabric == "no_p2p" and r.tensor >= 2:  # peer access describes the TP group
        nccl = PCIE_DISTRIBUTED_BYTES
    else:
        nccl = round(c("nccl_init_bytes"))
    return round(c("cuda_context_bytes")), nccl


def cuda_graph_bytes(st: StageStatic, r: Resolved, eager: bool) -> int:
    """Memory of the captured CUDA graphs: ``(a + b x layers on the stage) x graphs``, with
    ``graphs`` the release's capture sizes for the request's ``max_num_seqs`` and
    ``max_num_batched_tokens`` (:func:`~.engine_args.cudagraph_sizes`; 102 at the defaults
    of 0.12 on) and ``a``, ``b`` fitted per graph; 0 with ``enforce_eager``. vLLM's own
    estimate is linear in the graph count too (``profile_cudagraph_memory``: the first
    capture plus the second's memory for each further graph, gpu_model_runner.py:6576 in
    0.26.0)."""
    return graph_bytes(st.stage.num_layers, r, eager)


def graph_bytes(layers: int, r: Resolved, eager: bool) -> int:
    """``(a + b x layers) x graphs``: the captured graphs of a model of ``layers`` layers (the
    stage's, or a speculative drafter's, which is captured at every size the target is); 0
    with ``enforce_eager`` or no layers. A driver before R550 takes ``r.graph_factor`` times
    that (:mod:`~.driver`)."""
    if eager or layers == 0:
        return 0
    c = r.cal.c
    per_graph = c("cuda_graph_base_bytes_per_graph") + c("cuda_graph_per_layer_bytes_per_graph") * (
        layers
    )
    fitted = max(round(per_graph * r.cuda_graphs), 0)
    return fitted if r.graph_factor == 1.0 else round(fitted * r.graph_factor)
