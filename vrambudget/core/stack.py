"""The software stack a budget is for: the framework and library versions a request names (or
the current releases), resolved into the memory behaviours the formulas follow, each with the
source it was read from.

A behaviour is a fact of one framework version's code: how ``generate`` grows its KV cache,
which logits a forward materializes, what the training loss keeps, when gradients are freed,
how the CUDA runtime loads kernels. The formulas read the resolved :class:`Stack`; the answer
lists every behaviour assumed (``Budget.stack``), so a caller on another version sees what to
check.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, cast

from .errors import InvalidWorkload
from .formulas.activations.training import RmsNorm
from .formulas.allocator_overhead import EXPANDABLE_FRACTIONS
from .formulas.cuda_context import (
    CUDA_CONTEXT_EAGER_CURRENT_BYTES,
    EAGER_LIBRARY_IMAGES_BYTES,
    KERNEL_IMAGES_INFERENCE_BYTES,
    KERNEL_IMAGES_TRAINING_BYTES,
)
from .memo import BoundedCache
from .result import StackBehaviour, StackUse
from .spec import GGUF_ENGINES, AdapterDType, LossImplementation, Software

__all__ = [
    "CURRENT",
    "DEFAULT_STACK",
    "HF_MODEL_FRAMEWORKS",
    "PINNED",
    "LigerLoss",
    "Stack",
    "resolve_stack",
    "serving_use",
    "upcast_rebound",
    "version_tuple",
]

CURRENT: dict[str, str] = {
    # The newest release of each on PyPI (the registry's index, 2026-11).
    "transformers": "5.23.0",
    "peft": "0.21.2",
    "trl": "1.16.0",
    "accelerate": "1.15.0",
    "bitsandbytes": "0.50.2",
    "torchtune": "0.6.1",
    "litgpt": "0.5.13",
    "deepspeed": "0.19.8",
    "unsloth": "2026.10.9",
    "axolotl": "0.21.0",
    "liger_kernel": "0.8.5",
    "vllm": "0.33.0",
    "sglang": "0.5.23",
    "diffusers": "0.42.1",
    "torch": "2.15.0",
}
"""Versions assumed where a request names none."""

Loss = LossImplementation


_LEADING = re.compile(r"[0-9]+")


@lru_cache(maxsize=512)
def version_tuple(v: str) -> tuple[int, ...]:
    """``"4.46.3+cu121"`` -> (4, 46, 3), ``"4.44rc1"`` -> (4, 44): each dot-separated part's
    leading ASCII digits, up to the first part without any."""
    out: list[int] = []
    for part in v.split("+")[0].split("."):
        m = _LEADING.match(part)
        if m is None:
            break
        out.append(int(m.group()))
        if m.end() < len(part):  # a pre-release tail ends the release number
            break
    return tuple(out)


@dataclass(frozen=True, slots=True)
class LigerLoss:
    """What a liger_kernel release's fused linear cross-entropy allocates in its forward, beside
    the hidden states' and a trainable head's gradients it saves for the backward."""

    chunks: Literal["fp32_copy", "scaled_copy", "aliased", "deleted"]
    """The chunks of logits live at once, per chunk element: ``fp32_copy`` (< 0.5: the previous
    chunk's logits and scaled copy, the current one's and its fp32 copy, 2e + 4),
    ``scaled_copy`` (0.5 - 0.5.9: three chunk tensors, 3e), ``aliased`` (0.5.10 - 0.8.2: the
    previous chunk still bound, 2e), ``deleted`` (0.8.3 on, e)."""
    upcast_16bit: bool
    """A 16-bit head gradient accumulates through a head-sized temporary in the compute dtype
    and its fp32 copy (0.6.2 - 0.8.2; 0.8.3 on only below compute capability 8, not counted)."""
    upcast_fp32: bool
    """An fp32 head gradient (fp32 weights under autocast) does the same: 0.6.2 - 0.8.0, and
    0.8.1 on with torch < 2.8 (``addmm(out_dtype=...)`` needs 2.8)."""


SDPA_NATIVE_GQA_TRANSFORMERS = (4, 54)
"""The first transformers release whose ``sdpa_attention_forward`` passes ``enable_gqa``."""
SDPA_NATIVE_GQA_TORCH = (2, 5)
"""The first torch release with ``enable_gqa`` in ``scaled_dot_product_attention``."""


@dataclass(frozen=True, slots=True, eq=False)
class Stack:
    """What the formulas need to know of the software, and the behaviours shown to the caller.
    Interned by :func:`resolve_stack` (one object per software), so it compares and hashes by
    identity: cheap as a cache key."""

    framework: str
    framework_version: str
    transformers_version: str | None
    """The transformers release whose model code runs (the framework's own, or
    ``libraries.transformers`` under FSDP, DeepSpeed, axolotl); None where the framework has its
    own model code."""
    torch_version: str
    loss: Loss
    loss_chunks: int
    """Chunks of the sequence the loss upcasts at a time (1: the whole sequence)."""
    loss_compiled: bool
    """The chunked loss's upcast and cross-entropy run compiled (torchtune ``compile_loss``):
    inductor saves the low-precision chunk and two fp32 statistics per token, not the fp32
    log-softmax."""
    prefill_logits: Literal["last", "all_fp32"]
    """``last``: generate's prefill computes the last position's logits only
    (``logits_to_keep``); ``all_fp32``: every position's logits, upcast to fp32 by the forward."""
    cache_concat: bool
    """``generate`` grows each layer's KV cache by ``torch.cat``: the old and the new tensor of
    one layer are live together."""
    cache_copy_all: bool
    """transformers < 4.42: ``generate`` passes the legacy tuple cache, converted to and from
    ``DynamicCache`` each step: the old cache of every layer stays live through the step."""
    loss_shift_copy: bool
    """transformers < 4.49: the loss shifts the fp32 logits with a contiguous copy
    (``shift_logits = logits[..., :-1, :].contiguous()``): one more fp32 tokens x vocab."""
    loop_holds_output: bool
    """The training loop keeps the model's output (its logits) until after the optimizer step
    (``software.loop_holds_output``)."""
    liger_loss: LigerLoss | None
    """Liger's fused linear cross-entropy and what its release allocates in the forward; None:
    another loss (or Unsloth's own fused loss)."""
    bnb_keeps_inputs: bool
    """bitsandbytes < 0.43.2: ``MatMul4Bit`` keeps each 4-bit layer's input on its autograd
    context (``ctx.tensors = (A, B)``), outside ``save_for_backward``: checkpointing cannot
    drop it."""
    untied_head: bool
    """The framework's model has its own LM head where the checkpoint ties it to the
    embedding (LitGPT)."""
    saved_fp16_to_fp32: bool
    """An fp16 ``modules_to_save`` copy is trained in fp32 (Unsloth: unsloth 2026.10.9
    ``models/llama.py`` ``_offload_frozen_module_for_training``, "Tesla T4 must use float32")."""
    qlora_head_quantized: bool
    """QLoRA quantizes the LM head with the layers (LitGPT: Fabric's BitsandbytesPrecision
    replaces every ``nn.Linear``)."""
    qlora_upcast: bool
    """QLoRA: the parameters left unquantized (embeddings, LM head, norms) are cast to fp32
    (PEFT's ``prepare_model_for_kbit_training``); false: they keep the weights' dtype."""
    kbit_init_upcast: bool
    """QLoRA: PEFT's ``prepare_model_for_kbit_training`` runs at start-up and casts the
    unquantized parameters to fp32 one by one (a parameter's 16-bit original and its fp32 copy
    are live together), whether or not they are cast back before training (TRL 0.9.6-0.24)."""
    rms_norm: RmsNorm
    """What the framework's RMSNorm keeps for backward (:data:`RmsNorm`)."""
    fused_swiglu: bool
    """A gated MLP's SiLU-and-product runs as Liger's fused kernel: it saves the gate and up
    projections' outputs only and writes their gradients into them in backward."""
    fused_qkv: bool
    """LitGPT's attention: one q/k/v projection split into views; SDPA keeps the whole output
    through V's view (as many K/V heads as query heads) or saves K and V repeated to every
    query head; LoRA on part of q, k, v keeps the zero-padded lora_B output."""
    math_mqa: bool
    """lit-gpt before PR #667 (2023-10-24; named ``0.1`` here, no release holds it): one K/V head
    is not repeated for training, so SDPA runs its math path and saves the probabilities."""
    keeps_previous_step: bool
    """The training loop keeps the last micro-batch's logits and loss (so its autograd graph)
    until the next forward and loss are computed (LitGPT's ``fit``), and bitsandbytes < 0.43.2
    keeps each 4-bit layer's input on that graph."""
    grads_kept: bool
    """``zero_grad`` zeroes gradients instead of freeing them (torch < 2.0): they stay through
    the next forward."""
    foreach_intermediates: int
    """State-sized intermediates torch's foreach AdamW holds at once in its step: 2 before
    torch 2.1 (``denom = torch._foreach_add(exp_avg_sq_sqrt, eps)`` out of place), 1 from 2.1
    (pytorch#104898)."""
    eager_modules: bool
    """CUDA_MODULE_LOADING=EAGER (or CUDA < 11.7): every kernel image loaded at context creation."""
    accumulate_unsharded: bool
    """Gradient accumulation under FSDP runs the micro-batches before the last one in
    ``no_sync``: each rank holds the whole, unsharded gradients until the last micro-batch's
    reduce-scatter (transformers' Trainer through accelerate, LitGPT through Fabric)."""
    deepspeed: bool
    """ZeRO runs under DeepSpeed (named as the framework or a library), else under FSDP: what
    of the sharding buffers is still allocated at the optimizer step."""
    zero_init: bool
    """DeepSpeed ZeRO-3 builds the model under ``zero.Init`` (else ``deepspeed.initialize``
    moves the whole model to each device before partitioning it)."""
    frozen_gradients: bool
    """FSDP1 with ``use_orig_params=True`` and each transformer block wrapped whole: a block's
    frozen weights share a FlatParameter with its LoRA adapters, and the gradient is
    allocated for the whole FlatParameter (LitGPT < 0.5.11)."""
    quantized_state_sharded: bool
    """QLoRA's quantization state is sharded with the weights under ZeRO-3 / FSDP (torchtune's
    torchao NF4); false: bitsandbytes keeps it whole on every rank (``_QSTATE_WHOLE``)."""
    quantized_outside_zero_init: bool
    """Under DeepSpeed ZeRO-3, transformers (>= :data:`QUANTIZED_OUTSIDE_ZERO_INIT_FROM`) builds
    a quantized model whole on every rank, not under ``zero.Init`` (``_ZERO3_QUANTIZED``)."""
    bnb_packed_via_host: bool
    """transformers 4.39 - 4.x sends bitsandbytes' packed 4-bit data to the host under ZeRO-3
    once quantized, until ``deepspeed.initialize`` moves it back; 5.x leaves it on the
    device."""
    nf4_init_requantize: bool
    """torchtune < 0.2 (torchao 0.1): QLoRA's model init quantizes every NF4 weight on the GPU
    three times with the unchunked ``to_nf4`` (:mod:`vrambudget.core.allocator.nf4_init`)."""
    expandable_segments: bool
    """The caching allocator runs with ``expandable_segments:True`` (axolotl >= 0.5.2 sets it
    with torch >= 2.2): the fragmentation fractions are
    :data:`~vrambudget.core.formulas.allocator_overhead.EXPANDABLE_FRACTIONS`."""
    adapters_cast: bool
    """PEFT 0.7 - 0.11 casts LoRA adapters to the base weight's dtype where it is floating point
    (a request's ``adapter_dtype`` left null then takes a 16-bit base's dtype; elsewhere fp32)."""
    trl_bnb_adapters: Literal["bf16", "sharded_base_dtype"] | None
    """What the named TRL's SFTTrainer does to the adapters of a bitsandbytes-loaded model
    (``is_loaded_in_4bit`` / ``_8bit``): ``bf16`` (0.26 on: every trainable parameter cast to
    bf16), ``sharded_base_dtype`` (0.9.6 - 0.25: ``autocast_adapter_dtype=False`` for sharded
    QLoRA, so its adapters take the 4-bit layer's dtype), None (no TRL named, one older than
    0.9.6, or a framework with its own trainer)."""
    behaviours: tuple[StackBehaviour, ...]
    named: bool
    """The request named the framework (else the current release of the default one)."""

    def adapter_dtype(
        self, requested: AdapterDType | None, weights: str, quantized: bool, bnb: bool = False
    ) -> AdapterDType:
        """LoRA adapters' dtype: the request's, else as the stack's PEFT (and the named TRL)
        leaves them over a base of ``weights`` (``quantized``: a 4-bit / 8-bit base whose
        integer storage PEFT does not cast to; ``bnb``: a bitsandbytes-loaded base, 4-bit or
        LLM.int8, sharded or not, which TRL's SFTTrainer checks)."""
        if requested is not None:
            return requested
        if bnb and self.trl_bnb_adapters == "bf16":
            return "bf16"
        sharded_qlora = bnb and not quantized  # its 4-bit storage in the model's dtype
        # TRL 0.9.6 - 0.25 call QLoRA sharded when its first Params4bit's data is on the host
        # or the meta device: FSDP's loading, and DeepSpeed's where transformers sends the
        # packed data to the host (4.39 - 4.x); transformers 5 leaves it on the device.
        trl_sharded = sharded_qlora and (not self.deepspeed or self.bnb_packed_via_host)
        cast_to_base = self.adapters_cast or (
            trl_sharded and self.trl_bnb_adapters == "sharded_base_dtype"
        )
        if cast_to_base and not quantized and weights in ("bf16", "fp16"):
            return cast("AdapterDType", weights)
        return "fp32"

    def use(self, kinds: frozenset[str], default_framework: str | None = None) -> StackUse:
        """What the answer shows for workloads of ``kinds`` (``inference``, ``training``,
        ``qlora``, ...): the behaviours that apply to them; ``default_framework`` names what
        runs them when the request named none (``diffusers`` for image generation)."""
        framework, version = self.framework, self.framework_version
        if default_framework is not None and not self.named:
            framework, version = default_framework, CURRENT.get(default_framework, "")
        return StackUse(
            framework=framework,
            framework_version=version,
            torch_version=self.torch_version,
            behaviours=tuple(b for b in self.behaviours if _APPLIES.get(b.name, kinds) & kinds),
        )

    @property
    def bnb_quantizes_experts(self) -> bool:
        """Whether bitsandbytes' 4-bit conversion reaches a mixture of experts' routed experts:
        it replaces ``nn.Linear`` modules (transformers 5.23.0 ``integrations/bitsandbytes.py``
        ``replace_with_bnb_linear``: ``type(module) is nn.Linear``; ``quantizer_bnb_4bit.py``
        ``param_needs_quantization``: a ``Linear4bit``'s weight), so the fused 3-D experts of
        transformers 5 stay in the load dtype (bitsandbytes-foundation/bitsandbytes#1849, open;
        the ``Experts4bit`` PRs #1965 / #1984 unmerged) -- and PEFT's
        ``prepare_model_for_kbit_training`` then casts them to fp32 with every other
        non-4-bit parameter (peft 0.21.2 ``utils/other.py`` lines 203-208). The same
        modelling-code fact as :attr:`lora_reaches_experts`."""
        return self.lora_reaches_experts

    @property
    def lora_reaches_experts(self) -> bool:
        """Whether LoRA ``target_modules`` reach a mixture of experts' routed experts: under
        transformers < 5 each expert is its own ``nn.Linear`` modules; transformers 5 keeps them
        as fused 3-D parameters (5.0.0 ``models/mixtral/modeling_mixtral.py`` ``MixtralExperts``:
        ``gate_up_proj = nn.Parameter(...)``, likewise every MoE family of 5.23), which PEFT
        adapts only through ``target_parameters`` (peft 0.21.2 ``helpers.py`` lines 401-402).
        Frameworks with their own model code (LitGPT, torchtune) build per-expert linears."""
        v = self.transformers_version
        return v is None or version_tuple(v) < (5,)

    @property
    def transformers_modules(self) -> bool:
        """Whether the model's layers are transformers' modules (its activation functions
        included): the transformers family of stacks and Unsloth, which patches attention, norms
        and gated MLPs but runs the rest of the transformers model; not LitGPT or torchtune."""
        return self.transformers_version is not None or self.framework == "unsloth"

    @property
    def sdpa_native_gqa(self) -> bool:
        """Whether transformers' SDPA attention passes grouped K/V heads to torch as they are
        (``enable_gqa``, when no mask is needed): from transformers 4.54 with torch 2.5
        (4.54.0 ``integrations/sdpa_attention.py`` ``use_gqa_in_sdpa``; 4.53.0 always
        ``repeat_kv``). False for frameworks with their own attention code (LitGPT, torchtune,
        Unsloth), which expand K/V themselves."""
        v = self.transformers_version
        return (
            v is not None
            and version_tuple(v) >= SDPA_NATIVE_GQA_TRANSFORMERS
            and version_tuple(self.torch_version) >= SDPA_NATIVE_GQA_TORCH
        )


_B = StackBehaviour

_CONCAT = _B(
    name="kv_cache_growth",
    assumed="generate grows each layer's KV cache by torch.cat: for one layer the old and the "
    "new cache are live together (one layer's keys and values at the full length on top of "
    "the cache)",
    source="transformers cache_utils.py DynamicLayer.update (5.23.0: lines 136-137; "
    "DynamicCache.update since 4.36; the legacy tuple cache before it concatenated too)",
)
_COPY_ALL = _B(
    name="kv_cache_growth",
    assumed="generate passes the legacy tuple cache, converted to and from DynamicCache each "
    "step: every layer's old cache stays live while the new one is built (two caches at the "
    "peak)",
    source="transformers 4.36-4.41 generation/utils.py (past_key_values tuples) and "
    "cache_utils.py DynamicCache.from_legacy_cache / to_legacy_cache; a single DynamicCache "
    "is passed from 4.42 (research/stack_behaviours.md section 1)",
)
_PREALLOCATED = _B(
    name="kv_cache_growth",
    assumed="the KV cache is preallocated (blocks or a static cache): no copy when it grows",
    source="vLLM / SGLang block pools; LitGPT kvcache DenseKVCache and torchtune "
    "modules/kv_cache.py KVCache (allocated at max length when generation starts)",
)
_LAST_LOGITS = _B(
    name="prefill_logits",
    assumed="generate's prefill computes the last position's logits only, copied to fp32 for "
    "sampling",
    source="transformers generation/utils.py _sample (logits_to_keep=1, since 4.45; "
    "next_token_logits .to(torch.float32))",
)
_ALL_LOGITS = _B(
    name="prefill_logits",
    assumed="the prefill forward returns every position's logits, upcast to fp32 by the model "
    "(logits = logits.float()): prompt x vocab x (compute bytes + 4)",
    source="transformers < 4.45 modeling_llama.py LlamaForCausalLM.forward (logits.float()); "
    "num_logits_to_keep arrived in 4.45",
)
_LOSSES: dict[Loss, StackBehaviour] = {
    "cross_entropy": _B(
        name="loss",
        assumed="the loss upcasts the whole sequence's logits to fp32: logits, fp32 copy and "
        "fp32 log-softmax live together, then the fp32 gradients in backward",
        source="transformers loss/loss_utils.py ForCausalLMLoss (logits.float()); torch "
        "cross_entropy = log_softmax + nll_loss",
    ),
    "cross_entropy_no_upcast": _B(
        name="loss",
        assumed="the loss runs on the logits in the compute dtype (no fp32 copy): the logits "
        "and the log-softmax cross-entropy saves, both in the compute dtype, then the loss's "
        "and log-softmax's input gradients in that dtype (the loop drops its logits before "
        "backward; one that keeps them holds one more logits tensor)",
        source="torch nn/functional.py cross_entropy (log_softmax + nll_loss in the input's "
        "dtype; autocast would upcast it, a model cast to bf16/fp16 without autocast does not), "
        "as hand-written loops call it (e.g. rasbt/LLMs-from-scratch ch05 calc_loss_batch: "
        "F.cross_entropy(logits.flatten(0, 1), target_batch.flatten()))",
    ),
    "chunked_cross_entropy": _B(
        name="loss",
        assumed="the loss upcasts the logits to fp32 one chunk of the sequence at a time (8 "
        "chunks): the low-precision logits stay, fp32 copies of one chunk",
        source="torchtune modules/loss/ce_chunked_output_loss.py CEWithChunkedOutputLoss "
        "(num_output_chunks=8), the configs' loss from torchtune 0.3.0 (0.2.1: "
        "torch.nn.CrossEntropyLoss)",
    ),
    "litgpt_chunked_cross_entropy": _B(
        name="loss",
        assumed="Fabric converts the model's output to fp32: the LM head's chunks in the compute "
        "dtype, then fp32 logits, which the training loop holds through the backward and until "
        "the next forward returns (the previous micro-batch's fp32 logits meet the new ones); "
        "cross-entropy per 128-token chunk saves an fp32 log-softmax, and the backward collects "
        "every chunk's fp32 logits gradient before the LM head's; a full fine-tune on more "
        "than one sequence reshapes the shifted logits into an fp32 copy, and its chunks' "
        "gradients are joined into a full-size one",
        source="litgpt 0.4.5 finetune/lora.py lines 304-307 (logits = model(input_ids, "
        "lm_head_chunk_size=128), bound in the loop body), utils.py line 279 "
        "chunked_cross_entropy (F.cross_entropy per chunk, no cast), finetune/full.py lines "
        "254-256; lightning 2.3.0 fabric/wrappers.py line 143 (precision.convert_output) and "
        "plugins/precision/half.py line 62 (to torch.get_default_dtype(), fp32); the same in "
        "litgpt 0.3.0, 0.5.3 and 0.5.13",
    ),
    "fused_linear_cross_entropy": _B(
        name="loss",
        assumed="the LM head and the loss run fused per chunk: the full logits are never "
        "materialized",
        source="liger_kernel ops/fused_linear_cross_entropy.py "
        "(LigerFusedLinearCrossEntropyFunction); Unsloth's fused loss",
    ),
}
_COMPILED_LOSS = _B(
    name="loss_compiled",
    assumed="torch.compile runs each chunk's upcast and cross-entropy as one inductor graph: it "
    "saves the low-precision chunk and an fp32 max and log-sum-exp per token, not the fp32 "
    "log-softmax; the backward writes each chunk's gradient in the compute dtype",
    source="torchtune 0.6.1 training/_compile.py compile_loss (compiles "
    "CEWithChunkedOutputLoss.compute_cross_entropy); torch 2.13 inductor, checked with "
    "saved_tensors_hooks on a compiled F.cross_entropy(x.float()) of a (512, 32000) bf16 "
    "chunk: saved bf16 (512, 32000), int64 labels, fp32 (512, 1) x 2 (research/"
    "stack_behaviours.md section 2b)",
)
_EAGER_COMPILE = _B(
    name="loss_compiled",
    assumed="torch.compile is named, but what a compiled region saves was read for torchtune's "
    "chunked loss only: this loss is budgeted as eager (the larger)",
    source="research/stack_behaviours.md section 2b",
)
_SHIFT_COPY = _B(
    name="loss_shift_copy",
    assumed="the loss shifts the fp32 logits with a contiguous copy before the log-softmax: "
    "one more fp32 tokens x vocab in the forward",
    source="transformers < 4.49 loss/loss_utils.py ForCausalLMLoss (shift_logits = "
    "logits[..., :-1, :].contiguous()); from 4.49 the labels are shifted instead "
    "(research/stack_behaviours.md section 2)",
)
_HEAD_FREED = _B(
    name="loss_head_freed",
    assumed="the model's forward upcasts the LM head's output in place of it (logits = "
    "logits.float()): the low-precision logits are freed before the loss, whose forward holds "
    "only the fp32 logits, their shifted copy and the log-softmax -- Llama, Gemma, Gemma 2, "
    "Qwen2 (MoE), Phi, Phi-3, Mixtral, Cohere, OLMo, Nemotron, Jamba and the other families "
    "whose forward rebinds it before 4.46, Starcoder2 before 4.47, Mistral and Granite before "
    "4.48; other families (GPT-2, GPT-NeoX, OPT, Falcon, GPT-Neo...) keep the head's output "
    "(the larger)",
    source="transformers 4.35.2 models/llama/modeling_llama.py lines 1052-1053, 4.44.0 lines "
    "1208-1209, 4.45.2 line 1214 (lm_head(...).float()); 4.46.0 loss/loss_utils.py "
    "ForCausalLMLoss upcasts a copy while modeling_llama.py (lm_head at line 1210) keeps the "
    "logits; 4.46.0 and 4.47.0 modeling_mistral.py (line 1090 in 4.47.0) and "
    "modeling_granite.py (line 1108) still rebind, 4.46.0 modeling_starcoder2.py too, 4.48.0 "
    "none of the three (grep over every 4.45.2 / 4.46.0 / 4.47.1 / 4.48.3 *ForCausalLM). "
    "Measured on the released code (CPU tensors, live storages over the forward and loss): "
    "12.3-12.5 bytes per token x vocabulary element with 4.35.2, 4.40.2 and 4.45.2, 14.3 "
    "with 4.46.0, 10.4 with 5.23.0 (research/loss_peaks.py; research/stack_behaviours.md "
    "section 2)",
)
_LOOP_HOLDS_OUTPUT = _B(
    name="loop_holds_output",
    assumed="the training loop keeps the model's output until after the optimizer step: its "
    "logits (fp32 where the model's forward rebound them, see loss_head_freed; else the "
    "compute dtype) stay beside the loss's backward tensors, the backward and the step",
    source="software.loop_holds_output; e.g. Answer.AI fsdp_qlora train.py (05ed9f2 lines "
    "872-925, the same loop since its first commit 152ed89): "
    "'output = model(...)', 'loss = output.loss', loss.backward(), optimizer.step(), then "
    "'output = None  # Delete the output so more memory frees up before the next forward pass'; "
    "measured on transformers' released code: 16.3 bytes per token x vocabulary element at the "
    "backward's start holding the output (4.45.2), 12.3 dropping it (research/loss_peaks.py)",
)
_LIGER_SOURCE = (
    "liger_kernel ops/fused_linear_cross_entropy.py fused_linear_cross_entropy_forward, read "
    "in 0.3.0, 0.4.2, 0.5.0-0.5.2, 0.5.10, 0.6.0-0.6.4, 0.7.0, 0.8.0-0.8.5: grad_input = "
    "zeros_like(_input), grad_weight = zeros_like(weight) when the head is trainable, both "
    "saved (ctx.save_for_backward) for the backward to hand on; chunk_size = "
    "next_power_of_2(cdiv(BT, cdiv(V, H))); the loop's names keep the previous chunk until "
    "0.8.3's 'del logits_chunk'; 0.3.0 line 75 logits_chunk.float() and 'grad_logits_chunk = "
    "logits_chunk * alpha' (to 0.5.2); torch.addmm(out=grad_weight) to 0.6.1; 'grad_weight += "
    "torch.mm(grad_logits_chunk.t(), _input_chunk).float()' from 0.6.2 (line 134), the only "
    "path to 0.8.0 (line 212); 0.8.1 addmm(out_dtype=torch.float32) into an fp32 gradient "
    "with torch >= 2.8 (_ADDMM_SUPPORTS_OUT_DTYPE); 0.8.3 addmm(out=grad_weight) for a 16-bit "
    "gradient on compute capability 8+ (0.8.5 lines 325-371)"
)
_LIGER_BEHAVIOUR = _B(
    name="fused_loss_gradients",
    assumed="Liger's fused loss computes the hidden states' gradient (tokens x hidden) and a "
    "trainable head's weight gradient in its forward and keeps them for the backward, a chunk "
    "of logits at a time (with the release's copies of it); where its release adds each "
    "chunk's head-gradient product through a head-sized temporary and its fp32 copy, that "
    "too (from 0.8.3 a 16-bit gradient accumulates in place on compute capability 8.0 and "
    "newer; the temporary older GPUs take is not counted)",
    source=_LIGER_SOURCE,
)
_BNB_INPUTS = _B(
    name="quantized_saved_tensors",
    assumed="bitsandbytes keeps each 4-bit layer's input on its autograd context (outside "
    "save_for_backward): without activation checkpointing the inputs of every quantized "
    "projection stay for the whole step, plus the dequantized weight scratch (a reentrant "
    "checkpointed forward records no context)",
    source="bitsandbytes < 0.43.2 autograd/_functions.py MatMul4Bit.forward (ctx.tensors = "
    "(A, B)); 0.43.2 keeps (None, B) ('fix QLoRA mem bug', 2024-07-16; "
    "research/stack_behaviours.md section 4)",
)
_GRADS_FREED = _B(
    name="gradient_lifetime",
    assumed="zero_grad frees gradients (set_to_none=True): they exist from the backward to the "
    "optimizer step only (with gradient accumulation, through the next micro-batch)",
    source="torch optim/optimizer.py zero_grad(set_to_none=True) default since torch 2.0; "
    "transformers Trainer model.zero_grad()",
)
_GRADS_KEPT = _B(
    name="gradient_lifetime",
    assumed="zero_grad zeroes gradients in place (set_to_none=False before torch 2.0): they "
    "stay allocated through the next forward",
    source="torch < 2.0 optim/optimizer.py zero_grad(set_to_none=False)",
)
_FOREACH_ONE = _B(
    name="optimizer_step_intermediates",
    assumed="torch's foreach AdamW step holds one state-sized intermediate per parameter "
    "(exp_avg_sq_sqrt, divided and offset in place)",
    source="torch >= 2.1 optim/adamw.py _multi_tensor_adamw (pytorch#104898, 'Minimize "
    "intermediates to save peak memory', 2023-07-10)",
)
_FOREACH_TWO = _B(
    name="optimizer_step_intermediates",
    assumed="torch's foreach AdamW step holds two state-sized intermediates per parameter at "
    "once: exp_avg_sq_sqrt and denom = torch._foreach_add(exp_avg_sq_sqrt, eps), out of place",
    source="torch < 2.1 optim/adamw.py _multi_tensor_adamw; changed by pytorch#104898 "
    "(2023-07-10, first released in 2.1.0; pytorch#97712 'Foreach optimizers use higher memory "
    "due to intermediates')",
)
_LAZY = _B(
    name="cuda_module_loading",
    assumed="CUDA loads kernel images lazily (CUDA_MODULE_LOADING=LAZY): the context holds "
    "only the kernels that have run; on NVIDIA the context line adds the images a workload's "
    f"ops load ({KERNEL_IMAGES_INFERENCE_BYTES:,} B inference, "
    f"{KERNEL_IMAGES_TRAINING_BYTES:,} B training, measured)",
    source="CUDA 11.7+ lazy loading; torch >= 1.13 sets CUDA_MODULE_LOADING=LAZY when the user "
    "has not (pytorch/pytorch#86509, '[1.13] Sets CUDA_MODULE_LOADING to LAZY when not set by "
    "the user': "
    "666.6 MB eager vs 287.0 MB lazy on one machine); the images: one H200, torch 2.11 cu130 "
    "(research/overhead_measurements.md)",
)
_EAGER = _B(
    name="cuda_module_loading",
    assumed="CUDA loads every kernel image of a library when the library loads (eager): the "
    "context is the eager measurement for the CUDA release (with no CUDA named, the torch "
    "version's +cuNNN tag, else CUDA 10 before torch 1.7 and 11 before 2.1), never less than "
    "the lazy context with its images; on NVIDIA the context line adds cuBLAS's whole image "
    f"set ({EAGER_LIBRARY_IMAGES_BYTES:,} B), loaded at the first GEMM, from CUDA 11 on "
    "(CUDA 10's measured contexts hold it)",
    source="pytorch/pytorch#55277 (721 MB GTX 1080 cu101) and #49877 (877 MiB RTX 2080 Ti "
    "cu101): CUDA 10; pytorch/pytorch#86509 (666.6 MB eager vs 287.0 MB lazy): CUDA 11, whose "
    "torch before 1.13 kept CUDA's default, eager; "
    f"{CUDA_CONTEXT_EAGER_CURRENT_BYTES:,} B on an H200, torch 2.11 cu130 (CUDA 12 on)",
)
_EXPANDABLE_WORDS = (
    f"{EXPANDABLE_FRACTIONS['training']:g} training, {EXPANDABLE_FRACTIONS['checkpointing']:g} "
    f"full checkpointing, {EXPANDABLE_FRACTIONS['sdpa']:g} inference, "
    f"{EXPANDABLE_FRACTIONS['eager']:g} eager attention"
)
_SEGMENTS = _B(
    name="allocator_segments",
    assumed="the caching allocator cuts fixed segments into blocks (torch's default "
    "PYTORCH_CUDA_ALLOC_CONF): blocks freed between allocations of other sizes stay cached, "
    "the fragmentation fractions of the replay grids",
    source="c10/cuda/CUDACachingAllocator.cpp (expandable_segments off by default); fractions: "
    "research/fragmentation_grids.py",
)
_EXPANDABLE_AXOLOTL = _B(
    name="allocator_segments",
    assumed="the caching allocator runs with expandable_segments:True (axolotl sets "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,roundup_power2_divisions:16 when it is "
    "unset, with torch 2.2 and later; PYTORCH_ALLOC_CONF=expandable_segments:True from torch "
    "2.9 in 0.19): segments grow page by page, the expandable fragmentation fractions "
    f"({_EXPANDABLE_WORDS}); the rounding of roundup_power2_divisions is not modelled",
    source="axolotl 0.5.2 train.py lines 56-63; 0.9.1 utils/__init__.py "
    "set_pytorch_cuda_alloc_conf lines 37-46, called by cli/main.py; 0.19.0 utils/__init__.py "
    "lines 81-97, called by cli/main.py cli(); fractions: the replay over "
    "research/fragmentation_grids.py, at least 0.48 x the fixed ones (the median of seven "
    "published A/Bs, research/overhead_measurements.md)",
)
_EXPANDABLE_NAMED = _B(
    name="allocator_segments",
    assumed="the caching allocator runs with expandable_segments:True, as the request says "
    "(software.expandable_segments): segments grow page by page, the expandable "
    f"fragmentation fractions ({_EXPANDABLE_WORDS})",
    source="c10/cuda/CUDACachingAllocator.cpp ExpandableSegment; fractions: the replay over "
    "research/fragmentation_grids.py, at least 0.48 x the fixed ones (the median of seven "
    "published A/Bs, research/overhead_measurements.md)",
)
_QLORA = _B(
    name="quantized_saved_tensors",
    assumed="bitsandbytes 4-bit layers save the input for backward and dequantize the weight "
    "into a compute-dtype scratch in forward and again in backward (the largest projection's "
    "scratch counted)",
    source="bitsandbytes autograd/_functions.py MatMul4Bit.forward/backward "
    "(dequantize_4bit(B, ...).to(A.dtype))",
)

_QSTATE_WHOLE = _B(
    name="quantization_state_sharding",
    assumed="bitsandbytes keeps each 4-bit layer's absmax and nested state in quant_state, an "
    "attribute of the Params4bit and not a parameter: FSDP's flat parameters (its all-gathers "
    "and CPU offload) and ZeRO-3's partitions never take it, so every rank keeps all of it on "
    "its GPU",
    source="transformers 4.40 modeling_utils.py lines 892-896 and 4.46 lines 999-1006 (only "
    "the quantized weight's .data leaves the GPU); Answer.AI fsdp_qlora train.py lines 236-244 "
    "('FSDP only syncs parameters and buffers, so the quant_state isn't copied')",
)
_QSTATE_SHARDED = _B(
    name="quantization_state_sharding",
    assumed="torchtune's torchao NF4 weights carry their scalers inside the tensor subclass: "
    "FSDP2 shards them with the data, and CPU offload moves them with the shards",
    source="torchao dtypes/nf4tensor.py (NF4Tensor's fsdp_pre_all_gather / "
    "fsdp_post_all_gather and its chunk / split of the quantized data and scalers)",
)
_QBUFFERS_WHOLE = _B(
    name="quantized_buffers_sharding",
    assumed="GPTQ's and AWQ's packed weights, scales and zero points are module buffers, not "
    "parameters: ZeRO-3 and FSDP shard, gather and offload parameters only, so every rank "
    "keeps the whole quantized base on its GPU (the unquantized embeddings, LM head and norms "
    "are sharded)",
    source="auto_gptq 0.7.1 nn_modules/qlinear/qlinear_cuda.py lines 51-77 and AutoAWQ 0.2.9 "
    "awq/modules/linear/gemm.py lines 135-167 (register_buffer); DeepSpeed 0.16.4 "
    "runtime/zero/parameter_offload.py lines 200-205 (module.parameters() only); torch "
    "fsdp/_init_utils.py ('[buffers] are not sharded')",
)
_NF4_INIT = _B(
    name="quantized_model_init",
    assumed="torchtune 0.1 builds one template layer on the GPU and deep-copies it per layer; "
    "each copy of an NF4 weight dequantizes and requantizes it, and loading the checkpoint "
    "quantizes every weight again on the GPU, each time through torchao 0.1's unchunked "
    "to_nf4 (a (numel, 16) bf16 difference and its absolute value): the allocator keeps "
    "those segments, replayed through the caching-allocator model as a model-init phase (one "
    "device, bf16, a dense decoder; not modelled for other layouts)",
    source="torchtune 0.1.1 utils/_register_nf4_dispatch_ops.py (clone: to_nf4(t."
    "get_original_weight()); copy_: to_nf4(src.to(dest.device))), modules/transformer.py "
    "_get_clones (copy.deepcopy, line 93), modules/peft/lora.py line 94; torchao 0.1 "
    "dtypes/nf4tensor.py quantize_tensor_nearest (lines 438-446; chunked from 0.2.0); the "
    "replay gives 9.135 GB reserved for Llama-2-7B where torchtune's QLoRA tutorial "
    "(commit 0914d5c) prints 'Peak memory reserved, model init 9.13 GB'",
)

_NO_SYNC = _B(
    name="gradient_sync",
    assumed="with gradient accumulation under FSDP (ZeRO-2/3), the micro-batches before the "
    "last run in no_sync: every rank keeps the whole, unsharded gradients from the first "
    "backward to the last micro-batch's reduce-scatter (zero_stage is read as FSDP: name "
    "libraries.deepspeed for DeepSpeed ZeRO, which keeps only its partition)",
    source="torch distributed/fsdp/fully_sharded_data_parallel.py FullyShardedDataParallel."
    "no_sync ('FSDP will accumulate the full model gradients (instead of gradient shards) "
    "until the eventual sync', 2.1.0 lines 1016-1027; FSDP2 set_requires_gradient_sync); "
    "transformers 5.23.0 trainer.py lines 1896-1907 (accelerator.no_sync unless "
    "sync_each_batch or DeepSpeed); LitGPT finetune/*.py fabric.no_backward_sync(model, "
    "enabled=is_accumulating) -> lightning fabric strategies/fsdp.py module.no_sync()",
)
_SYNC_EACH = _B(
    name="gradient_sync",
    assumed="gradients are reduced (reduce-scattered under ZeRO-2/3) after every micro-batch: "
    "each rank keeps only its shard between micro-batches",
    source="DeepSpeed ZeRO stage_1_and_2.py / stage3.py (partitioned gradient accumulation); "
    "torchtune 0.6.1 recipes (no no_sync); plain FSDP loops such as llama-recipes' "
    "train_utils.py (backward every micro-batch, no no_sync)",
)
_STEP_BUFFERS_FSDP = _B(
    name="sharding_buffers",
    assumed="FSDP gathers whole units: the root (embeddings, final norm, LM head), which it "
    "does not reshard after the forward, stays unsharded until the end of the backward, beside "
    "the block being computed and, in backward, the next block prefetched; it frees each "
    "block's parameters after its forward and backward and its unsharded gradient once "
    "reduce-scattered: none of them is allocated during the optimizer step (the NCCL "
    "communicators are)",
    source="torch 2.13 distributed/fsdp/_runtime_utils.py _post_forward_reshard (lines "
    "493-499: not the root's, 'immediately used for backward computation'), "
    "_post_backward_reshard (line 793), _reduce_grad lines 846-847 ('flat_param.grad = None'); "
    "FSDP2 _fully_shard/_fsdp_state.py _lazy_init (the root's post_forward_mesh_info = None); "
    "BackwardPrefetch.BACKWARD_PRE, the default prefetch",
)
_STEP_BUFFERS_DEEPSPEED = _B(
    name="sharding_buffers",
    assumed="DeepSpeed ZeRO-3 releases each module's gathered parameters after its forward and "
    "backward and keeps its gradient reduce bucket, allocated once, through the optimizer step; "
    "ZeRO-1/2 free theirs when the backward's reduction ends",
    source="DeepSpeed runtime/zero/partitioned_param_coordinator.py release_sub_module; "
    "runtime/zero/stage3.py (the reduce bucket allocated at init); runtime/zero/"
    "stage_1_and_2.py independent_gradient_partition_epilogue (_release_ipg_buffers); "
    "runtime/zero/config.py reduce_bucket_size 5e8",
)
_ZERO_INIT = _B(
    name="zero3_model_init",
    assumed="the model is built under deepspeed.zero.Init (as transformers' from_pretrained "
    "does with a ZeRO-3 config active): each parameter is partitioned as it is created, and "
    "no device ever holds the whole model",
    source="DeepSpeed 0.19.2 runtime/engine.py lines 1569-1585 (a model whose parameters "
    "carry ds_id is left where zero.Init put it); transformers integrations/deepspeed.py "
    "is_deepspeed_zero3_enabled (from_pretrained under zero.Init)",
)
QUANTIZED_OUTSIDE_ZERO_INIT_FROM = (4, 39)
"""The first transformers release that builds no quantized model under ``zero.Init`` (4.38.2
``modeling_utils.py`` line 3360 still did; 4.39.3 line 3389: ``if is_deepspeed_zero3_enabled()
and not is_quantized``)."""
TRL_READ_FROM = (0, 9, 6)
"""The oldest TRL release whose SFTTrainer's QLoRA preparation was read (0.9.6, 0.12.0,
0.17.0, 0.19.0 - 0.22.0, 0.24.0, 0.25.1, 0.26.0, 0.29.1, 1.0.0, 1.16.0): a named release
before it keeps the rules of a script that calls PEFT itself."""
_ZERO3_QUANTIZED = _B(
    name="zero3_quantized_model_init",
    assumed="transformers (4.39 on) builds no quantized model under deepspeed.zero.Init: each "
    "rank holds the whole quantized model on its own GPU (bitsandbytes 4-bit quantizes each "
    "weight on the device, 4.39 - 4.x then sends the packed data to the host until "
    "deepspeed.initialize moves the module back; GPTQ and AWQ load to the host and are moved "
    "whole), then ZeRO-3 partitions its parameters one at a time: a model-init phase of the "
    "whole quantized model and the 16-bit weight being quantized or the partition being made, "
    "replayed through the caching-allocator model (LLM.int8, fp8 and other schemes not "
    "modelled)",
    source="transformers 4.39.3 modeling_utils.py line 3389 and 4.46.3 line 4077 ('if "
    "is_deepspeed_zero3_enabled() and not is_quantized'), 4.46.3 lines 995-1006 (the packed "
    "data to the host under ZeRO-3), 5.23.0 get_init_context lines 3811-3825, quantizers/"
    "quantizer_bnb_4bit.py lines 94-111 (update_device_map: the current device) and "
    "quantizer_gptq.py lines 80-83 (the host); DeepSpeed 0.16.4 runtime/engine.py lines "
    "1236-1237 (module.to(device)), runtime/zero/parameter_offload.py lines 200-205; reported "
    "in huggingface/peft#2016 and huggingface/transformers#24395",
)
_ZERO3_WHOLE_MODEL = _B(
    name="zero3_model_init",
    assumed="the model is built outside deepspeed.zero.Init: deepspeed.initialize moves it "
    "whole to each device (module.to(device)), then converts its parameters one by one in "
    "module order, each broadcast and partitioned and its full tensor freed; the caching "
    "allocator keeps the segments until ZeRO-3 defragments the partitions "
    "(empty_cache): a model-init phase of the whole model in its compute dtype, replayed "
    "through the caching-allocator model",
    source="DeepSpeed 0.19.2 runtime/engine.py lines 1584-1585 (self.module.to(self."
    "device) unless zero.Init built the model), runtime/zero/partition_parameters.py "
    "_convert_to_zero_parameters / _zero_init_param (lines 1120-1135), runtime/zero/utils.py "
    "defragment (gc.collect(); empty_cache())",
)
_ADAPTERS_UNCAST = _B(
    name="lora_adapter_dtype",
    assumed="PEFT < 0.7: new LoRA adapters stay in nn.Linear's fp32 (where the request leaves "
    "adapter_dtype null)",
    source="peft 0.5.0 tuners/lora.py LoraLayer.update_layer (self.to(self.weight.device)); "
    "peft 0.6.0 - 0.6.2 tuners/lora/layer.py: lora.Linear.__init__ has no weight yet when "
    "update_layer runs, so its dtype cast applies only to a second adapter",
)
_ADAPTERS_CAST = _B(
    name="lora_adapter_dtype",
    assumed="PEFT 0.7 - 0.11: LoRA adapters cast to the base weight's dtype where it is floating "
    "point (a bf16 / fp16 base: 16-bit adapters and gradients; masters and optimizer state as "
    "mixed_precision says; a quantized base's integer storage: fp32), where the request leaves "
    "adapter_dtype null",
    source="peft 0.7.0 and 0.11.1 tuners/lora/layer.py LoraLayer.update_layer (weight = "
    "self.get_base_layer().weight; if weight.dtype.is_floating_point or "
    "weight.dtype.is_complex: self.to(weight.device, dtype=weight.dtype))",
)
_ADAPTERS_AUTOCAST = _B(
    name="lora_adapter_dtype",
    assumed="PEFT >= 0.12: LoRA adapters in fp32, get_peft_model's autocast_adapter_dtype "
    "upcasting 16-bit ones (where the request leaves adapter_dtype null)",
    source="peft 0.12.0 mapping.py get_peft_model(autocast_adapter_dtype=True); peft 0.21.2 the "
    "same",
)
_ADAPTERS_TRL_BF16 = _B(
    name="trl_quantized_adapter_dtype",
    assumed="TRL >= 0.26's SFTTrainer casts every trainable parameter of a bitsandbytes-loaded "
    "model (4-bit or LLM.int8, sharded or not) to bf16 after get_peft_model: the LoRA adapters "
    "are bf16, their gradients and optimizer state follow (where the request leaves "
    "adapter_dtype null; in recent releases DoRA's magnitude vectors stay fp32; not modelled: "
    "the bf16 cast of modules_to_save copies, counted in their module's dtype)",
    source="trl 0.26.0 trainer/sft_trainer.py lines 715-718 (is_loaded_in_4bit or "
    "is_loaded_in_8bit: param.data = param.data.to(torch.bfloat16) for requires_grad, whatever "
    "args.bf16 says); trl 1.16.0 lines 908-911 (lora_magnitude_vector excluded; not yet in "
    "1.0.0); transformers 5.23.0 "
    "quantizers/quantizer_bnb_4bit.py line 138, quantizer_bnb_8bit.py line 114",
)
_ADAPTERS_TRL_SHARDED = _B(
    name="trl_quantized_adapter_dtype",
    assumed="TRL 0.9.6 - 0.25's SFTTrainer passes autocast_adapter_dtype=False to get_peft_model "
    "for sharded QLoRA (its 4-bit parameters on the host or meta device at preparation: FSDP, "
    "and DeepSpeed ZeRO-3 under transformers 4.39 - 4.x), so the adapters take the 4-bit "
    "layer's dtype, taken as the model's (its storage dtype before PEFT 0.19, its compute "
    "dtype from 0.19: the same in the usual setup); unsharded ones stay fp32 (where the "
    "request leaves adapter_dtype null)",
    source="trl 0.21.0 trainer/sft_trainer.py lines 600-626 (is_sharded_qlora: the first "
    "Params4bit's data on cpu / meta; 0.9.6 lines 221-263, cpu only); trl 0.22.0 - 0.25.1 "
    "models/utils.py prepare_peft_model "
    "(0.25.1 lines 574-603); peft 0.21.2 tuners/tuners_utils.py lines 2149-2212 (a bnb "
    "Linear4bit's compute_dtype, from 0.19; the base weight's dtype before)",
)
_ADAPTERS_OWN = _B(
    name="lora_adapter_dtype",
    assumed="the framework's own LoRA (not PEFT's): adapters taken as fp32 where the request "
    "leaves adapter_dtype null (set it to the model's dtype for a bf16-true LitGPT or a "
    "torchtune recipe)",
    source="vrambudget default (the larger of the two readings)",
)

_FROZEN_GRADS = _B(
    name="fsdp_frozen_gradients",
    assumed="LoRA under FSDP1 with use_orig_params=True and each transformer block wrapped "
    "whole: a block's frozen weights share one FlatParameter with its adapters, so gradients "
    "are allocated for every block parameter, as if nothing were frozen",
    source="lightning 2.1.0 fabric/strategies/fsdp.py line 171 (use_orig_params defaults to "
    "True); LitGPT < 0.5.11 finetune/lora.py FSDPStrategy(auto_wrap_policy={Block}); torch "
    "2.1.0 FullyShardedDataParallel docstring ('the gradient memory usage will be higher than "
    "expected (namely, equivalent to not freezing those parameters)'); LitGPT 0.5.11 moved "
    "LoRA to FSDP2 fully_shard per trainable Linear (commit 5ac69b06)",
)

_KBIT_FP32 = _B(
    name="qlora_unquantized_dtype",
    assumed="the parameters QLoRA does not quantize (embeddings, LM head, norms) are cast to "
    "fp32, except in sharded QLoRA (ZeRO-3 / FSDP over several replicas), where every "
    "parameter keeps the model's dtype; the cast runs one parameter at a time at start-up, so "
    "the last large one's 16-bit original is live next to the fp32 copies (a model-init phase)",
    source="peft utils/other.py prepare_model_for_kbit_training (casts every fp16/bf16 "
    "parameter that is not 4-bit to fp32), called by most QLoRA scripts and by TRL's "
    "SFTTrainer (trl 0.21.0 sft_trainer.py lines 600-610: not for sharded QLoRA, whose "
    "FlatParameters need one dtype); name libraries.trl (0.9.6 on) for TRL's own rule",
)
_KBIT_UNSLOTH = _B(
    name="qlora_unquantized_dtype",
    assumed="the parameters QLoRA does not quantize (embeddings, LM head, norms) keep the "
    "model's dtype: Unsloth's own prepare_model_for_kbit_training casts only the LoRA "
    "adapters to fp32",
    source="unsloth 2024.8 models/_utils.py prepare_model_for_kbit_training lines 334-351 "
    "(lora_A / lora_B / lora_magnitude_vector to float32, every other parameter frozen as it "
    "is)",
)
_UNSLOTH_LORA = _B(
    name="lora_saved_tensors",
    assumed="with lora_dropout 0, Unsloth runs every q/k/v, o and gate/up/down group whose "
    "projections all carry adapters (and no bias) through its own autograd functions: each "
    "saves its input once in the compute dtype (no adapter-dtype copy), and the MLP's saves "
    "the gate and up outputs but not their activation or product (recomputed in backward); "
    "4-bit weights are dequantized by Unsloth itself, so bitsandbytes keeps no inputs for them",
    source="unsloth 2024.8 kernels/fast_lora.py LoRA_MLP.forward line 85 (save_for_backward "
    "adapters, X, e, g), LoRA_QKV.forward line 244, LoRA_W.forward line 363 (fast_dequantize, "
    "matmul_lora casts the adapters to X's dtype); models/llama.py patch_peft_model lines "
    "2060-2120 (which groups it patches)",
)
_KBIT_TRL = _B(
    name="qlora_unquantized_dtype",
    assumed="the parameters QLoRA does not quantize keep the model's dtype while training: "
    "TRL 0.9.6-0.24 upcast them to fp32 (PEFT's prepare_model_for_kbit_training) and, under "
    "bf16, cast the embeddings and LM head back (norms stay fp32); 0.25 upcasts the norms "
    "only; 0.26 on do neither. The fp32 copies 0.9.6-0.24 make at start-up are a model-init "
    "phase (every unquantized parameter in fp32 with the largest one's 16-bit original); not "
    "counted: the fp32 embeddings they keep when training in fp16",
    source="trl 0.22.0 trainer/sft_trainer.py line 694 -> models/utils.py prepare_peft_model "
    "lines 514-560 (prepare_model_for_kbit_training, then peft_module_casting_to_bf16 when "
    "args.bf16); trl 0.25.1 models/utils.py line 475 (its own prepare_model_for_kbit_training: "
    "norms only); trl 0.26.0 sft_trainer.py (no call); trl 0.21.0 sft_trainer.py lines "
    "600-628 (0.9.6 lines 255-272, 0.17.0 and 0.19.0 the same) called PEFT's directly, then "
    "peft_module_casting_to_bf16 under args.bf16; releases before 0.9.6 not read",
)
_KBIT_KEPT = _B(
    name="qlora_unquantized_dtype",
    assumed="the parameters QLoRA does not quantize (embeddings, the output projection, norms) "
    "keep the model's dtype; the frozen linear weights are torchao NF4",
    source="torchtune 0.6.1 models/llama3_1/_component_builders.py (FrozenNF4Linear for the "
    "attention and MLP projections with quantize_base; output_proj an nn.Linear: 'quantize_base "
    "is not applied to final output_proj currently'), the recipes build the model under "
    "training.set_default_dtype(self._dtype)",
)
_KBIT_KEPT_ADAPTED = _B(
    name="qlora_unquantized_dtype",
    assumed="the parameters QLoRA does not quantize keep the model's dtype; the estimate "
    "counts every attention and MLP projection as NF4, but torchtune before 0.3 quantizes only "
    "the projections LoRA adapts (the others stay bf16 nn.Linear): with LoRA on part of them "
    "the estimate is low by those projections' bf16 bytes",
    source="torchtune 0.1.1 and 0.2.1 models/llama2/_component_builders.py "
    "lora_llama2_self_attention / lora_llama2 (LoRALinear(quantize_base=...) for the adapted "
    "projections, nn.Linear otherwise); FrozenNF4Linear for the rest from 0.3.0",
)
_KBIT_LITGPT = _B(
    name="qlora_unquantized_dtype",
    assumed="every nn.Linear, the LM head included, becomes a 4-bit layer; embeddings and norms "
    "keep the model's dtype (no fp32 upcast)",
    source="lightning 2.1.0 fabric/plugins/precision/bitsandbytes.py _convert_layers (replaces "
    "each torch.nn.Linear not in ignore_modules; LitGPT finetune/lora.py passes none: "
    "BitsandbytesPrecision(quantize[4:], dtype))",
)
_KBIT_AXOLOTL = _B(
    name="qlora_unquantized_dtype",
    assumed="PEFT's prepare_model_for_kbit_training casts the parameters QLoRA does not "
    "quantize to fp32 at start-up, then axolotl casts the norms, embeddings and LM head back to "
    "the model's dtype for any LoRA or QLoRA not sharded by FSDP: they train in the model's "
    "dtype, and the fp32 copies of start-up are a model-init phase (none with "
    "embeddings_skip_upcast: name software.qlora_upcast false)",
    source="axolotl 0.5.2 utils/models.py lines 1069-1089 and 0.9.1 lines 1330-1346 "
    "(needs_fa2_dtype for every adapter -> convert_embedding_modules_dtype(dist_dtype="
    "cfg.torch_dtype) after prepare_model)",
)
_KBIT_NAMED_FP32 = _B(
    name="qlora_unquantized_dtype",
    assumed="the parameters QLoRA does not quantize (embeddings, LM head, norms) are cast to "
    "fp32, as the request says (software.qlora_upcast true); the fp32 embeddings make every "
    "layer's input fp32",
    source="peft utils/other.py prepare_model_for_kbit_training (casts every fp16/bf16 "
    "parameter that is not 4-bit to fp32)",
)
_KBIT_NAMED_KEPT = _B(
    name="qlora_unquantized_dtype",
    assumed="the embeddings and LM head keep the model's dtype, as the request says "
    "(software.qlora_upcast false); norms cast to fp32 are counted at the model's dtype (a "
    "few kilobytes per layer)",
    source="axolotl 0.9.1 monkeypatch/peft/utils.py PATCHED_PREPARE_CODE (with "
    "embeddings_skip_upcast, prepare_model_for_kbit_training skips embed_tokens and lm_head) "
    "and utils/models.py lines 1305-1315 (no fp32 conversion of the embedding modules for a "
    "4-bit model); trl 0.22.0 models/utils.py peft_module_casting_to_bf16",
)
_NORM_UPCAST = _B(
    name="rms_norm",
    assumed="RMSNorm casts its input to fp32 and autograd keeps that copy (4 bytes per "
    "element, whatever the compute dtype); a trained norm weight also keeps the normalized "
    "tensor in the compute dtype (in fp32 for Gemma's norms, which multiply by "
    "1 + weight.float(), and under autocast, whose residual stream is fp32)",
    source="transformers 5.23.0 models/llama/modeling_llama.py LlamaRMSNorm.forward lines "
    "61-66 (hidden_states.to(torch.float32); hidden_states.pow(2); self.weight * "
    "hidden_states.to(input_dtype)), copied by the Llama-derived models; LitGPT < 0.4.6 "
    "model.py RMSNorm.forward (0.4.5 lines 427-437); torchtune < 0.5 modules/rms_norm.py "
    "(0.4.0 lines 40-44); checked with saved_tensors_hooks (research/stack_behaviours.md "
    "section 2c)",
)
_NORM_UPCAST_FP32 = _B(
    name="rms_norm",
    assumed="RMSNorm casts its input to fp32 and autograd keeps that copy; a trained norm "
    "weight multiplies the fp32 normalized tensor, which is kept too (4 bytes per element)",
    source="LitGPT >= 0.4.6 model.py RMSNorm.forward ((x_normed * weight.float())"
    ".to(dtype=dtype); 0.5.3 lines 620-627); torchtune >= 0.5 modules/rms_norm.py "
    "(F.rms_norm(x.float(), weight=self.scale), 0.6.1 lines 38-43: torch's composite "
    "rms_norm keeps the fp32 input and the fp32 normalized tensor)",
)
_NORM_FUSED = _B(
    name="rms_norm",
    assumed="RMSNorm runs as one fused kernel that keeps its input in its own dtype and a "
    "per-token rstd",
    source="liger_kernel ops/rms_norm.py LigerRMSNormFunction.forward "
    "(ctx.save_for_backward(X, W, RSTD), 0.5.10 line 344); Unsloth's fast_rms_layernorm; "
    "torchtune with compile: True (0.6.1 training/_compile.py compile_model lines 50-57 "
    "compiles each TransformerSelfAttentionLayer), where inductor keeps the bf16 input and an "
    "fp32 rstd (torch 2.13, saved_tensors_hooks on a compiled LlamaRMSNorm; "
    "research/stack_behaviours.md section 2c); other compiled programs are budgeted as eager",
)
_SWIGLU_EAGER = _B(
    name="swiglu",
    assumed="a gated MLP's SiLU and product are two autograd ops: the gate and up projections' "
    "outputs and the SiLU output are saved; backward allocates the product's gradient and the "
    "gate's and up's",
    source="transformers models/llama/modeling_llama.py LlamaMLP.forward "
    "(down_proj(act_fn(gate_proj(x)) * up_proj(x))); torch SiLU backward saves its input, mul "
    "saves both operands; the trace tier's activation peak of the recomputed layer "
    "(vrambudget/core/formulas/activations/training.py recompute_backward_bytes)",
)
_SWIGLU_FUSED = _B(
    name="swiglu",
    assumed="a gated MLP's SiLU (GeGLU: GELU) and product run as one fused kernel that saves "
    "only the gate and up projections' outputs and writes their gradients into them in "
    "backward (no activation output saved, one gradient allocated), for the families Liger "
    "patches (Llama, Mistral, Qwen 2/3, Gemma 1-3, Phi-3, Granite, OLMo 2, GLM-4); others keep "
    "their eager MLP",
    source="liger_kernel ops/swiglu.py LigerSiLUMulFunction (0.5.10 lines 103-118: "
    "ctx.save_for_backward(a, b); backward returns swiglu_backward(a, b, dc), whose kernel "
    "overwrites a and b); applied by Liger's model patches (AutoLigerKernelForCausalLM, "
    "apply_liger_kernel_to_llama swiglu=True)",
)
LIGER_GLU_FAMILIES = frozenset(
    {
        "gemma",
        "gemma2",
        "gemma3",
        "gemma3_text",
        "glm4",
        "granite",
        "llama",
        "mistral",
        "mllama",
        "olmo2",
        "paligemma",
        "phi3",
        "qwen2",
        "qwen2_5_vl",
        "qwen2_vl",
        "qwen3",
    }
)
"""Dense families whose MLP Liger patches with its fused SwiGLU / GeGLU (liger_kernel 0.5.10
transformers/monkey_patch.py MODEL_TYPE_TO_APPLY_LIGER_FN, each apply_liger_kernel_to_* with
``swiglu`` or ``geglu`` True by default; GeGLU's kernel, ops/geglu.py, saves and overwrites
its two inputs the same way). Other families keep their eager MLP under Liger."""
_PREVIOUS_STEP = _B(
    name="previous_step_graph",
    assumed="the training loop keeps the last micro-batch's logits and loss, so its autograd "
    "graph lives until the next forward and loss are computed: with bitsandbytes < 0.43.2 every "
    "4-bit layer's input of the previous micro-batch (held on ctx.tensors, which the backward "
    "does not free) is live through the next forward (the previous fp32 logits, live until the "
    "new ones are assigned, stay within the forward's loss bytes)",
    source="LitGPT finetune/lora.py fit (0.4.5 lines 304-310: logits = model(input_ids, "
    "lm_head_chunk_size=128); loss = chunked_cross_entropy(logits, ...); fabric.backward(...); "
    "both names rebound only at the next iteration); lightning 2.3.0 fabric/wrappers.py line "
    "143 (precision.convert_output: the logits cast to the default dtype, fp32); bitsandbytes "
    "< 0.43.2 MatMul4Bit.forward ctx.tensors = (A, B) (research/stack_behaviours.md section 4)",
)
_UNTIED_HEAD = _B(
    name="lm_head_layout",
    assumed="the model keeps its own LM head: a checkpoint that ties it to the embedding gets a "
    "second vocab x hidden matrix (in generate too; trained in a full fine-tune)",
    source="LitGPT litgpt/model.py GPT (self.lm_head = nn.Linear(...)), "
    "scripts/convert_hf_checkpoint.py (state_dict['lm_head.weight'] = "
    "state_dict['transformer.wte.weight'] when the checkpoint has none); the finetune scripts "
    "refuse train.tie_embeddings",
)
_FUSED_QKV = _B(
    name="fused_qkv_attention",
    assumed="one projection computes q, k and v and the attention splits its output into views: "
    "with as many K/V heads as query heads, SDPA saves V, a view, and so keeps the whole qkv "
    "output (its q and k parts on top of the roped copies); with fewer, K and V are repeated to "
    "every query head before SDPA saves them; LoRA on some but not all of q, k, v keeps the "
    "adapted lora_B outputs (index_copy_'s source in zero_pad); lora_dropout drops the fused "
    "layer's input out once",
    source="litgpt 0.4.5 model.py CausalSelfAttention.forward (qkv.view/permute/split, "
    "k.expand and reshape for grouped queries, F.scaled_dot_product_attention(q, k, v)), "
    "lora.py LoRAQKVLinear.zero_pad (result.index_copy_(dim=-1, index=self.lora_ind, "
    "source=x)); 0.5.13 the same with qkv.split and repeat_interleave; checked with "
    "saved_tensors_hooks on litgpt 0.4.5's code (research/stack_behaviours.md section 2d)",
)
_MATH_MQA = _B(
    name="mqa_math_attention",
    assumed="with one K/V head, lit-gpt does not repeat K and V for training; SDPA's fused "
    "kernels need as many K/V heads as query heads, so its math path runs and saves the "
    "attention probabilities (batch x heads x sequence^2 x e per layer), the scaled q and K/V "
    "broadcast to every head",
    source="lit-gpt commit 29de2828 lit_gpt/model.py line 208 ('if self.config.n_query_groups "
    "!= 1:  # doing this would require a full kv cache with MQA'); changed by 50b1974b "
    "(PR #667, 2023-10-24: 'training: flash attention requires it'), before litgpt 0.2.0; "
    "torch aten _scaled_dot_product_attention_math",
)

_APPLIES: dict[str, frozenset[str]] = {
    "kv_cache_growth": frozenset({"inference"}),
    "prefill_logits": frozenset({"inference"}),
    "loss": frozenset({"training"}),
    "model_code": frozenset({"training", "inference"}),
    "loss_shift_copy": frozenset({"training"}),
    "loss_head_freed": frozenset({"training"}),
    "loop_holds_output": frozenset({"training"}),
    "fused_loss_gradients": frozenset({"training"}),
    "loss_compiled": frozenset({"training"}),
    "gradient_lifetime": frozenset({"training"}),
    "optimizer_step_intermediates": frozenset({"training"}),
    "quantized_saved_tensors": frozenset({"qlora"}),
    "lora_saved_tensors": frozenset({"lora"}),
    "lora_adapter_dtype": frozenset({"lora", "qlora"}),
    "trl_quantized_adapter_dtype": frozenset({"lora_bnb_base"}),
    "quantized_model_init": frozenset({"qlora"}),
    "qlora_unquantized_dtype": frozenset({"qlora"}),
    "lm_head_layout": frozenset({"training", "inference"}),
    "rms_norm": frozenset({"training"}),
    "swiglu": frozenset({"training"}),
    "fused_qkv_attention": frozenset({"training"}),
    "mqa_math_attention": frozenset({"training"}),
    "previous_step_graph": frozenset({"qlora"}),
    "gradient_sync": frozenset({"sharded_data_parallel"}),
    "sharding_buffers": frozenset({"sharded_data_parallel"}),
    "zero3_model_init": frozenset({"unquantized_zero3_data_parallel"}),
    "zero3_quantized_model_init": frozenset({"quantized_zero3_data_parallel"}),
    "quantization_state_sharding": frozenset({"qlora_zero3_data_parallel"}),
    "quantized_buffers_sharding": frozenset({"buffer_quantized_zero3_data_parallel"}),
    "fsdp_frozen_gradients": frozenset({"lora_data_parallel"}),
}
"""The workload kinds a behaviour applies to (absent: every kind)."""

# Libraries a framework release pins (its wheel's Requires-Dist), used where the request names
# no version of the library: (first release without the pin, pinned version).
PINNED: dict[str, dict[str, tuple[tuple[int, ...], str]]] = {
    # litgpt 0.3.x-0.5.4 METADATA: "Requires-Dist: bitsandbytes==0.42.0; extra == 'all'";
    # 0.5.5 moved to bitsandbytes>=0.44.0,<0.44.2.
    "litgpt": {"bitsandbytes": ((0, 5, 5), "0.42.0")},
}

_DEFAULT_LOSS: dict[str, Loss] = {
    "torchtune": "chunked_cross_entropy",
    "litgpt": "litgpt_chunked_cross_entropy",
    "unsloth": "fused_linear_cross_entropy",
}

_CACHE: BoundedCache[Software | None, Stack] = BoundedCache(1024)


def resolve_stack(software: Software | None) -> Stack:
    """The stack of a request's software: named versions, or the current releases (of
    transformers where no framework is named; serving and image answers name their engine and
    diffusers themselves, :func:`serving_use` and :meth:`Stack.use`)."""
    return _CACHE.get_or(software, lambda: _resolve(software))


def _resolve(software: Software | None) -> Stack:
    sw = software or Software()
    framework = sw.framework or "transformers"
    version = sw.framework_version or CURRENT.get(framework, "")
    torch_v = sw.torch_version or CURRENT["torch"]
    behaviours: list[StackBehaviour] = []
    hf = _transformers_release(sw, framework, version)
    if hf is not None and framework != "transformers":
        behaviours.append(_model_code(framework, hf))
    tf = version_tuple(hf) if hf is not None else (99,)
    # vLLM and SGLang allocate a block pool; LitGPT (DenseKVCache) and torchtune (KVCache)
    # preallocate the whole cache when generation starts.
    preallocated = framework in ("vllm", "sglang", "litgpt", "torchtune")
    concat = not preallocated
    copy_all = concat and tf < (4, 42)
    behaviours.append(_COPY_ALL if copy_all else _CONCAT if concat else _PREALLOCATED)
    all_logits = framework == "transformers" and tf < (4, 45)
    behaviours.append(_ALL_LOGITS if all_logits else _LAST_LOGITS)
    default_loss = _DEFAULT_LOSS.get(framework, "cross_entropy")
    if framework == "torchtune" and version_tuple(version) < (0, 3):
        # torchtune's configs took CEWithChunkedOutputLoss in 0.3.0 (0.2.1's
        # llama3_1/8B_lora_single_device.yaml: torch.nn.CrossEntropyLoss).
        default_loss = "cross_entropy"
    loss: Loss = sw.loss or (
        "fused_linear_cross_entropy" if sw.libraries.liger_kernel is not None else default_loss
    )
    behaviours.append(_LOSSES[loss])
    loss_compiled = sw.torch_compile and loss == "chunked_cross_entropy"
    if sw.torch_compile and loss != "fused_linear_cross_entropy":
        behaviours.append(_COMPILED_LOSS if loss_compiled else _EAGER_COMPILE)
    shift_copy = loss == "cross_entropy" and tf < (4, 49)
    if shift_copy:
        behaviours.append(_SHIFT_COPY)
    # listed while any family's forward still rebinds the upcast (upcast_rebound is per family)
    head_freed = loss == "cross_entropy" and tf < max(_UPCAST_REBOUND_UNTIL.values())
    if head_freed:
        behaviours.append(_HEAD_FREED)
    holds_output = sw.loop_holds_output and loss in ("cross_entropy", "cross_entropy_no_upcast")
    if holds_output:
        behaviours.append(_LOOP_HOLDS_OUTPUT)
    liger_loss = _liger_loss(loss, framework, sw, torch_v)
    if liger_loss is not None:
        behaviours.append(_LIGER_BEHAVIOUR)
    grads_kept = version_tuple(torch_v) < (2, 0)
    behaviours.append(_GRADS_KEPT if grads_kept else _GRADS_FREED)
    foreach_intermediates = 2 if version_tuple(torch_v) < (2, 1) else 1
    behaviours.append(_FOREACH_TWO if foreach_intermediates == 2 else _FOREACH_ONE)
    # Lazy loading needs CUDA 11.7 and an opt-in that torch makes from 1.13 on (pytorch#86509
    # sets CUDA_MODULE_LOADING=LAZY when unset); before, the CUDA 11 runtime's default was
    # eager (lazy became the driver's default with CUDA 12.2, pytorch#152695).
    eager = sw.cuda_module_loading == "eager" or (
        sw.cuda_module_loading is None
        and (
            (sw.cuda_version is not None and version_tuple(sw.cuda_version) < (11, 7))
            or (sw.rocm_version is None and version_tuple(torch_v) < (1, 13))
        )
    )
    behaviours.append(_EAGER if eager else _LAZY)
    # transformers' Trainer (axolotl rides on it) and LitGPT accumulate under no_sync; DeepSpeed
    # named as the framework or a library reduces every micro-batch into its partitions.
    no_sync = framework in ("transformers", "axolotl", "litgpt") and sw.libraries.deepspeed is None
    behaviours.append(_NO_SYNC if no_sync else _SYNC_EACH)
    deepspeed = framework == "deepspeed" or sw.libraries.deepspeed is not None
    behaviours.append(_STEP_BUFFERS_DEEPSPEED if deepspeed else _STEP_BUFFERS_FSDP)
    if sw.zero_init is not None and not deepspeed:
        raise InvalidWorkload(
            "software.zero_init",
            "zero_init is DeepSpeed's zero.Init: it needs framework 'deepspeed' or "
            "libraries.deepspeed",
        )
    zero_init = sw.zero_init is not False
    quantized_whole = (
        deepspeed and hf is not None and version_tuple(hf) >= QUANTIZED_OUTSIDE_ZERO_INIT_FROM
    )
    if deepspeed:
        behaviours.append(_ZERO_INIT if zero_init else _ZERO3_WHOLE_MODEL)
        if quantized_whole:
            behaviours.append(_ZERO3_QUANTIZED)
    frozen_grads = framework == "litgpt" and version_tuple(version) < (0, 5, 11)
    if frozen_grads:
        behaviours.append(_FROZEN_GRADS)
    nf4_init = framework == "torchtune" and version_tuple(version) < (0, 2)
    if nf4_init:
        behaviours.append(_NF4_INIT)
    litgpt = framework == "litgpt"
    trl = sw.libraries.trl
    # TRL 0.9.6-0.24 run PEFT's prepare_model_for_kbit_training and then cast the embeddings
    # and LM head back to bf16 (0.9.6 sft_trainer.py line 272, 0.21.0 line 628, 0.22
    # prepare_peft_model); 0.25 upcasts the norms only, 0.26 nothing. Older ones not read.
    trl_v = version_tuple(trl) if trl is not None else (0,)  # (0,): none named
    trl_read = trl_v >= TRL_READ_FROM
    trl_cast_back = trl_read and trl_v < (0, 25)
    if sw.qlora_upcast is not None:
        qlora_upcast = kbit_init_upcast = sw.qlora_upcast
        behaviours.append(_KBIT_NAMED_FP32 if qlora_upcast else _KBIT_NAMED_KEPT)
    else:
        # axolotl casts them back to the model's dtype after PEFT's upcast, as TRL 0.9.6-0.24 do.
        qlora_upcast = framework not in ("torchtune", "litgpt", "unsloth", "axolotl") and not (
            trl_read
        )
        kbit_init_upcast = qlora_upcast or trl_cast_back or framework == "axolotl"
        behaviours.append(_qlora_dtype_behaviour(framework, version, qlora_upcast))
    peft = version_tuple(sw.libraries.peft or CURRENT["peft"])
    own_lora = framework in ("litgpt", "torchtune")
    adapters_cast = not own_lora and (0, 7) <= peft < (0, 12)
    behaviours.append(
        _ADAPTERS_OWN
        if own_lora
        else _ADAPTERS_CAST
        if adapters_cast
        else _ADAPTERS_UNCAST
        if peft < (0, 7)
        else _ADAPTERS_AUTOCAST
    )
    trl_bnb_adapters: Literal["bf16", "sharded_base_dtype"] | None = None
    # TRL's SFTTrainer's own rule; axolotl trains through transformers' Trainer, Unsloth
    # through its own patched trainer, LitGPT and torchtune through their own LoRA.
    sft_trainer = framework not in ("axolotl", "unsloth", "litgpt", "torchtune")
    if trl_read and sft_trainer:
        trl_bnb_adapters = "bf16" if trl_v >= (0, 26) else "sharded_base_dtype"
        behaviours.append(
            _ADAPTERS_TRL_BF16 if trl_bnb_adapters == "bf16" else _ADAPTERS_TRL_SHARDED
        )
    if framework == "unsloth":
        behaviours.append(_UNSLOTH_LORA)
    if litgpt:
        behaviours.append(_UNTIED_HEAD)
        behaviours.append(_FUSED_QKV)
        if version_tuple(version) < (0, 2):
            behaviours.append(_MATH_MQA)
    rms_norm = _rms_norm(sw, framework, version)
    behaviours.append(
        {"upcast": _NORM_UPCAST, "upcast_fp32_normed": _NORM_UPCAST_FP32, "fused": _NORM_FUSED}[
            rms_norm
        ]
    )
    fused_swiglu = sw.libraries.liger_kernel is not None
    behaviours.append(_SWIGLU_FUSED if fused_swiglu else _SWIGLU_EAGER)
    # axolotl sets expandable segments when the variable is unset (0.5.2 train.py; since 0.9 the
    # CLI), from torch 2.2 on.
    axolotl_expandable = (
        framework == "axolotl"
        and version_tuple(version) >= (0, 5, 2)
        and version_tuple(torch_v) >= (2, 2)
    )
    expandable = (
        sw.expandable_segments if sw.expandable_segments is not None else axolotl_expandable
    )
    behaviours.append(
        _SEGMENTS
        if not expandable
        else _EXPANDABLE_NAMED
        if sw.expandable_segments
        else _EXPANDABLE_AXOLOTL
    )
    bnb = sw.libraries.bitsandbytes or _pinned(framework, version, "bitsandbytes")
    bnb_inputs = version_tuple(bnb) < (0, 43, 2)
    behaviours.append(_BNB_INPUTS if bnb_inputs else _QLORA)
    behaviours.append(_QSTATE_SHARDED if framework == "torchtune" else _QSTATE_WHOLE)
    behaviours.append(_QBUFFERS_WHOLE)
    if litgpt and bnb_inputs:
        behaviours.append(_PREVIOUS_STEP)
    return Stack(
        framework=framework,
        framework_version=version,
        transformers_version=hf,
        torch_version=torch_v,
        loss=loss,
        loss_chunks=8 if loss == "chunked_cross_entropy" else 1,
        loss_compiled=loss_compiled,
        prefill_logits="all_fp32" if all_logits else "last",
        cache_concat=concat,
        cache_copy_all=copy_all,
        loss_shift_copy=shift_copy,
        loop_holds_output=holds_output,
        liger_loss=liger_loss,
        bnb_keeps_inputs=bnb_inputs,
        untied_head=litgpt,
        saved_fp16_to_fp32=framework == "unsloth",
        qlora_head_quantized=litgpt,
        qlora_upcast=qlora_upcast,
        kbit_init_upcast=kbit_init_upcast,
        rms_norm=rms_norm,
        fused_swiglu=fused_swiglu,
        fused_qkv=litgpt,
        math_mqa=litgpt and version_tuple(version) < (0, 2),
        keeps_previous_step=litgpt and bnb_inputs,
        grads_kept=grads_kept,
        foreach_intermediates=foreach_intermediates,
        eager_modules=eager,
        accumulate_unsharded=no_sync,
        deepspeed=deepspeed,
        zero_init=zero_init,
        frozen_gradients=frozen_grads,
        quantized_state_sharded=framework == "torchtune",
        quantized_outside_zero_init=quantized_whole,
        bnb_packed_via_host=quantized_whole and hf is not None and version_tuple(hf) < (5,),
        nf4_init_requantize=nf4_init,
        expandable_segments=expandable,
        adapters_cast=adapters_cast,
        trl_bnb_adapters=trl_bnb_adapters,
        behaviours=tuple(behaviours),
        named=sw.framework is not None,
    )


def serving_use(
    engine: str,
    engine_version: str,
    software: Software | None,
    accounting: StackBehaviour,
    pinned_torch: str | None = None,
    extra: tuple[StackBehaviour, ...] = (),
) -> StackUse:
    """The stack of an ``llm_serving`` answer: the engine release its accounting follows
    (``accounting``: the engine's own, in its words) and the torch release: the request's, else
    the one the release pins (``pinned_torch``), else the current one; none (``""``) for
    llama.cpp and Ollama, which run on ggml."""
    torch_v = software.torch_version if software else None
    if torch_v is None:
        torch_v = "" if engine in GGUF_ENGINES else pinned_torch or CURRENT["torch"]
    return StackUse(
        framework=engine,
        framework_version=engine_version,
        torch_version=torch_v,
        behaviours=(_PREALLOCATED, accounting, *extra),
    )


HF_MODEL_FRAMEWORKS = frozenset({"fsdp", "deepspeed", "axolotl"})
"""Frameworks whose loops run transformers' model classes, and so its loss: their releases say
nothing of the modelling code's, which is ``libraries.transformers``."""


def _transformers_release(sw: Software, framework: str, version: str) -> str | None:
    """The transformers release whose model code runs, or None where the framework has its own
    (LitGPT, torchtune, the engines)."""
    if framework == "transformers":
        return version
    if framework in HF_MODEL_FRAMEWORKS:
        return sw.libraries.transformers or CURRENT["transformers"]
    return None


def _model_code(framework: str, release: str) -> StackBehaviour:
    return _B(
        name="model_code",
        assumed=f"{framework} runs transformers {release}'s model classes: their forward "
        "computes the loss from the labels, so that release's loss rules apply",
        source=f"the {framework} training loop calls the transformers model with labels "
        "(modeling_*.py ForCausalLM.forward -> loss_function / CrossEntropyLoss); name "
        "libraries.transformers for another release",
    )


def _qlora_dtype_behaviour(framework: str, version: str, upcast: bool) -> StackBehaviour:
    """What the stack does with the parameters QLoRA leaves unquantized (each rule's source in
    its behaviour)."""
    if framework == "litgpt":
        return _KBIT_LITGPT
    if framework == "torchtune":
        return _KBIT_KEPT_ADAPTED if version_tuple(version) < (0, 3) else _KBIT_KEPT
    if framework == "unsloth":
        return _KBIT_UNSLOTH
    if framework == "axolotl":
        return _KBIT_AXOLOTL
    return _KBIT_FP32 if upcast else _KBIT_TRL


def _rms_norm(sw: Software, framework: str, version: str) -> RmsNorm:
    """The framework's RMSNorm (each rule's source in its behaviour)."""
    fused = sw.norm == "fused" or (
        sw.norm is None
        and (
            framework == "unsloth"
            or sw.libraries.liger_kernel is not None
            or (sw.torch_compile and framework == "torchtune")
        )
    )
    if fused:
        return "fused"
    v = version_tuple(version)
    if (framework == "litgpt" and v >= (0, 4, 6)) or (framework == "torchtune" and v >= (0, 5)):
        return "upcast_fp32_normed"
    return "upcast"


_UPCAST_REBOUND_UNTIL: dict[str, tuple[int, int]] = {
    **dict.fromkeys(
        (
            "cohere",
            "falcon_mamba",
            "gemma",
            "gemma2",
            "granitemoe",
            "idefics2",
            "jamba",
            "jetmoe",
            "llama",
            "mamba",
            "mamba2",
            "mixtral",
            "mllama",
            "nemotron",
            "olmo",
            "olmoe",
            "paligemma",
            "phi",
            "phi3",
            "qwen2",
            "qwen2_moe",
            "recurrent_gemma",
        ),
        (4, 46),
    ),
    "starcoder2": (4, 47),
    "mistral": (4, 48),
    "granite": (4, 48),
}
"""The first transformers release whose forward no longer rebinds ``logits = logits.float()``,
by ``model_type``: the *ForCausalLM files of 4.45.2 that rebind it, and those still doing it in
4.46.0 and 4.47.x (Mistral, Granite; Starcoder2 in 4.46.0 only). Families still rebinding in
4.48.3 (GraniteMoE, JetMoE, Mamba...) are taken to stop at 4.46, the larger budget."""


def upcast_rebound(stack: Stack, model_type: str) -> bool:
    """The model's own forward frees the LM head's low-precision output at the upcast (the
    ``loss_head_freed`` behaviour) for this family and the stack's transformers release."""
    until = _UPCAST_REBOUND_UNTIL.get(model_type)
    return (
        until is not None
        and stack.loss == "cross_entropy"
        and stack.transformers_version is not None
        and version_tuple(stack.transformers_version) < until
    )


def _liger_loss(loss: str, framework: str, sw: Software, torch_v: str) -> LigerLoss | None:
    """What the named liger_kernel release's fused loss allocates (the current release where
    the fused loss is named without it); None for another loss or Unsloth's own."""
    if loss != "fused_linear_cross_entropy" or (
        framework == "unsloth" and sw.libraries.liger_kernel is None
    ):
        return None
    v = version_tuple(sw.libraries.liger_kernel or CURRENT["liger_kernel"])
    chunks: Literal["fp32_copy", "scaled_copy", "aliased", "deleted"] = (
        "fp32_copy"
        if v < (0, 5)
        else "scaled_copy"
        if v < (0, 5, 10)
        else "aliased"
        if v < (0, 8, 3)
        else "deleted"
    )
    legacy = v >= (0, 6, 2)
    out_dtype = v >= (0, 8, 1) and version_tuple(torch_v) >= (2, 8)
    return LigerLoss(
        chunks=chunks,
        upcast_16bit=legacy and v < (0, 8, 3),
        upcast_fp32=legacy and not out_dtype,
    )


def _pinned(framework: str, version: str, library: str) -> str:
    """The version of ``library`` a framework release installs: its pin, or the current."""
    pin = PINNED.get(framework, {}).get(library)
    if pin is not None and version_tuple(version) < pin[0]:
        return pin[1]
    return CURRENT[library]


DEFAULT_STACK = resolve_stack(None)
