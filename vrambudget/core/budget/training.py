"""Training budgets, per pipeline stage: persistent weights, adapters, optimizer state, masters
and overheads, and per phase (forward, backward start, backward end, optimizer step) the
gradients, activations and logits; the peak phase's total and its itemized parts."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import NamedTuple

import msgspec

from ..allocator.nf4_init import replay_nf4_init
from ..allocator.zero3_init import replay_zero3_module_init, replay_zero3_quantized_init
from ..arch import (
    SCORES_MATERIALIZED,
    Arch,
    Role,
    TensorGroup,
    attention_run,
    lora_target_names,
)
from ..components import Component, Members
from ..deployed import bnb_4bit
from ..dtypes import bytes_of
from ..formulas import allocator_overhead, communication_buffers, cuda_context, gradients
from ..formulas.activations import (
    HEAD_INPUTS_PART,
    OFFLOADED_BACK_PART,
    RECOMPUTE_GRADS_PART,
    RECOMPUTED_PART,
    activation_extra_bytes,
    eager_softmax_backward_bytes,
    lora_layer_trainable,
    recompute_backward_bytes,
    saved_scores_bytes,
    shares_one_norm,
    training_activations,
    unsloth_recompute,
)
from ..formulas.logits import (
    fused_loss_parts,
    loop_held_parts,
    training_backward_parts,
    training_forward_parts,
    training_recompute_parts,
)
from ..formulas.runtime_workspace import BLAS_PART, KERNEL_SCRATCH_PART
from ..formulas.weights import stored_bytes
from ..layout import per_device_shape
from ..memo import BoundedCache
from ..overheads import Overheads
from ..quantization import quantized_roles, stored_as_buffers
from ..spec import BitsAndBytes4bit, FullFineTune, QLoRA, Quantization, TrainingWorkload
from ..stack import LIGER_GLU_FAMILIES, Stack, upcast_rebound
from ..statics import (
    StageStatic,
    effective_precision,
    fixed_bytes,
    head_groups,
    quantizable,
    residual_bytes,
    stage_statics,
    training_plan,
)
from .stage import StageNumbers, finish, times

__all__ = ["training_stage"]

C = Members  # the members as plain attributes (Component's read through a descriptor)

SCORES_BACKWARD_PART = "the last layer's softmax backward (gradients of its scores)"
SCORES_RECOMPUTED_PART = "the last layer's scores, recomputed (selective)"

LITGPT_LOSS_CHUNK_TOKENS = 128
"""LitGPT's fine-tuning scripts run the LM head with ``lm_head_chunk_size=128`` and
``chunked_cross_entropy``'s ``chunk_size=128`` (litgpt 0.4.5 finetune/lora.py line 304,
utils.py line 282)."""


def training_stage(w: TrainingWorkload, arch: Arch, st: StageStatic, ov: Overheads) -> StageNumbers:
    e = bytes_of(w.precision.compute)
    tokens = w.sequence_length * w.micro_batch_size
    # The residual stream is fp32 where the embeddings are: QLoRA as PEFT prepares it (fp32
    # embeddings and norms) and autocast over fp32 parameters -- an fp32 embedding output, an
    # fp32 sum at every residual add.
    residual = residual_bytes(w, ov.stack)
    fused_swiglu = ov.stack.fused_swiglu and arch.model_type in LIGER_GLU_FAMILIES
    unsloth = ov.stack.framework == "unsloth"
    sdpa_math = ov.sdpa_math(arch, w.precision.compute)
    masked_math = ov.sdpa_math(arch, w.precision.compute, masked=True)
    acts, one_layer, act_parts = training_activations(
        w,
        arch,
        st.stage,
        st.dims,
        ov.stack.rms_norm,
        ov.stack.fused_qkv,
        ov.stack.math_mqa,
        residual_bytes=residual,
        fused_swiglu=fused_swiglu,
        unsloth=unsloth,
        act_extra=activation_extra_bytes(
            arch, ov.stack.transformers_modules, e, w.mixed_precision == "autocast"
        ),
        sdpa_math=sdpa_math,
        masked_math=masked_math,
    )
    previous_inputs = 0
    if isinstance(w.method, QLoRA) and ov.stack.bnb_keeps_inputs and w.checkpointing == "none":
        # Each 4-bit projection's input stays on its autograd context for the whole step: the
        # attention input (shared by q, k, v), the attention output, the MLP input (shared by
        # gate and up) and the MLP's inner activation, per layer of the stage. Under
        # checkpointing the frameworks' checkpointed forward runs without autograd recording
        # (reentrant: transformers 4.38-4.57, PEFT's prepare_model_for_kbit_training), so no
        # context keeps them.
        # Only the inputs nothing else saves: q, k, v and gate, up read the hidden state (saved
        # when an adapter reads it in the compute dtype), o the attention output (which SDPA
        # and flash save), down the MLP's product.
        d, m = st.dims, w.method
        # Neither eager attention nor SDPA's math path saves its output.
        eager = attention_run(w.attention, arch, sdpa_math) in SCORES_MATERIALIZED
        kept = 0
        previous = 0  # every 4-bit projection's input, for the previous micro-batch's graph
        for layer, n in st.stage.layer_runs:
            # Unsloth's functions dequantize the 4-bit weights themselves: no MatMul4Bit context
            # (its LoRA_MLP's down input included)
            tr, own_mlp = lora_layer_trainable(layer, arch, d.t, m, e, unsloth)
            # One shared norm (parallel residual): attention and the MLP read one tensor.
            shared = shares_one_norm(layer, arch)
            per_token = (
                (0 if tr.qkv_input else d.h)
                + (0 if tr.attention_output or not eager else d.heads * d.v_head_dim)
                + (0 if tr.mlp_input or shared else d.h)
                + (0 if tr.mlp_output_input or own_mlp else d.f)
            )
            kept += tokens * e * n * per_token
            if ov.stack.keeps_previous_step:
                inputs = d.h + d.heads * d.v_head_dim + (0 if shared else d.h) + d.f
                previous += tokens * e * n * inputs
        acts += kept
        act_parts.append(("4-bit layer inputs kept by bitsandbytes", kept))
        if ov.stack.keeps_previous_step:
            # LitGPT's loop keeps the last micro-batch's logits and loss -- and so its graph --
            # until the next forward has returned and its loss is computed; the backward freed
            # the graph's saved tensors, not bitsandbytes' ctx.tensors: every 4-bit layer's
            # input of the previous micro-batch stays through the next forward (and the LM
            # head's, 4-bit too).
            if st.stage.last and arch.kind == "decoder" and ov.stack.qlora_head_quantized:
                previous += tokens * e * d.h
            previous_inputs = previous
    has_head = st.stage.last and arch.kind == "decoder"  # encoders here have no LM head
    # Forward: the LM-head output, its fp32 copy and the fp32 log-softmax are live together.
    # Backward start: the saved log-softmax, the loss's fp32 gradient and log-softmax's fp32
    # input gradient (the forward's low-precision logits and fp32 copy are freed by then: no
    # backward needs them).
    stack = ov.stack
    chunks, shift_copy, joined = stack.loss_chunks, stack.loss_shift_copy, False
    own_shift = arch.shifted_loss_copy and stack.loss in (
        "cross_entropy",
        "cross_entropy_no_upcast",
    )
    if own_shift:
        # Qwen (v1)'s remote code (modeling_qwen.py QWenLMHeadModel.forward): CrossEntropyLoss
        # on lm_logits[..., :-1, :].contiguous(), whatever transformers; the Trainer's autocast
        # runs it in fp32 (cross_entropy), without autocast it stays in the compute dtype.
        shift_copy = True
    if stack.loss == "litgpt_chunked_cross_entropy":
        # LitGPT: chunks of 128 positions of every sequence (the LM head's), or of 128 rows
        # of the flattened logits for a full fine-tune, whose logits[..., :-1, :] is reshaped
        # into a copy when the micro-batch holds more than one sequence.
        full = isinstance(w.method, FullFineTune)
        chunks = -(-(tokens if full else w.sequence_length) // LITGPT_LOSS_CHUNK_TOKENS)
        shift_copy = full and w.micro_batch_size > 1
        joined = full  # the flattened logits' chunks are split views: their gradients join
    head_freed = upcast_rebound(stack, arch.model_type) and not own_shift
    fwd_parts = training_forward_parts(
        tokens,
        st.dims.vocab,
        e,
        stack.loss,
        chunks,
        shift_copy,
        stack.loss_compiled,
        softcap=arch.final_softcap,
        shift_first=own_shift,
        head_freed=head_freed,
    )
    bwd_parts = training_backward_parts(
        tokens,
        st.dims.vocab,
        stack.loss,
        chunks,
        e,
        stack.loss_compiled,
        joined,
        softcap=arch.final_softcap,
    )
    # A trained LM head's weight gradient: a full fine-tune's, or a modules_to_save copy's.
    weight_e = bytes_of(w.precision.weights)
    head_gradient = (
        0
        if not has_head
        else st.dims.vocab * arch.hidden_size * weight_e
        if isinstance(w.method, FullFineTune)
        else st.saved_head_gradient_bytes
    )
    loss_fwd_parts, loss_bwd_parts = fwd_parts, bwd_parts
    fused_work: tuple[tuple[str, int], ...] = ()
    liger = stack.liger_loss
    if has_head and liger is not None:
        # Liger's fused loss: the hidden states' and a trainable head's gradients come from its
        # forward (the head's counted at the recompute and after, where it is the gradient).
        head_upcast = liger.upcast_fp32 if weight_e == 4 else liger.upcast_16bit
        saved, fused_work = fused_loss_parts(
            tokens,
            st.dims.vocab,
            arch.hidden_size,
            e,
            residual,
            head_gradient,
            liger.chunks,
            head_upcast,
        )
        fwd_parts, bwd_parts = (*fwd_parts, *saved, *fused_work), (*bwd_parts, *saved)
    # A loop holding the model's output keeps its logits (fp32 where the model's forward
    # upcast them) through the backward and the optimizer step.
    held_output = (
        loop_held_parts(tokens, st.dims.vocab, e, head_freed)
        if has_head and stack.loop_holds_output
        else ()
    )
    held_out = sum(b for _, b in held_output)
    logits = sum(b for _, b in fwd_parts) if has_head else 0
    logits_bwd = sum(b for _, b in bwd_parts) + held_out if has_head else 0
    context = cuda_context.per_device(ov.process_context_bytes("training"), w.instances)
    workspace = ov.workspace_bytes * w.instances
    extra_ws: list[tuple[str, int]] = [(BLAS_PART, workspace)]
    if st.kernel_scratch_bytes:
        scratch = st.kernel_scratch_bytes * w.instances
        extra_ws.append((KERNEL_SCRATCH_PART, scratch))
        workspace += scratch
    if isinstance(w.method, QLoRA):
        dequant = st.largest_linear_params * e * w.instances
        extra_ws.append(("4-bit dequantized weight (largest projection)", dequant))
        workspace += dequant
    if w.mixed_precision == "autocast":
        cast = (st.num_params if isinstance(w.method, FullFineTune) else 0) * e
        if cast:
            extra_ws.append(("autocast low-precision weight cache", cast * w.instances))
            workspace += cast * w.instances
    k = w.instances
    comm_bytes, comm_parts = _communication(st, ov)
    g = _gradients(w, st, stack)
    # Gradients live through the forward with accumulation, or where zero_grad keeps them.
    accumulating = w.gradient_accumulation_steps > 1
    grads_live = g.accumulated if accumulating else g.held if stack.grads_kept else 0
    live_parts = g.accumulated_parts if accumulating else g.held_parts
    # A backward ends with the accumulated gradients (all but the last micro-batch) or with
    # the reduced ones.
    end_grads, end_parts = (
        (g.accumulated, g.accumulated_parts) if accumulating else (g.held, g.held_parts)
    )
    base = {
        C.WEIGHTS: st.weights_bytes * k,
        C.QUANTIZATION_METADATA: st.metadata_bytes * k,
        C.ADAPTERS: st.adapter_bytes * k,
        C.OPTIMIZER_STATE: st.optimizer_bytes * k,
        C.MASTER_WEIGHTS: st.master_bytes * k,
        C.CUDA_CONTEXT: context,
        C.RUNTIME_WORKSPACE: workspace,
        C.COMMUNICATION_BUFFERS: comm_bytes * k,
    }
    rounding = st.weights_rounding_bytes * k

    transients: list[int] = []

    def phase(grads: int, a: int, lg: int, transient: int = 0) -> dict[Component, int]:
        v = dict(base)
        v[C.GRADIENTS] = grads * k
        v[C.ACTIVATIONS] = a * k
        v[C.LOGITS] = lg * k
        transients.append((a + lg + transient) * k)
        return v

    recomputing = w.checkpointing in ("full", "offloaded")
    # Full recomputation: the layer recomputed in backward is live only after the LM head's
    # backward has consumed (and freed) the loss's tensors -- autograd reaches the last
    # checkpointed layer through the head's gradient -- so the forward and the backward start
    # hold the layer inputs without it; the recompute holds it beside every layer input, the
    # loss's tensors and the final norm's inputs gone (torch/utils/checkpoint.py: the forward
    # runs again when its backward node, or the first saved tensor unpacked, is reached).
    # Offloaded: the recomputed layer's input is copied back only for its recompute.
    brought_back = dict(act_parts).get(OFFLOADED_BACK_PART, 0)
    held_acts = acts - one_layer - brought_back if recomputing else acts
    head_inputs = dict(act_parts).get(HEAD_INPUTS_PART, 0)
    forward = phase(grads_live, held_acts + previous_inputs, logits)
    forward_comm = tuple((n, b) for n, b in comm_parts if communication_buffers.live_in_forward(n))
    forward[C.COMMUNICATION_BUFFERS] = sum(b for _, b in forward_comm) * k
    phases = [
        ("forward", forward),
        ("backward_start", phase(grads_live, held_acts, logits_bwd)),
    ]
    recompute_grads = 0
    held_parts = training_recompute_parts(tokens, st.dims.vocab, stack.loss) if has_head else ()
    scores_backward = eager_softmax_backward_bytes(w, arch, st.dims, sdpa_math, masked_math)
    # Selective recomputation dropped the layer's scores: its backward recomputes them.
    scores_back = (
        saved_scores_bytes(w, arch, st.dims, sdpa_math, masked_math)
        if w.checkpointing == "selective"
        else 0
    )
    layers = sum(n for _, n in st.stage.layer_runs)
    # The head's weight gradient and the last layer's (an even share of the stage's) exist by
    # then, unless every gradient is live already.
    attention_grads = grads_live or head_gradient + st.gradient_bytes // max(layers, 1)
    if scores_backward and not recomputing:
        # Eager attention and SDPA's math path: the last layer's softmax backward holds the
        # gradients of its scores beside every layer's saved activations, once the head's
        # backward has freed the loss's tensors and the final norm's inputs (its MLP's saved
        # tensors, freed just before, are still counted: the safe side).
        phases.append(
            (
                "backward_attention",
                phase(
                    attention_grads,
                    acts - head_inputs + scores_back + scores_backward,
                    held_out,
                ),
            )
        )
    if recomputing:
        # Unsloth's own functions on every adapted projection: no fp32 input casts, and its
        # MLP writes the gate's and up's gradients in place (``recompute_backward_bytes``).
        unsloth_all, unsloth_mlp = unsloth_recompute(w.method, arch, st.stage, unsloth)
        recompute_grads = recompute_backward_bytes(
            st.dims,
            tokens,
            e,
            w.method,
            fused_swiglu or unsloth_mlp,
            residual,
            scores_backward,
            peft_casts=not unsloth_all,
        )
        # The LM head's weight gradient exists by then (a full fine-tune's; with accumulation
        # or kept gradients it is among the live ones already).
        if not grads_live:
            recompute_grads += head_gradient
        held_logits = sum(b for _, b in held_parts) + held_out
        phases.append(
            (
                "backward_recompute",
                phase(grads_live, acts - head_inputs + recompute_grads, held_logits),
            )
        )
    # A head sharing the embedding's saved copy: the embedding's gradient is added into the
    # head's at the backward's end.
    phases.append(
        ("backward_end", phase(end_grads + st.saved_tied_accumulate_bytes, one_layer, held_out))
    )
    # The optimizer step: gradients (fp32 when stepping fp32 masters; the largest tensor's
    # low-precision gradient still live while it is upcast) plus the implementation's
    # temporaries, whichever moment is larger.
    upcast_grads = st.step_gradient_bytes if st.master_bytes else 0  # allocated for the step
    step = phase(
        g.step,
        0,
        held_out,
        upcast_grads + max(st.step_upcast_bytes, st.step_temporary_bytes),
    )
    if st.step_upcast_bytes >= st.step_temporary_bytes:
        step[C.GRADIENTS] += st.step_upcast_bytes * k
    else:
        step[C.OPTIMIZER_STATE] += st.step_temporary_bytes * k
    init = (
        _nf4_init(w, arch, st, ov)
        or _zero3_module_init(w, arch, st, ov)
        or _zero3_quantized_init(w, arch, st, ov)
        or _kbit_init(w, arch, st, ov)
    )
    if init is not None:
        phases.insert(0, ("model_init", init.phase))  # before the first step
    step_comm = tuple(
        (n, b)
        for n, b in comm_parts
        if communication_buffers.live_at_step(n, stack.deepspeed, w.parallelism.zero_stage)
    )
    step[C.COMMUNICATION_BUFFERS] = sum(b for _, b in step_comm) * k
    phases.append(("optimizer_step", step))
    transient = max(transients)
    fraction = ov.training_fragmentation(w.checkpointing)
    overhead = allocator_overhead.overhead(rounding, transient, fraction)
    for name, v in phases:
        if name != "model_init":
            v[C.ALLOCATOR_OVERHEAD] = overhead
    # The blocks the first step frees: the loss's, not the fused loss's saved gradients (the
    # head's becomes its .grad).
    freed = (*loss_fwd_parts, *loss_bwd_parts, *fused_work) if has_head else ()
    stranded = _stranded_by_first_step(w, st, stack, tokens, freed, transients[:-1])
    step[C.ALLOCATOR_OVERHEAD] += stranded
    parts = {
        C.ACTIVATIONS: times(act_parts, k),
        C.COMMUNICATION_BUFFERS: times(comm_parts, k),
        C.RUNTIME_WORKSPACE: tuple(extra_ws),
        C.ALLOCATOR_OVERHEAD: allocator_overhead.parts(rounding, transient, fraction),
        C.CUDA_CONTEXT: ov.context_parts("training", w.instances),
    }
    if st.saved_parts:
        parts[C.ADAPTERS] = times(st.saved_parts, k)
    par = w.parallelism
    numbers = finish(st.stage.index, par.tensor * par.data, phases, parts, transient)
    # Parts describe the peak phase only.
    if numbers.peak_phase == "model_init" and init is not None:
        parts = {**init.parts, C.CUDA_CONTEXT: parts[C.CUDA_CONTEXT]}
        numbers = finish(st.stage.index, par.tensor * par.data, phases, parts, transient)
    elif numbers.peak_phase == "optimizer_step":
        parts[C.ACTIVATIONS] = ()
        parts[C.COMMUNICATION_BUFFERS] = times(step_comm, k)
        extra = step[C.OPTIMIZER_STATE] - base[C.OPTIMIZER_STATE]
        if extra:
            parts[C.OPTIMIZER_STATE] = (
                ("moments and statistics", base[C.OPTIMIZER_STATE]),
                ("optimizer step temporaries", extra),
            )
        if stranded:
            parts[C.ALLOCATOR_OVERHEAD] += ((FIRST_STEP_PART, stranded),)
        upcast = st.step_upcast_bytes >= st.step_temporary_bytes and st.step_upcast_bytes
        step_parts = g.step_parts or (
            (("fp32 gradients of the masters", st.step_gradient_bytes),) if upcast else ()
        )
        if upcast:
            step_parts += (("low-precision gradient being upcast", st.step_upcast_bytes),)
        if step_parts:
            parts[C.GRADIENTS] = times(step_parts, k)
        if held_output:
            parts[C.LOGITS] = times(held_output, k)
    elif numbers.peak_phase == "backward_end":
        parts[C.ACTIVATIONS] = (("one layer's saved tensors (last gradients)", one_layer * k),)
        if end_parts:
            parts[C.GRADIENTS] = times(end_parts, k)
        if held_output:
            parts[C.LOGITS] = times(held_output, k)
    else:
        # The itemized activations of the moment: without the recomputed layer before it
        # runs, without the loss's inputs once it does.
        gone = (
            {HEAD_INPUTS_PART}
            if numbers.peak_phase == "backward_recompute"
            else {HEAD_INPUTS_PART, RECOMPUTED_PART, OFFLOADED_BACK_PART}
            if numbers.peak_phase == "backward_attention"
            else {RECOMPUTED_PART, OFFLOADED_BACK_PART}
        )
        parts[C.ACTIVATIONS] = tuple((n, b) for n, b in parts[C.ACTIVATIONS] if n not in gone)
        if numbers.peak_phase == "backward_recompute":
            parts[C.ACTIVATIONS] += ((RECOMPUTE_GRADS_PART, recompute_grads * k),)
        if numbers.peak_phase == "backward_attention":
            parts[C.ACTIVATIONS] += times(
                (
                    (n, b)
                    for n, b in (
                        (SCORES_RECOMPUTED_PART, scores_back),
                        (SCORES_BACKWARD_PART, scores_backward),
                    )
                    if b
                ),
                k,
            )
            if not grads_live:
                parts[C.GRADIENTS] = times(
                    tuple(
                        (n, b)
                        for n, b in (
                            ("LM-head weight gradient", head_gradient),
                            (
                                "the last layer's weight gradients (an even share)",
                                attention_grads - head_gradient,
                            ),
                        )
                        if b
                    ),
                    k,
                )
        if numbers.peak_phase == "forward":
            parts[C.COMMUNICATION_BUFFERS] = times(forward_comm, k)
        if numbers.peak_phase == "forward" and previous_inputs:
            parts[C.ACTIVATIONS] += (
                (
                    "previous micro-batch's 4-bit layer inputs (its graph is still referenced)",
                    previous_inputs * k,
                ),
            )
        if has_head:
            logit_parts = {
                "forward": fwd_parts,
                "backward_start": (*bwd_parts, *held_output),
                "backward_recompute": (*held_parts, *held_output),
                "backward_attention": held_output,
            }.get(numbers.peak_phase, ())
            if logit_parts:
                parts[C.LOGITS] = times(logit_parts, k)
        if live_parts and grads_live:
            parts[C.GRADIENTS] = times(live_parts, k)
    return numbers


NF4_INIT_PART = "torchao 0.1 to_nf4 temporaries the allocator keeps from model init (replayed)"
NF4_INIT_LIVE_PART = "torchao 0.1 to_nf4 temporaries at the model init's allocated peak (replayed)"
NF4_BLOCK = 64 * 256
"""torchao 0.1's ``to_nf4`` asserts a weight's elements divide into blocks of 64 whose scalers
divide into blocks of 256."""


class _Init(NamedTuple):
    """A model-init phase before the first step: its components and its itemized parts."""

    phase: dict[Component, int]
    parts: dict[Component, tuple[tuple[str, int], ...]]


def _nf4_init(w: TrainingWorkload, arch: Arch, st: StageStatic, ov: Overheads) -> _Init | None:
    """torchtune 0.1's QLoRA model init (:mod:`vrambudget.core.allocator.nf4_init`): the
    model's own tensors, the CUDA context, the quantization temporaries live at the init's
    allocated peak (``runtime_workspace``) and what the allocator reserves beyond that
    (``allocator_overhead``): the replay's reserved peak plus the context; no optimizer state,
    gradients or cuBLAS workspace yet. None where it does not
    apply: other stacks and methods, several devices or instances, a compute dtype other than bf16
    (``to_nf4`` asserts bf16), a model whose layers are not one dense kind, weights ``to_nf4``
    cannot block, or a bias on an adapted projection (torchtune 0.1 raises)."""
    par = w.parallelism
    if (
        not ov.stack.nf4_init_requantize
        or not isinstance(w.method, QLoRA)
        or par.tensor * par.pipeline * par.data != 1
        or w.instances != 1
        or arch.kind != "decoder"
        or len(st.stage.layer_runs) != 1
        or st.dims.experts
        or w.precision.compute != "bf16"
    ):
        return None
    # The layer's projections in module order, from the model's tensor inventory (the names
    # LoRA targets, as the statics match them); torchtune 0.1 refuses a bias on a quantized one.
    layer = st.stage.layer_runs[0][0]
    targets = set(lora_target_names(w.method.target_modules, arch))
    projections = tuple(
        (g.cols, g.rows, g.name.rsplit(".", 1)[-1] in targets)
        for g in layer.tensors
        if g.role is Role.LINEAR
    )
    biased = {
        g.name.removesuffix(".bias").rsplit(".", 1)[-1]
        for g in layer.tensors
        if g.role is Role.BIAS
    }
    adapted = [i * o for i, o, a in projections if a]
    if not adapted or any(n % NF4_BLOCK for n in adapted) or biased & targets:
        return None
    embedding = sum(g.rows * g.cols * 2 for g in arch.embeddings if g.role is Role.EMBEDDING)
    head = sum(g.rows * g.cols * 2 for g in arch.head if g.role is Role.LM_HEAD)
    r = replay_nf4_init(
        projections, st.stage.num_layers, w.method.rank, embedding, head, arch.hidden_size
    )
    # The phase is the replay's reserved peak: the budget's own tensors (quantized as the
    # statics count them), the replay's allocated peak beyond them, the reserve beyond that.
    held = st.weights_bytes + st.metadata_bytes + st.adapter_bytes - st.saved_copy_bytes
    live = max(0, r.peak_allocated_bytes - held)
    cached = max(0, r.peak_reserved_bytes - max(r.peak_allocated_bytes, held))
    phase = {**_model_held(st, ov), C.RUNTIME_WORKSPACE: live, C.ALLOCATOR_OVERHEAD: cached}
    parts: dict[Component, tuple[tuple[str, int], ...]] = {
        C.RUNTIME_WORKSPACE: ((NF4_INIT_LIVE_PART, live),),
        C.ALLOCATOR_OVERHEAD: ((NF4_INIT_PART, cached),),
    }
    return _Init(phase, parts)


KBIT_INIT_PART = (
    "fp32 copies of the unquantized parameters that prepare_model_for_kbit_training makes at "
    "start-up, with the last large one's 16-bit original"
)


def _kbit_init(w: TrainingWorkload, arch: Arch, st: StageStatic, ov: Overheads) -> _Init | None:
    """PEFT's ``prepare_model_for_kbit_training`` at start-up (peft 0.17.1 utils/other.py lines
    151-156): every 16-bit parameter that is not 4-bit gets ``param.data =
    param.data.to(torch.float32)``, one at a time, so while the last large one (the LM head,
    or the tied embedding) is converted its 16-bit original and its fp32 copy are both live,
    next to every earlier one already in fp32: the model's 4-bit layers, the unquantized
    parameters in fp32 and the largest one's 16-bit bytes once more. TRL 0.9.6-0.24 then cast
    the embeddings and LM head back to bf16 (trl 0.24.0 models/utils.py lines 503-510 and
    560-561), which holds no more than that (the fp32 embedding and its bf16 copy, the fp32
    head). Allocated bytes, a floor under the reserved peak. None where it does not run or is
    not modelled: another stack, LoRA, sharded QLoRA (TRL skips it for parameters on the CPU
    or meta device), tensor or pipeline parallelism, several instances."""
    par = w.parallelism
    if (
        not ov.stack.kbit_init_upcast
        or not isinstance(w.method, QLoRA)
        or par.tensor * par.pipeline != 1
        or (par.zero_stage >= 3 and par.data > 1)
        or w.instances != 1
    ):
        return None
    plain = bytes_of(w.precision.weights)
    if plain >= 4:
        return None  # nothing to upcast
    unquantized = tuple(
        g
        for g in (*arch.embeddings, *arch.head)
        if g.role in (Role.EMBEDDING, Role.LM_HEAD) and not fixed_bytes(g, w.precision.weights)
    )
    largest = max((g.rows * g.cols * plain for g in unquantized), default=0)
    if not largest:
        return None
    # Every unquantized parameter in fp32: the statics' own count where the stack keeps them
    # so (PEFT), else the upcast's bytes on top of the 16-bit ones they hold (TRL 0.9.6-0.24).
    live = (0 if ov.stack.qlora_upcast else _upcast_bytes(w, arch, ov.stack)) + largest
    phase = {**_model_held(st, ov), C.RUNTIME_WORKSPACE: live}
    return _Init(phase, {C.RUNTIME_WORKSPACE: ((KBIT_INIT_PART, live),)})


FIRST_STEP_PART = (
    "the forward's and backward's freed blocks, cached beside the first step's new optimizer "
    "state of the modules_to_save copies, which they are too small for (what max_memory_"
    "reserved and nvidia-smi show; the allocator frees them and retries before it would fail)"
)


def _stranded_by_first_step(
    w: TrainingWorkload,
    st: StageStatic,
    stack: Stack,
    tokens: int,
    logit_parts: tuple[tuple[str, int], ...],
    transients: list[int],
) -> int:
    """What the caching allocator keeps reserved beside the first optimizer step when that step
    creates state tensors larger than any block the forward and backward freed: torch's
    optimizers create their state lazily in the first ``step()`` (torch/optim/adamw.py
    ``_init_group``: ``torch.zeros_like(p)``), after the backward's transient blocks are
    cached; a request larger than every cached block gets a new segment
    (c10/cuda/CUDACachingAllocator.cpp ``get_free_block`` then ``alloc_block``), so the
    forward's and backward's transient memory stays reserved beside it -- as long as the device
    has room: short of it, ``release_cached_blocks`` frees those wholly free segments and the
    request is retried. Counted, as the reserved peak a measurement shows and an upper bound on
    what the run needs, for PEFT's ``modules_to_save`` copies (an embedding or LM head:
    vocabulary x hidden), whose states outsize the logits; the trace tier's allocator replay of
    the framework's code shows it (docs/COMPONENTS.md §3). Full fine-tunes are left to the
    calibrated fragmentation, which their measurements cover. None where the device creates no
    state at the step: an offloaded optimizer, DeepSpeed (whose ZeRO optimizer allocates its
    state at ``deepspeed.initialize``). The largest freed block: a logits tensor where the stage
    has the head, else one activation tensor in fp32 (tokens x the widest projection); the
    state compared is this rank's share under ZeRO-1+."""
    par = w.parallelism
    if not st.saved_largest_state_bytes or not transients:
        return 0
    if par.offload_optimizer or stack.deepspeed:
        return 0
    state = st.saved_largest_state_bytes
    if par.zero_stage >= 1:
        state = -(-state // par.data)
    d = st.dims
    widest = max(d.h, d.f, d.heads * max(d.qk_head_dim, d.v_head_dim), d.f_expert, d.f_shared)
    block = max((b for _, b in logit_parts), default=0)
    block = max(block, tokens * widest * 4)
    if state <= block:
        return 0
    return max(transients)


def _model_held(st: StageStatic, ov: Overheads) -> dict[Component, int]:
    """What a QLoRA model-init phase holds before its own temporaries: the model's tensors (as
    the statics count them), the adapters and one process's CUDA context."""
    return {
        C.WEIGHTS: st.weights_bytes,
        C.QUANTIZATION_METADATA: st.metadata_bytes,
        C.ADAPTERS: st.adapter_bytes - st.saved_copy_bytes,  # before get_peft_model's copies
        C.CUDA_CONTEXT: cuda_context.per_device(ov.process_context_bytes("training"), 1),
    }


def _upcast_bytes(w: TrainingWorkload, arch: Arch, stack: Stack) -> int:
    """What PEFT's fp32 upcast adds to the weights: the statics with it less those without
    (memoized on what the statics read: a fit's bisections ask again for every batch size)."""

    def compute() -> int:
        plan = training_plan(w, stack)
        precision = effective_precision(w, stack)
        kept = stage_statics(arch, precision, w.parallelism, plan, stack.untied_head)
        up = stage_statics(
            arch,
            precision,
            w.parallelism,
            dataclasses.replace(plan, kbit_upcast=True),
            stack.untied_head,
        )
        return up[0].weights_bytes - kept[0].weights_bytes

    key = (arch, stack, w.precision, w.method, w.parallelism, w.optimizer, w.mixed_precision)
    return _UPCAST.get_or(key, compute)


_UPCAST: BoundedCache[tuple[object, ...], int] = BoundedCache(4096)


ZERO3_WHOLE_MODEL_PART = "the whole model, moved to the device before ZeRO-3 partitions it"
ZERO3_PARTITION_PART = (
    "the partition of the parameter being converted, before its full tensor is freed"
)
ZERO3_CACHED_PART = "segments the caching allocator keeps from the whole-model move (replayed)"


def _zero3_module_init(
    w: TrainingWorkload, arch: Arch, st: StageStatic, ov: Overheads
) -> _Init | None:
    """DeepSpeed ZeRO-3 on a model built outside ``zero.Init``
    (:mod:`vrambudget.core.allocator.zero3_init`): the whole model on the device in the weights'
    dtype, the partition being made, the segments the allocator keeps, the CUDA context and the
    data-parallel communicator the first broadcast creates; none of the training state yet.
    None where it does not apply: ``zero.Init`` (the default), FSDP, fewer than two ranks, a
    pipeline or several instances, quantized weights (``from_pretrained`` quantizes on the
    device itself)."""
    par = w.parallelism
    if (
        not ov.stack.deepspeed
        or ov.stack.zero_init
        or par.zero_stage < 3
        or par.data < 2
        or par.pipeline != 1
        or w.instances != 1
        or w.precision.quantization is not None
        or isinstance(w.method, QLoRA)
        or w.precision.weights == "fp8"
    ):
        return None
    r = replay_zero3_module_init(
        module_tensors(arch, st, w.precision.weights, par.tensor, par.expert),
        par.data,
        not par.offload_parameters,
    )
    return _zero3_phase(
        st,
        ov,
        {C.WEIGHTS: r.model_bytes},
        ZERO3_WHOLE_MODEL_PART,
        (ZERO3_PARTITION_PART, r.peak_allocated_bytes - r.model_bytes),
        r.peak_reserved_bytes - r.peak_allocated_bytes,
    )


def _zero3_phase(
    st: StageStatic,
    ov: Overheads,
    held: dict[Component, int],
    model_part: str,
    live: tuple[str, int],
    cached: int,
) -> _Init:
    """A ZeRO-3 model-init phase: what the device ``held`` (the whole model's weights first),
    one process's CUDA context, the data-parallel communicator the first broadcast creates,
    the ``live`` temporaries at the init's allocated peak (``runtime_workspace``) and the
    segments ``cached`` beyond it (``allocator_overhead``)."""
    nccl = tuple((n, b) for n, b in st.comm_parts if communication_buffers.is_nccl(n))
    phase = {
        **held,
        C.CUDA_CONTEXT: cuda_context.per_device(ov.process_context_bytes("training"), 1),
        C.RUNTIME_WORKSPACE: live[1],
        C.COMMUNICATION_BUFFERS: sum(b for _, b in nccl),
        C.ALLOCATOR_OVERHEAD: cached,
    }
    parts: dict[Component, tuple[tuple[str, int], ...]] = {
        C.WEIGHTS: ((model_part, held[C.WEIGHTS]),),
        C.RUNTIME_WORKSPACE: (live,),
        C.COMMUNICATION_BUFFERS: nccl,
        C.ALLOCATOR_OVERHEAD: ((ZERO3_CACHED_PART, cached),),
    }
    return _Init(phase, parts)


ZERO3_QUANTIZED_MODEL_PART = (
    "the whole quantized model, on each device before ZeRO-3 partitions its parameters"
)
ZERO3_QUANTIZED_LIVE_PART = (
    "the 16-bit weight being quantized or the partition being made, with the blocks the "
    "allocator leaves unsplit beside it (replayed)"
)


def zero3_quantized_init_applies(w: TrainingWorkload) -> bool:
    """Whether a workload is one :func:`_zero3_quantized_init` models (the answer's
    ``zero3_quantized_model_init`` behaviour goes with it, on the stacks that load the model
    so: :attr:`~vrambudget.core.stack.Stack.quantized_outside_zero_init`): a bitsandbytes
    4-bit, GPTQ or AWQ base, ZeRO-3 over two or more ranks, one instance, no tensor or pipeline
    parallelism."""
    par = w.parallelism
    return (
        (bnb_4bit(w) or stored_as_buffers(w.precision.quantization))
        and par.zero_stage >= 3
        and par.data >= 2
        and par.tensor == 1
        and par.pipeline == 1
        and w.instances == 1
    )


def _zero3_quantized_init(
    w: TrainingWorkload, arch: Arch, st: StageStatic, ov: Overheads
) -> _Init | None:
    """DeepSpeed ZeRO-3 over a quantized base (QLoRA, or LoRA over ``bnb_4bit``, GPTQ or AWQ)
    loaded by transformers >= 4.39, which builds no quantized model under ``zero.Init``
    (4.39.3 ``modeling_utils.py`` line 3389, 4.46.3 line 4077, 5.23.0 ``get_init_context``
    lines 3811-3825): each rank holds the whole quantized model on its own GPU before ZeRO-3
    partitions its parameters one at a time
    (:func:`~vrambudget.core.allocator.zero3_init.replay_zero3_quantized_init`).
    bitsandbytes quantizes each weight on the current device (``quantizer_bnb_4bit.py``
    ``update_device_map``, lines 94-111 in 5.23.0); transformers 4.39 - 4.x then sends the
    packed data to the host under ZeRO-3 (4.46.3 ``modeling_utils.py`` lines 995-1006, its
    quant_state staying on the device) and ``deepspeed.initialize`` moves it back whole
    (DeepSpeed 0.16.4 ``runtime/engine.py`` lines 1236-1237), where 5.x leaves it there.
    GPTQ and AWQ load to the host (5.23.0 ``quantizer_gptq.py`` lines 80-83; AWQ keeps no
    device map) and the engine moves the module whole. The phase: the whole quantized model,
    its quant_state, the whole adapters, the CUDA context, the data-parallel communicator, the
    largest 16-bit weight being quantized or partition being made (``runtime_workspace``) and
    what the allocator keeps beyond (``allocator_overhead``). Reported: huggingface/peft#2016
    (Llama 3.1 405B QLoRA: "the parameters are not partitioned, but copied across the GPUs"),
    huggingface/transformers#24395. None elsewhere: FSDP (rank 0 loads to the host), a stack
    whose model is not transformers' (or transformers < 4.39), one rank, tensor or pipeline
    parallelism, several instances, other quantization schemes (LLM.int8, fp8, MXFP4 and the
    rest are not modelled here)."""
    par = w.parallelism
    precision = effective_precision(w, ov.stack)
    quant = precision.quantization
    if not ov.stack.quantized_outside_zero_init or not zero3_quantized_init_applies(w):
        return None
    plan = training_plan(w, ov.stack)
    one = msgspec.structs.replace(
        par, data=1, zero_stage=0, offload_optimizer=False, offload_parameters=False
    )
    whole = stage_statics(arch, precision, one, plan, ov.stack.untied_head)[st.stage.index]
    r = replay_zero3_quantized_init(
        _quantized_module_tensors(arch, st, precision.weights, quant, par.tensor, par.expert),
        par.data,
        not par.offload_parameters,
        via_host=isinstance(quant, BitsAndBytes4bit) and ov.stack.bnb_packed_via_host,
    )
    held = {
        C.WEIGHTS: whole.weights_bytes,
        C.QUANTIZATION_METADATA: whole.metadata_bytes,
        C.ADAPTERS: whole.adapter_bytes - whole.saved_copy_bytes,
    }
    return _zero3_phase(
        st,
        ov,
        held,
        ZERO3_QUANTIZED_MODEL_PART,
        (ZERO3_QUANTIZED_LIVE_PART, max(0, r.peak_allocated_bytes - r.model_bytes)),
        r.peak_reserved_bytes - r.peak_allocated_bytes,
    )


def _quantized_module_tensors(
    arch: Arch, st: StageStatic, weights_dtype: str, quant: Quantization, t: int, ep: int
) -> tuple[tuple[int, int, int, int], ...]:
    """The stage's parameters in module order as :func:`~vrambudget.core.allocator.
    zero3_init.replay_zero3_quantized_init` takes them: ``(16-bit source bytes, parameter
    bytes, kept bytes, bytes per stored element)``. A bitsandbytes 4-bit weight is quantized
    on the device from its 16-bit source and stored in the weights' dtype
    (``bnb_4bit_quant_storage``, as ZeRO-3 needs one dtype), its quant_state kept; GPTQ's and
    AWQ's packed weights and metadata are buffers, kept whole (:func:`~vrambudget.core.
    quantization.stored_as_buffers`)."""
    plain = bytes_of(weights_dtype)
    roles = quantized_roles(quant)
    buffers = stored_as_buffers(quant)
    out: list[tuple[int, int, int, int]] = []
    for g in _parameters_in_module_order(arch, st):
        rows, cols, count = per_device_shape(g, arch, t, ep)
        size = fixed_bytes(g, weights_dtype) or plain
        copies, each = (1, count) if _stacked(g, count) else (count, 1)
        if g.role in roles and quantizable(g):
            payload, md = stored_bytes(rows, cols, plain, quant)
            if buffers:  # loaded to the host, moved whole, never partitioned
                entry = (0, 0, (payload + md) * each, plain)
            else:  # quantized from its 16-bit source on the device
                entry = (rows * cols * each * plain, payload * each, md * each, plain)
        elif buffers and g.role is Role.BIAS and Role.LINEAR in roles:
            entry = (0, 0, rows * cols * each * size, size)  # a QuantLinear's bias buffer
        else:
            entry = (0, rows * cols * each * size, 0, size)
        out.extend([entry] * copies)
    return tuple(out)


def _parameters_in_module_order(arch: Arch, st: StageStatic) -> Iterator[TensorGroup]:
    """The stage's parameter groups (not buffers) in module order: embeddings, extras, each
    layer in turn, the head."""
    stage = st.stage
    groups: list[tuple[TensorGroup, ...]] = []
    if stage.first:
        groups += [arch.embeddings, arch.extras]
    for layer, n in stage.layer_runs:
        groups += [layer.tensors] * n
    if stage.last:
        groups.append(head_groups(arch, 1))
    for run in groups:
        yield from (g for g in run if not g.buffer)


def _stacked(g: TensorGroup, count: int) -> bool:
    """Whether a group's ``count`` copies are one tensor (fused experts, a tensor that stores
    several copies), as ``nn.Parameter`` holds it; a layer's norms are one each."""
    return g.role is Role.EXPERT or (count > 1 and g.role is not Role.NORM)


def module_tensors(
    arch: Arch, st: StageStatic, weights_dtype: str, t: int, ep: int
) -> tuple[tuple[int, int], ...]:
    """The stage's parameters as ``(numel, bytes per element)``, one entry per tensor, in
    module order (embeddings, extras, each layer in turn, the head): a stacked group (fused
    experts, a tensor that stores several copies) is one tensor, as ``nn.Parameter`` holds it."""
    plain = bytes_of(weights_dtype)
    out: list[tuple[int, int]] = []
    for g in _parameters_in_module_order(arch, st):
        rows, cols, count = per_device_shape(g, arch, t, ep)
        size = fixed_bytes(g, weights_dtype) or plain
        if _stacked(g, count):
            out.append((rows * cols * count, size))
        else:
            out.extend([(rows * cols, size)] * count)
    return tuple(out)


class _Grads(NamedTuple):
    """A rank's gradients at each moment of a step, and the parts shown where they are not the
    plain shard (empty: the line has no parts)."""

    held: int
    """After the rank's reduce(-scatter): through the backward's end without accumulation."""
    accumulated: int
    """Between the micro-batches of an accumulation (and at a non-final backward's end)."""
    step: int
    """During the optimizer step (before the low-precision gradient being upcast)."""
    held_parts: tuple[tuple[str, int], ...]
    accumulated_parts: tuple[tuple[str, int], ...]
    step_parts: tuple[tuple[str, int], ...]


def _gradients(w: TrainingWorkload, st: StageStatic, stack: Stack) -> _Grads:
    """A rank's gradients: after its reduce(-scatter), between the micro-batches of an
    accumulation, during the optimizer step.

    Under FSDP, gradient accumulation in ``no_sync`` (``Stack.accumulate_unsharded``) keeps the
    unsharded gradients between micro-batches; a LoRA block wrapped whole in one FSDP1
    FlatParameter with ``use_orig_params=True`` (``Stack.frozen_gradients``) gets gradients for
    its frozen weights too, and their shard stays through the optimizer step (fp32 master
    gradients, if any, on top).

    Worked number: LoRA r8 on q, v of Llama 2 7B in bf16 (6,476,267,520 layer parameters and
    4,194,304 adapter ones) over 2 ranks, FULL_SHARD, LitGPT < 0.5.11, gradient accumulation:
    (6,476,267,520 + 4,194,304) x 2 = 12,960,923,648 B between micro-batches, half of it after
    the last micro-batch's reduce-scatter."""
    par = w.parallelism
    held, whole = st.gradient_bytes, st.unsharded_gradient_bytes
    step = st.step_gradient_bytes
    what = "gradients of the trained parameters"
    held_parts: tuple[tuple[str, int], ...] = ()
    step_parts: tuple[tuple[str, int], ...] = ()
    if stack.frozen_gradients and par.data > 1 and st.block_gradient_bytes:
        whole = st.block_gradient_bytes
        held = whole
        if par.zero_stage >= gradients.SHARDED_FROM_ZERO_STAGE:
            held = -(-whole // par.data)
        what = "gradients of every parameter of the adapted layers (FSDP1 FlatParameter)"
        held_parts = ((what, held),)
        step_parts = held_parts
        if st.master_bytes:
            step = held + st.step_gradient_bytes
            step_parts += (("fp32 gradients of the masters", st.step_gradient_bytes),)
        else:
            step = held
    no_sync = (
        stack.accumulate_unsharded
        and par.data > 1
        and par.zero_stage >= gradients.SHARDED_FROM_ZERO_STAGE
        and w.gradient_accumulation_steps > 1
    )
    if no_sync:
        label = f"{what}, unsharded (accumulated in no_sync)"
        return _Grads(held, whole, step, held_parts, ((label, whole),), step_parts)
    return _Grads(held, held, step, held_parts, held_parts, step_parts)


def _communication(st: StageStatic, ov: Overheads) -> tuple[int, tuple[tuple[str, int], ...]]:
    return communication_buffers.calibrated(
        st.comm_bytes, st.comm_parts, ov.nccl_communicator_bytes
    )
