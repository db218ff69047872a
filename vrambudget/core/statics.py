"""Per-stage facts of a model workload that do not depend on batch or context: what each device
of a pipeline stage holds (weights, quantization metadata, adapters, gradients, optimizer state,
master weights, communication buffers) and the per-token KV width. Computed once per distinct
(model, precision, layout, training method) and cached, so solving for the largest batch only
re-evaluates the few terms that scale.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

from .activations import DeviceDims, device_dims
from .arch import Arch, LayerType, Role, Split, TensorGroup
from .dtypes import bytes_of
from .layout import Stage, check_layout, kv_heads_per_device, per_device_shape, stages
from .overheads import (
    KMIN_BLOCK_BYTES,
    NCCL_GROUP_BYTES,
    NCCL_PAIR_BYTES,
    ZERO_PREFETCH_BUCKET_ELEMENTS,
    ZERO_REDUCE_BUCKET_ELEMENTS,
)
from .quantization import quantized_roles, tensor_storage
from .spec import (
    FP8,
    SGD,
    Adafactor,
    AdamW,
    AdamW8bit,
    LoRA,
    Parallelism,
    Precision,
    QLoRA,
    Quantization,
    TrainingWorkload,
)
from .units import ceil_div, round_up

__all__ = ["StageStatic", "TrainingPlan", "stage_statics", "training_plan"]

# bitsandbytes optim/optimizer.py: Optimizer8bit keeps 32-bit states for tensors with fewer than
# min_8bit_size = 4096 elements; 8-bit states are blockwise with blocksize 256 (absmax fp32).
BNB_MIN_8BIT_SIZE = 4096
BNB_OPTIM_BLOCKSIZE = 256


@dataclass(frozen=True, slots=True)
class TrainingPlan:
    """The hashable part of a training workload that fixes its persistent memory."""

    method: str  # full | lora | qlora
    lora_rank: int
    lora_targets: tuple[str, ...]
    adapter_bytes: int
    optimizer: AdamW | AdamW8bit | SGD | Adafactor
    mixed_precision: str


def training_plan(w: TrainingWorkload) -> TrainingPlan:
    m = w.method
    if isinstance(m, LoRA):  # QLoRA is a LoRA
        return TrainingPlan("qlora" if isinstance(m, QLoRA) else "lora", m.rank,
                            tuple(m.target_modules), bytes_of(m.adapter_dtype), w.optimizer,
                            w.mixed_precision)
    return TrainingPlan("full", 0, (), 0, w.optimizer, w.mixed_precision)


@dataclass(frozen=True, slots=True)
class StageStatic:
    stage: Stage
    dims: DeviceDims
    layer_kinds: tuple[tuple[LayerType, int], ...]
    num_params: int
    weights_bytes: int
    metadata_bytes: int
    weights_rounding_bytes: int
    adapter_params: int
    adapter_bytes: int
    trainable_params: int
    gradient_bytes: int
    optimizer_bytes: int
    master_bytes: int
    host_optimizer_bytes: int
    host_master_bytes: int
    host_param_bytes: int
    comm_bytes: int
    comm_parts: tuple[tuple[str, int], ...]
    largest_layer_params: int
    largest_linear_params: int
    kv_full_elems: int
    """K+V elements per token per sequence over this stage's full-attention layers."""
    kv_sliding: tuple[tuple[int, int], ...]
    """(window, elements per token) over its sliding-window layers."""
    step_gradient_bytes: int = 0
    """Gradients during the optimizer step: fp32 when the step runs on fp32 masters."""
    step_upcast_bytes: int = 0
    """The low-precision gradient of the largest tensor, live while its fp32 copy is made."""
    step_temporary_bytes: int = 0
    """The optimizer implementation's temporaries at its peak (foreach: a state-sized tensor
    per parameter; for-loop: two of the largest; fused: none)."""


def _last_trainable(arch: Arch, stage: Stage, plan: TrainingPlan, t: int, ep: int) -> int:
    """Elements of the last trainable tensor in module order (embeddings, layers, head,
    extras): gradients are upcast to the fp32 masters in that order, each low-precision one
    freed after its copy, so the peak is all fp32 gradients plus the last low-precision one."""
    if plan.method == "full":
        if stage.first and arch.extras:
            g = arch.extras[-1]
        elif stage.last:
            g = arch.head[-1]
        else:
            g = stage.layer_runs[-1][0].tensors[-1]
        rows, cols, count = per_device_shape(g, arch, t, ep)
        stacked = g.role is Role.EXPERT or (count > 1 and g.role is not Role.NORM)
        return rows * cols * (count if stacked else 1)
    layer = stage.layer_runs[-1][0]
    targeted = [g for g in layer.tensors if g.name.rsplit(".", 1)[-1] in plan.lora_targets
                and g.role in (Role.LINEAR, Role.EXPERT)]
    if not targeted:
        return 0
    g = targeted[-1]
    rows, _, count = per_device_shape(g, arch, t, ep)
    return rows * plan.lora_rank * (count if g.role is Role.EXPERT else 1)


def _step_temporaries(opt: AdamW | AdamW8bit | SGD | Adafactor, trainable: int,
                      largest: int, state_bytes: int) -> int:
    """torch/optim/adamw.py: ``_multi_tensor_adamw`` allocates ``exp_avg_sq_sqrt =
    torch._foreach_sqrt(exp_avg_sqs)`` for every parameter at once; ``_single_tensor_adamw``
    ``exp_avg_sq.sqrt()`` and its quotient for one tensor at a time; the fused kernel none.
    SGD (momentum buffers updated in place) and bitsandbytes' 8-bit kernels have none; a trace
    checks each (tests/test_trace_oracle.py)."""
    match opt:
        case AdamW(implementation="foreach"):
            return trainable * state_bytes
        case AdamW(implementation="for_loop"):
            return 2 * largest * state_bytes
        case _:  # Adafactor: not traced (torch.optim.Adafactor reads tensor values)
            return 0


def _groups(arch: Arch, stage: Stage, p: int) -> Iterator[tuple[TensorGroup, int]]:
    for layer, n in stage.layer_runs:
        for g in layer.tensors:
            yield g, n
    if stage.first:
        for g in (*arch.embeddings, *arch.extras):
            yield g, 1
    if stage.last:
        for g in head_groups(arch, p):
            yield g, 1


def head_groups(arch: Arch, p: int) -> tuple[TensorGroup, ...]:
    """The last stage's head: the final norm and LM head, and with ``p`` > 1 stages a copy of a
    tied head (a tied head on another stage than the embedding needs its own copy: vLLM
    ParallelLMHead on the last rank, Megatron's output layer with shared weights)."""
    if p > 1 and arch.tie_word_embeddings and arch.kind == "decoder":
        emb = arch.embeddings[0]
        return (*arch.head, TensorGroup("lm_head (tied copy)", emb.rows, emb.cols,
                                        Role.LM_HEAD, Split.VOCAB))
    return arch.head


def _kv_elems(arch: Arch, layer: LayerType, t: int) -> int:
    if arch.mla is not None:
        # MLA caches the compressed latent and the decoupled RoPE key, shared by all heads and
        # replicated on every tensor-parallel rank (DeepSeek-V2 §2.1.2; vLLM MLA backend).
        return arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim
    return 2 * kv_heads_per_device(arch, t) * arch.head_dim


def _optimizer_bytes(opt: AdamW | AdamW8bit | SGD | Adafactor, shapes: list[tuple[int, int, int]],
                     state_bytes: int) -> int:
    total = 0
    for rows, cols, count in shapes:
        numel = rows * cols
        match opt:
            case AdamW():
                per = 2 * numel * state_bytes
            case SGD():
                per = numel * state_bytes if opt.momentum > 0 else 0
            case AdamW8bit():
                if numel < BNB_MIN_8BIT_SIZE:
                    per = 2 * numel * 4
                else:
                    per = 2 * numel + 2 * ceil_div(numel, BNB_OPTIM_BLOCKSIZE) * 4
            case Adafactor():
                # transformers Adafactor: exp_avg_sq_row (rows) + exp_avg_sq_col (cols) for
                # matrices, exp_avg_sq for vectors; exp_avg only with beta1.
                per = (rows + cols) * state_bytes if rows > 1 and cols > 1 else (
                    numel * state_bytes)
                if opt.beta1 is not None:
                    per += numel * state_bytes
        total += per * count
    return total


def _device_params(layer: LayerType, arch: Arch, t: int, ep: int) -> int:
    total = 0
    for g in layer.tensors:
        rows, cols, count = per_device_shape(g, arch, t, ep)
        total += rows * cols * count
    return total


def _nccl(ranks: int) -> int:
    return 0 if ranks <= 1 else (NCCL_PAIR_BYTES if ranks == 2 else NCCL_GROUP_BYTES)


@lru_cache(maxsize=4096)
def stage_statics(arch: Arch, precision: Precision, par: Parallelism, plan: TrainingPlan | None,
                  ) -> tuple[StageStatic, ...]:
    check_layout(arch, par)
    t, ep, dp = par.tensor, par.expert, par.data
    dims = device_dims(arch, t, ep)
    quant: Quantization | None = precision.quantization
    plain_dtype = precision.weights
    if plain_dtype == "fp8":
        quant, plain_dtype = FP8(), precision.compute
    plain_bytes = bytes_of(plain_dtype)
    roles = quantized_roles(quant) if quant is not None else frozenset()
    training = plan is not None
    zero = par.zero_stage if training else 0
    result = []
    for stage in stages(arch, par.pipeline):
        weights = meta = rounding = params = 0
        trainable_shapes: list[tuple[int, int, int]] = []
        adapter_params = 0
        largest_linear = 0
        largest_trainable = 0
        for g, mult in _groups(arch, stage, par.pipeline):
            rows, cols, count = per_device_shape(g, arch, t, ep)
            n = count * mult
            params += rows * cols * n
            if quant is not None and g.role in roles:
                payload, md = tensor_storage(quant, rows, cols, 1)
            else:
                payload, md = rows * cols * plain_bytes, 0
            weights += payload * n
            meta += md * n
            rounding += (round_up(payload, KMIN_BLOCK_BYTES) - payload) * n
            if md:
                rounding += (round_up(md, KMIN_BLOCK_BYTES) - md) * n
            if g.role in (Role.LINEAR, Role.EXPERT):
                largest_linear = max(largest_linear, rows * cols)
            if plan is None:
                continue
            # Routed experts are one stacked tensor per projection in the workload code.
            stacked = count if g.role is Role.EXPERT else 1
            if plan.method == "full":
                trainable_shapes.append((rows, cols, n))
                largest_trainable = max(largest_trainable, rows * cols * stacked)
            elif g.name.rsplit(".", 1)[-1] in plan.lora_targets and g.role in (Role.LINEAR,
                                                                                 Role.EXPERT):
                # lora_A (r x in) and lora_B (out x r) per adapted projection.
                adapter_params += plan.lora_rank * (rows + cols) * n
                trainable_shapes.append((plan.lora_rank, cols, n))
                trainable_shapes.append((rows, plan.lora_rank, n))
                largest_trainable = max(largest_trainable,
                                        plan.lora_rank * max(rows, cols) * stacked)
        largest_layer = max((_device_params(layer, arch, t, ep) for layer, _ in stage.layer_runs),
                            default=0)
        kv_full = sum(_kv_elems(arch, layer, t) * n for layer, n in stage.layer_runs
                      if layer.window is None) if arch.kind == "decoder" else 0
        sliding: dict[int, int] = {}
        if arch.kind == "decoder":
            for layer, n in stage.layer_runs:
                if layer.window is not None:
                    sliding[layer.window] = sliding.get(layer.window, 0) + _kv_elems(
                        arch, layer, t) * n
        gradient = optimizer = master = host_opt = host_master = host_params = 0
        step_gradient = step_upcast = step_temporary = 0
        adapter_bytes = 0
        trainable = 0
        comm_parts: list[tuple[str, int]] = []
        if t > 1:
            comm_parts.append((f"NCCL tensor-parallel communicator ({t} ranks)", _nccl(t)))
        if par.pipeline > 1:
            comm_parts.append(("NCCL pipeline point-to-point", NCCL_PAIR_BYTES))
        if plan is not None:
            if plan.method == "full":
                trainable = params
                grad_bytes = 4 if plan.mixed_precision == "autocast" else plain_bytes
                state_bytes = 4 if plan.mixed_precision in ("master_fp32", "autocast") else (
                    plain_bytes)
                master_per = 4 if (plan.mixed_precision == "master_fp32" and plain_bytes != 4
                                   ) else 0
            else:
                trainable = adapter_params
                adapter_bytes = adapter_params * plan.adapter_bytes
                grad_bytes = plan.adapter_bytes
                state_bytes = 4 if plan.mixed_precision != "pure" else plan.adapter_bytes
                master_per = 4 if (plan.mixed_precision == "master_fp32"
                                   and plan.adapter_bytes != 4) else 0
            gradient = trainable * grad_bytes
            optimizer = _optimizer_bytes(plan.optimizer, trainable_shapes, state_bytes)
            master = trainable * master_per
            step_gradient = trainable * (4 if master_per else grad_bytes)
            step_upcast = _last_trainable(arch, stage, plan, t, ep) * grad_bytes if (
                master_per) else 0
            step_temporary = _step_temporaries(plan.optimizer, trainable, largest_trainable,
                                               state_bytes)
            if zero >= 1:
                optimizer, master = ceil_div(optimizer, dp), ceil_div(master, dp)
                step_temporary = ceil_div(step_temporary, dp)
            if zero >= 2:
                gradient = ceil_div(gradient, dp)
                step_gradient = ceil_div(step_gradient, dp)
            if zero >= 3:  # ZeRO-3 / FSDP FULL_SHARD shard frozen parameters too
                weights, meta = ceil_div(weights, dp), ceil_div(meta, dp)
            if par.offload_optimizer:  # the step runs on the host (ZeRO-Offload)
                host_opt, host_master, optimizer, master = optimizer, master, 0, 0
                step_gradient, step_upcast, step_temporary = gradient, 0, 0
            if par.offload_parameters:
                host_params, weights = weights, 0
            if dp > 1:
                comm_parts.append((f"NCCL data-parallel communicator ({dp} ranks)", _nccl(dp)))
                full_grads = trainable * grad_bytes
                if zero == 0:
                    comm_parts.append(("DDP gradient buckets (a copy of the gradients)",
                                       full_grads))
                else:
                    bucket = min(ZERO_REDUCE_BUCKET_ELEMENTS, trainable) * grad_bytes
                    comm_parts.append(("ZeRO reduce bucket", bucket))
                if zero >= 3:
                    gathered = (largest_layer + min(ZERO_PREFETCH_BUCKET_ELEMENTS, params)
                                ) * plain_bytes
                    comm_parts.append(("ZeRO-3 gathered layer + prefetch bucket", gathered))
        result.append(StageStatic(
            stage=stage,
            dims=dims,
            layer_kinds=stage.layer_runs,
            num_params=params,
            weights_bytes=weights,
            metadata_bytes=meta,
            weights_rounding_bytes=rounding,
            adapter_params=adapter_params,
            adapter_bytes=adapter_bytes,
            trainable_params=trainable,
            gradient_bytes=gradient,
            optimizer_bytes=optimizer,
            master_bytes=master,
            host_optimizer_bytes=host_opt,
            host_master_bytes=host_master,
            host_param_bytes=host_params,
            comm_bytes=sum(b for _, b in comm_parts),
            comm_parts=tuple(comm_parts),
            largest_layer_params=largest_layer,
            largest_linear_params=largest_linear,
            kv_full_elems=kv_full,
            kv_sliding=tuple(sorted(sliding.items())),
            step_gradient_bytes=step_gradient,
            step_upcast_bytes=step_upcast,
            step_temporary_bytes=step_temporary,
        ))
    return tuple(result)
