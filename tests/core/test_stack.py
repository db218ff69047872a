"""The software stack as an input: each behaviour switched by the version that introduced it,
its bytes against a hand computation, and the answer's list of what it assumed."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from tests.support.workloads import LLAMA_PROJECTIONS
from vrambudget.core.components import Component
from vrambudget.core.estimate import estimate
from vrambudget.core.formulas.cuda_context import wheel_cuda
from vrambudget.core.formulas.logits import (
    LOOP_HELD_PART,
    fused_loss_parts,
    training_backward_parts,
    training_forward_parts,
)
from vrambudget.core.spec import BudgetRequest, Software
from vrambudget.core.stack import CURRENT, resolve_stack, upcast_rebound, version_tuple

C = Component
LLAMA31 = {"source": "preset", "id": "llama-3.1-8b"}


def _budget(workload: dict[str, Any], software: dict[str, Any] | None = None, **extra: Any):
    body: dict[str, Any] = {"workloads": [workload], "headroom": {"fraction": 0.0}, **extra}
    if software is not None:
        body["software"] = software
    r = msgspec.convert(body, BudgetRequest)
    return estimate(r.workloads, r.device, r.headroom, software=r.software)


def _phases(b) -> dict[str, int]:
    return {p.name: p.total_bytes for p in b.devices[0].phases}


def _lines(b) -> dict[Component, int]:
    return {line.component: line.bytes for line in b.devices[0].lines}


INFER = {
    "kind": "inference",
    "model": LLAMA31,
    "batch_size": 4,
    "prompt_tokens": 4096,
    "generated_tokens": 256,
}


def test_versions_compare_numerically() -> None:
    assert version_tuple("4.46.3+cu121") == (4, 46, 3)
    assert version_tuple("0.6.5.dev12") == (0, 6, 5)
    assert version_tuple("4.9.0") < version_tuple("4.45.0")
    assert version_tuple("4.44rc1") == (4, 44)  # not (4, 441)
    assert version_tuple("2.\u00b2") == (2,)  # a superscript digit is no digit here


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("torch_version", "2.\u00b2"),
        ("torch_version", "v2.4.0"),
        ("torch_version", "nightly"),
        ("cuda_version", "cu121"),
        ("driver_version", "r550"),
    ],
)
def test_a_version_that_is_not_one_is_refused_naming_the_field(field: str, value: str) -> None:
    with pytest.raises(msgspec.ValidationError) as e:
        msgspec.convert({field: value}, Software)
    assert field in str(e.value)


def test_defaults_are_the_current_releases() -> None:
    s = resolve_stack(None)
    assert (s.framework, s.framework_version, s.torch_version) == (
        "transformers",
        CURRENT["transformers"],
        CURRENT["torch"],
    )
    assert (s.loss, s.prefill_logits, s.cache_concat, s.grads_kept, s.eager_modules) == (
        "cross_entropy",
        "last",
        True,
        False,
        False,
    )
    assert not s.named


def test_generate_cache_growth_is_one_layer_of_kv_at_the_full_length() -> None:
    """transformers' torch.cat against a preallocated pool: the decode phase differs by one
    layer's K + V at the last step's length. Llama 3.1 8B: 2 x 8 KV heads x 128 x 2 B =
    4,096 B per token per layer; 4 sequences x (4,096 + 256) tokens: 71,303,168 B."""
    hf = _phases(_budget(INFER))
    vllm = _phases(_budget(INFER, {"framework": "vllm"}))
    assert hf["decode"] - vllm["decode"] == 4 * 4_352 * 4_096 == 71_303_168
    assert hf["prefill"] == vllm["prefill"]


def test_litgpt_and_torchtune_preallocate_their_caches() -> None:
    """LitGPT's DenseKVCache and torchtune's KVCache are allocated at full length: no torch.cat
    copy at decode, as with an engine's block pool."""
    hf = _phases(_budget(INFER))["decode"]
    for framework in ("litgpt", "torchtune", "vllm"):
        assert hf - _phases(_budget(INFER, {"framework": framework}))["decode"] == 71_303_168


def test_transformers_before_4_45_keeps_every_prompt_logit_in_fp32() -> None:
    """Before ``logits_to_keep`` the prefill returns all 4 x 4,096 positions' logits, bf16 and
    their fp32 copy: 16,384 x 128,256 x (2 + 4) = 12,608,077,824 B (current releases: the
    last position of each sequence, 4 x 128,256 x 6 = 3,078,144 B)."""
    old = _lines(_budget(INFER, {"framework_version": "4.44.2"}))
    new = _lines(_budget(INFER, {"framework_version": "4.45.0"}))
    assert old[C.LOGITS] == 16_384 * 128_256 * 6 == 12_608_077_824
    assert new[C.LOGITS] == 4 * 128_256 * 6 == 3_078_144


TRAIN = {
    "kind": "training",
    "model": LLAMA31,
    "micro_batch_size": 1,
    "sequence_length": 4096,
    "method": {"kind": "lora", "rank": 16},
    "checkpointing": "full",
}


@pytest.mark.parametrize(
    ("software", "expected"),
    [
        # lm_head output bf16 + fp32 copy + fp32 log-softmax: 4,096 x 128,256 x 10.
        ({}, 4_096 * 128_256 * 10),
        # torchtune: bf16 logits + every chunk's fp32 log-softmax + one chunk's fp32 copy.
        ({"framework": "torchtune"}, 4_096 * 128_256 * 6 + 512 * 128_256 * 4),
        # Liger's fused linear cross-entropy: no logits (the same forward as the fused loss).
        ({"libraries": {"liger_kernel": "0.5.0"}}, 0),
    ],
)
def test_loss_implementation_sets_the_forward_logits(
    software: dict[str, Any], expected: int
) -> None:
    stack = resolve_stack(msgspec.convert(software, Software))
    parts = training_forward_parts(4_096, 128_256, 2, stack.loss, stack.loss_chunks)
    assert sum(b for _, b in parts) == expected

    # Through the budget: the forward phase carries those bytes over the fused loss's (plus the
    # allocator's fragmentation share of them: the phase can only grow by more).
    def forward(b) -> int:
        return next(p for p in b.devices[0].phases if p.name == "forward").total_bytes

    # The same stack with the fused loss (a framework's other behaviours, its norm, stay).
    fused = forward(_budget(TRAIN, {**software, "loss": "fused_linear_cross_entropy"}))
    extra = forward(_budget(TRAIN, software)) - fused
    assert extra >= expected
    assert (extra == 0) == (expected == 0)


@pytest.mark.parametrize(
    ("transformers", "family", "per_element"),
    [
        # Before 4.46 the model's forward rebinds logits = logits.float(), freeing the bf16
        # output: fp32 logits + shifted fp32 copy + fp32 log-softmax.
        ("4.35.2", "llama", 12),
        ("4.45.2", "llama", 12),
        # 4.46 - 4.48: ForCausalLMLoss upcasts a copy while the model keeps the bf16 logits ...
        ("4.46.0", "llama", 14),
        # ... except where the family still computes its own loss after the rebind.
        ("4.46.0", "starcoder2", 12),
        ("4.47.0", "starcoder2", 14),
        ("4.47.0", "mistral", 12),
        ("4.48.1", "mistral", 14),
        # GPT-2 never upcasts in its forward: the head's output is kept (the larger count).
        ("4.45.2", "gpt2", 14),
        # 4.49 on: the labels are shifted instead of the logits.
        ("4.49.0", "llama", 10),
    ],
)
def test_the_loss_forward_follows_the_transformers_release(
    transformers: str, family: str, per_element: int
) -> None:
    """The forward's logits bytes per token x vocabulary element by transformers release and
    family, as the released code allocates them (measured on CPU tensors: 12.3, 14.3 and 10.4
    bytes per element for Llama with 4.45.2, 4.46.0 and 5.23.0, research/loss_peaks.py; 12.3
    for Mistral with 4.46.0): 4,096 x 128,256 x ``per_element`` at 4,096 tokens in bf16."""
    sw = {"framework": "fsdp", "libraries": {"transformers": transformers}}
    stack = resolve_stack(msgspec.convert(sw, Software))
    head_freed = upcast_rebound(stack, family)
    assert ("loss_head_freed" in {b.name for b in stack.behaviours}) is (
        version_tuple(transformers) < (4, 48)
    )
    parts = training_forward_parts(
        4_096,
        128_256,
        2,
        stack.loss,
        stack.loss_chunks,
        stack.loss_shift_copy,
        head_freed=head_freed,
    )
    assert sum(b for _, b in parts) == 4_096 * 128_256 * per_element
    # fp32 logits: .float() returns them, the head's output is the fp32 logits themselves.
    fp32 = training_forward_parts(4_096, 128_256, 4, "cross_entropy", 1, True, head_freed=True)
    assert sum(b for _, b in fp32) == 4_096 * 128_256 * 12


def test_the_freed_head_output_reaches_the_budget() -> None:
    """Through the budget: Llama 3.1 8B's forward phase holds 4,096 x 128,256 x 2 =
    1,050,673,152 B less of logits under transformers 4.45.2 than under 4.46.0 (the rest of the
    phase, the allocator's share aside, is the same)."""

    def forward_without_overhead(transformers: str) -> int:
        b = _budget(TRAIN, {"framework": "fsdp", "libraries": {"transformers": transformers}})
        (p,) = (p for p in b.devices[0].phases if p.name == "forward")
        return p.total_bytes - _lines(b)[C.ALLOCATOR_OVERHEAD]

    assert forward_without_overhead("4.46.0") - forward_without_overhead("4.45.2") == (
        4_096 * 128_256 * 2
    )


@pytest.mark.parametrize(("transformers", "per_element"), [("4.45.2", 4), ("4.48.1", 2)])
def test_a_loop_holding_the_model_output_keeps_its_logits_after_the_forward(
    transformers: str, per_element: int
) -> None:
    """Answer.AI's fsdp_qlora loop drops ``output`` only after the optimizer step: the logits
    it returned stay through the backward and the step -- fp32 before 4.46 (the model's
    forward upcast them), bf16 after -- 4,096 x 128,256 x 4 = 2,101,346,304 B or x 2 =
    1,050,673,152 B more in every phase after the forward, none in the forward; the answer
    names the behaviour. Other losses keep their own rules."""
    lora = {**TRAIN, "parallelism": {"data": 2, "zero_stage": 3}}
    sw = {"framework": "fsdp", "libraries": {"transformers": transformers}}
    dropped = _budget(lora, sw)
    held = _budget(lora, {**sw, "loop_holds_output": True})
    logits = 4_096 * 128_256 * per_element

    def phase_total(b, phase: str) -> int:
        (p,) = (p for p in b.devices[0].phases if p.name == phase)
        return p.total_bytes

    # The fragmentation share follows the largest transient: it moves every phase alike.
    shift = _lines(held)[C.ALLOCATOR_OVERHEAD] - _lines(dropped)[C.ALLOCATOR_OVERHEAD]
    assert phase_total(held, "forward") - phase_total(dropped, "forward") == shift
    for phase in ("backward_start", "backward_recompute", "backward_end", "optimizer_step"):
        assert phase_total(held, phase) - phase_total(dropped, phase) == logits + shift, phase
    assert held.stack is not None and dropped.stack is not None
    assert "loop_holds_output" in {b.name for b in held.stack.behaviours}
    assert "loop_holds_output" not in {b.name for b in dropped.stack.behaviours}
    # A short step peaks at the optimizer step: the held logits are itemized there too.
    short = {**lora, "sequence_length": 128, "method": {"kind": "full"}}
    b = _budget(short, {**sw, "loop_holds_output": True})
    assert b.devices[0].peak_phase in ("optimizer_step", "backward_end")
    (line,) = (x for x in b.devices[0].lines if x.component == C.LOGITS)
    assert line.bytes == 128 * 128_256 * per_element
    assert [p.name for p in line.parts] == [LOOP_HELD_PART]
    # A chunked loss (torchtune) or LitGPT's are their own loops' rules: the flag changes nothing.
    for fw in ("torchtune", "litgpt"):
        assert not resolve_stack(
            msgspec.convert({"framework": fw, "loop_holds_output": True}, Software)
        ).loop_holds_output


V, H, N = 128_256, 4_096, 8_192
CHUNK = 256
"""Llama 3.1 8B at 8,192 tokens: Liger's chunk is next_pow2(8,192 / ceil(128,256 / 4,096)) =
256 rows of logits."""


@pytest.mark.parametrize(
    ("liger", "chunk_bytes", "head_temporary"),
    [
        # < 0.5: the previous chunk's logits and scaled copy beside the current one in fp32.
        ("0.3.0", CHUNK * V * (2 * 2 + 4), 0),
        # 0.5.0 - 0.5.9: three chunk tensors (the scaled copy stays to 0.5.2, read).
        ("0.5.2", CHUNK * V * 3 * 2, 0),
        # 0.5.10 - 0.8.2: two chunks (the loop's names keep the previous one) ...
        ("0.5.10", CHUNK * V * 2 * 2, 0),
        # ... and from 0.6.2 each chunk's head-gradient product and its fp32 copy, head-sized.
        ("0.8.0", CHUNK * V * 2 * 2, V * H * (2 + 4)),
        ("0.8.2", CHUNK * V * 2 * 2, V * H * (2 + 4)),
        # 0.8.3 on: one chunk, accumulated in place (compute capability 8+).
        ("0.8.5", CHUNK * V * 2, 0),
    ],
)
def test_liger_fused_loss_computes_gradients_in_its_forward(
    liger: str, chunk_bytes: int, head_temporary: int
) -> None:
    """Liger's fused linear cross-entropy (liger_kernel ops/fused_linear_cross_entropy.py):
    its forward fills the hidden states' gradient (8,192 x 4,096 x 2 B) and a full fine-tune's
    head gradient (128,256 x 4,096 x 2 B) and keeps both for the backward, and works a chunk of
    logits at a time with the copies its release keeps; a LoRA's frozen head has no gradient
    and no head-sized temporary; Unsloth's own fused loss is not Liger's."""
    full = {
        **TRAIN,
        "sequence_length": N,
        "checkpointing": "none",
        "method": {"kind": "full"},
        "mixed_precision": "master_fp32",
        "parallelism": {"data": 8, "zero_stage": 2},
    }
    sw = {"framework": "deepspeed", "libraries": {"liger_kernel": liger}}
    assert "fused_loss_gradients" in {
        b.name for b in resolve_stack(msgspec.convert(sw, Software)).behaviours
    }
    saved = N * H * 2 + V * H * 2

    def logits_line(workload: dict[str, Any]) -> tuple[str, int, int]:
        b = _budget(workload, sw)
        (line,) = (x for x in b.devices[0].lines if x.component == C.LOGITS)
        assert sum(p.bytes for p in line.parts) == line.bytes
        return b.devices[0].peak_phase, line.bytes, _phases(b)["backward_start"]

    phase, forward, _ = logits_line(full)
    assert phase == "forward"
    assert forward == saved + chunk_bytes + head_temporary
    # A LoRA (frozen head): the hidden states' gradient and the chunks, through the budget.
    lora = {**full, "method": {"kind": "lora", "rank": 16}, "mixed_precision": "pure"}
    _, lora_forward, _ = logits_line(lora)
    assert lora_forward == N * H * 2 + chunk_bytes
    assert training_forward_parts(N, V, 2, "fused_linear_cross_entropy") == ()
    unsloth = resolve_stack(msgspec.convert({"framework": "unsloth"}, Software))
    assert unsloth.loss == "fused_linear_cross_entropy" and unsloth.liger_loss is None


@pytest.mark.parametrize(("torch", "upcast"), [("2.7.1", True), ("2.8.0", False)])
def test_liger_fp32_head_gradient_needs_torch_2_8_to_accumulate_in_place(
    torch: str, upcast: bool
) -> None:
    """fp32 weights under autocast give Liger an fp32 head gradient (128,256 x 4,096 x 4 B);
    liger 0.8.1 on accumulates it with addmm(out_dtype=float32), which needs torch 2.8
    (_ADDMM_SUPPORTS_OUT_DTYPE); before, the head-sized bf16 product and its fp32 copy."""
    sw = msgspec.convert({"libraries": {"liger_kernel": "0.8.5"}, "torch_version": torch}, Software)
    liger = resolve_stack(sw).liger_loss
    assert liger is not None and liger.upcast_fp32 is upcast and not liger.upcast_16bit
    saved, work = fused_loss_parts(N, V, H, 2, 4, V * H * 4, liger.chunks, liger.upcast_fp32)
    assert sum(b for _, b in saved) == N * H * 4 + V * H * 4
    assert sum(b for _, b in work) == CHUNK * V * 2 + (V * H * 6 if upcast else 0)


def test_zero_grad_before_torch_2_keeps_gradients_through_the_forward() -> None:
    """torch < 2.0 zeroes gradients in place: they stay allocated through the next forward.
    GPT-2's checkpoint is fp32, so full fine-tuning keeps fp32 gradients: 124,439,808 x 4 =
    497,759,232 B more in the forward phase (not transient: no fragmentation share)."""
    w = {
        "kind": "training",
        "model": {"source": "preset", "id": "gpt2"},
        "micro_batch_size": 1,
        "sequence_length": 128,
    }

    def forward(b) -> int:
        return next(p for p in b.devices[0].phases if p.name == "forward").total_bytes

    old = forward(_budget(w, {"torch_version": "1.13.1"}))
    new = forward(_budget(w, {"torch_version": "2.0.0"}))
    assert old - new == 124_439_808 * 4 == 497_759_232


def test_eager_module_loading_takes_the_eager_context() -> None:
    """Lazy on an H100: the 534 MiB context (559,939,584 B) and the 180,813,824 B of kernel
    images an inference loads after it = 740,753,408 B. Eager loading: the context as created
    and cuBLAS's whole image set at the first GEMM (517,996,544 B, H200 measurement). CUDA 11.6
    takes the torch 1.13 A/B's 666,632,192 B but never less than the lazy context with the
    larger (training) images, 559,939,584 + 245,825,536 = 805,765,120 B; forced eager on a
    current stack takes the H200's 1,322,057,728 - 2,097,152 = 1,319,960,576 B."""
    dev = {"device": {"source": "catalog", "id": "h100-sxm5-80gb"}}

    def line(software: dict[str, str]) -> Any:
        lines = _budget(INFER, software, **dev).devices[0].lines
        return next(ln for ln in lines if ln.component == C.CUDA_CONTEXT)

    lazy, eager, forced = (
        line({}),
        line({"cuda_version": "11.6"}),
        line({"cuda_module_loading": "eager"}),
    )
    images = "kernel images loaded after the context"
    assert lazy.bytes == 534 * 1024 * 1024 + 180_813_824 == 740_753_408
    assert [(p.name, p.bytes) for p in lazy.parts] == [
        ("CUDA context", 559_939_584),
        (images, 180_813_824),
    ]
    assert [(p.name, p.bytes) for p in eager.parts] == [
        ("CUDA context", 805_765_120),
        (images, 517_996_544),
    ]
    assert forced.bytes == 1_319_960_576 + 517_996_544 == 1_837_957_120


def test_torch_before_1_13_loads_modules_eagerly() -> None:
    """torch 1.13 first sets CUDA_MODULE_LOADING=LAZY (pytorch/pytorch#86509); before it CUDA
    11's default, eager, held. A torch from 1.7 to 2.0 with no CUDA named was built for CUDA
    11, so the context is the torch 1.13 A/B's eager 666,632,192 B -- on an H100 never less
    than the lazy 559,939,584 + 245,825,536 = 805,765,120 B -- plus cuBLAS's 517,996,544 B; a
    torch before 1.7 for CUDA 10: 877 MiB = 919,601,152 B, cuBLAS's images in it
    (pytorch/pytorch#49877)."""
    dev = {"device": {"source": "catalog", "id": "h100-sxm5-80gb"}}

    def line(software: dict[str, str]) -> Any:
        lines = _budget(INFER, software, **dev).devices[0].lines
        return next(ln for ln in lines if ln.component == C.CUDA_CONTEXT)

    assert resolve_stack(msgspec.convert({"torch_version": "1.12.1"}, Software)).eager_modules
    assert not resolve_stack(msgspec.convert({"torch_version": "1.13.0"}, Software)).eager_modules
    # CUDA_MODULE_LOADING is CUDA's: a ROCm build keeps the default context
    rocm = {"torch_version": "1.12.1", "rocm_version": "5.1"}
    assert not resolve_stack(msgspec.convert(rocm, Software)).eager_modules
    old = line({"torch_version": "1.10.1"})
    assert old.bytes == 805_765_120 + 517_996_544
    assert line({"torch_version": "1.4.0"}).bytes == 919_601_152
    assert line({"torch_version": "1.12.1", "cuda_version": "10.2"}).bytes == 919_601_152
    # the build's own tag names its CUDA; a CUDA named wins over the release's default
    assert line({"torch_version": "1.8.2+cu101"}).bytes == 919_601_152
    named = line({"torch_version": "1.6.0", "cuda_version": "11.0"})
    assert named.bytes == 805_765_120 + 517_996_544 == 1_323_761_664
    assert line({"torch_version": "1.13.1"}).bytes == 740_753_408
    # named lazy wins over the release's default
    assert line({"torch_version": "1.10.1", "cuda_module_loading": "lazy"}).bytes == 740_753_408


@pytest.mark.parametrize(
    ("torch_version", "cuda"),
    [
        ("1.8.2+cu101", (10, 1)),
        ("1.13.1+cu117", (11, 7)),
        ("2.1.0+cu121", (12, 1)),
        ("1.6.0", (10,)),
        ("1.12.1", (11,)),
        ("2.0.1", (11,)),
        ("2.1.0", None),
        ("2.5.1+rocm6.2", None),
        ("nightly", None),
    ],
)
def test_the_cuda_of_a_torch_build(torch_version: str, cuda: tuple[int, ...] | None) -> None:
    """Its +cuNNN tag, else by release: 1.7.0 shipped the first CUDA 11 wheels, 2.1.0 the
    first CUDA 12 ones."""
    assert wheel_cuda(torch_version) == cuda


def test_the_answer_lists_the_behaviours_of_its_workloads() -> None:
    infer = _budget(INFER).stack
    assert infer is not None
    names = {b.name for b in infer.behaviours}
    assert names == {
        "kv_cache_growth",
        "prefill_logits",
        "cuda_module_loading",
        "allocator_segments",
    }
    assert all(b.source for b in infer.behaviours)
    qlora = _budget({**TRAIN, "method": {"kind": "qlora", "rank": 16}}, {"framework": "torchtune"})
    assert qlora.stack is not None
    assert qlora.stack.framework == "torchtune"
    assert qlora.stack.framework_version == CURRENT["torchtune"]
    names = {b.name for b in qlora.stack.behaviours}
    assert names == {
        "loss",
        "gradient_lifetime",
        "optimizer_step_intermediates",
        "cuda_module_loading",
        "allocator_segments",
        "quantized_saved_tensors",
        "qlora_unquantized_dtype",
        "lora_adapter_dtype",
        "rms_norm",
        "swiglu",
    }
    loss = next(b for b in qlora.stack.behaviours if b.name == "loss")
    assert "ce_chunked_output_loss.py" in loss.source


def test_a_bad_version_is_refused_naming_the_field() -> None:
    with pytest.raises(msgspec.ValidationError) as e:
        msgspec.convert({"framework_version": "latest"}, Software)
    assert "framework_version" in str(e.value)


def test_the_torch_release_sets_the_blas_workspaces() -> None:
    """cuBLAS on an A100 (8.0): 8,519,680 B; torch 2.11 adds cuBLASLt's own 1 MiB (9,568,256 B),
    torch >= 2.12 shares it (CublasHandlePool.cpp / CUDABlas.cpp, research/stack_behaviours.md
    section 5). A B200 (10.0) gets 32 MiB only from 2.12."""
    a100 = {"device": {"source": "catalog", "id": "a100-sxm4-80gb"}}
    b200 = {"device": {"source": "catalog", "id": "b200-180gb"}}
    ws = C.RUNTIME_WORKSPACE
    assert _lines(_budget(INFER, {}, **a100))[ws] == 8_519_680
    assert _lines(_budget(INFER, {"torch_version": "2.11.0"}, **a100))[ws] == 9_568_256
    assert _lines(_budget(INFER, {"torch_version": "2.11.0"}, **b200))[ws] == 9_568_256
    assert _lines(_budget(INFER, {"torch_version": "2.12.0"}, **b200))[ws] == 33_554_432


def test_serving_and_image_answers_name_their_stack() -> None:
    serving = _budget(
        {"kind": "llm_serving", "model": {"source": "preset", "id": "qwen2.5-7b"}},
        device={"source": "catalog", "id": "h100-sxm5-80gb"},
    ).stack
    assert serving is not None
    # the default release: the newest modelled
    assert (serving.framework, serving.framework_version) == ("vllm", "0.34.0")
    assert {b.name for b in serving.behaviours} == {
        "kv_cache_growth",
        "engine_accounting",
        "warmup_sampler",
        "cuda_graph_driver",
    }
    image = _budget(
        {
            "kind": "image_generation",
            "pipeline": {"source": "preset", "id": "sd-1.5"},
            "height": 256,
            "width": 256,
        }
    ).stack
    assert image is not None
    assert (image.framework, image.framework_version) == ("diffusers", CURRENT["diffusers"])
    assert {b.name for b in image.behaviours} == {"cuda_module_loading", "allocator_segments"}


def test_serving_stacks_name_their_engines_own_accounting_and_torch() -> None:
    """Each engine's `engine_accounting` in its own terms, per release; the torch a vLLM
    release pins (vllm 0.19: torch 2.10, 0.26: 2.11; the minor, as the pin table holds it)
    unless the request names one; none for llama.cpp (ggml)."""
    qwen = {"source": "preset", "id": "qwen3-8b"}
    a100 = {"source": "catalog", "id": "a100-sxm4-40gb"}

    def stack(software=None, **w):
        return _budget({"kind": "llm_serving", "model": qwen, **w}, software, device=a100).stack

    def accounting(s) -> str:
        return next(b.assumed for b in s.behaviours if b.name == "engine_accounting")

    v19, v26 = stack(engine_version="0.19.1"), stack(engine_version="0.26.0")
    assert (v19.framework_version, v19.torch_version) == ("0.19.0", "2.10")
    assert v26.torch_version == "2.11"
    assert stack({"torch_version": "2.9.1"}, engine_version="0.19.1").torch_version == "2.9.1"
    assert "the CUDA graphs are captured afterwards, outside it" in accounting(v19)
    assert "vLLM's estimate of the CUDA graphs" in accounting(v26)
    given = stack(engine_version="0.26.0", kv_cache_memory_bytes=8 * 2**30)
    assert accounting(given).startswith("vLLM 0.26.0's own memory accounting: --kv-cache-memory")
    assert "extensible KV cache" in accounting(stack(engine_version="0.34.0"))
    sg = stack(engine="sglang")
    assert sg.framework == "sglang" and "mem_fraction_static" in accounting(sg)
    gguf = stack(engine="llama_cpp")
    assert gguf.torch_version == "" and "KV buffer at n_ctx" in accounting(gguf)
    assert "gpu_memory_utilization" not in accounting(gguf)


def test_the_cli_estimate_follows_the_requests_software(tmp_path, capsys) -> None:
    """`vrambudget estimate --file` with transformers 4.44.2: every prompt position's logits
    (12,608,077,824 B, as by hand above), and the answer's stack says so."""
    import json

    from vrambudget.cli.main import main

    body = {"workloads": [INFER], "software": {"framework_version": "4.44.2"}}
    f = tmp_path / "req.json"
    f.write_text(json.dumps(body))
    assert main(["estimate", "--file", str(f), "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    logits = next(ln for ln in answer["devices"][0]["lines"] if ln["component"] == "logits")
    assert logits["bytes"] == 12_608_077_824
    assert answer["stack"]["framework_version"] == "4.44.2"


# Llama 2 7B: per layer 4 x 4096^2 (attention) + 3 x 4096 x 11008 (MLP) + 2 x 4096 (norms)
# = 202,383,360 parameters, x 32 layers = 6,476,267,520; LoRA r8 on q and v adds
# 2 x (8 x 4096 + 4096 x 8) = 131,072 per layer, 4,194,304 in all.
_LLAMA2_LAYERS = 32 * (4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096)
_LLAMA2_ADAPTERS = 32 * 2 * (8 * 4096 + 4096 * 8)
FSDP_LORA = {
    "kind": "training",
    "model": {"source": "preset", "id": "llama-2-7b"},
    "precision": {"weights": "bf16"},
    "mixed_precision": "pure",
    "micro_batch_size": 1,
    "sequence_length": 512,
    "gradient_accumulation_steps": 4,
    "checkpointing": "full",
    "method": {
        "kind": "lora",
        "rank": 8,
        "target_modules": ["q_proj", "v_proj"],
        "adapter_dtype": "bf16",
    },
    "parallelism": {"data": 2, "zero_stage": 3},
}


def _gradients(b) -> tuple[int, str, list[tuple[str, int]]]:
    """The gradients line, the peak phase and the line's parts."""
    d = b.devices[0]
    line = next(ln for ln in d.lines if ln.component == C.GRADIENTS)
    return line.bytes, d.peak_phase, [(p.name, p.bytes) for p in line.parts]


def test_lora_under_fsdp1_in_litgpt_gets_gradients_for_every_block_parameter() -> None:
    """LitGPT < 0.5.11 wraps each Block whole in FSDP1 with use_orig_params=True: the frozen
    weights share the adapters' FlatParameter and get gradients. With gradient accumulation
    the micro-batches run in no_sync, so a rank holds them unsharded: (6,476,267,520 +
    4,194,304) x 2 B (bf16) = 12,960,923,648 B. The published LitGPT resource table this
    reproduces: Llama 2 7B LoRA on 2 A100s peaked at 22.18 GB, above the 1-GPU 21.30 GB."""
    assert _LLAMA2_LAYERS == 6_476_267_520 and _LLAMA2_ADAPTERS == 4_194_304
    b = _budget(FSDP_LORA, {"framework": "litgpt", "framework_version": "0.5.10"})
    grads, phase, parts = _gradients(b)
    whole = (_LLAMA2_LAYERS + _LLAMA2_ADAPTERS) * 2
    assert whole == 12_960_923_648
    assert phase != "optimizer_step"
    assert grads == whole
    assert parts == [
        (
            "gradients of every parameter of the adapted layers (FSDP1 FlatParameter), "
            "unsharded (accumulated in no_sync)",
            whole,
        )
    ]
    assert b.stack is not None
    names = {x.name for x in b.stack.behaviours}
    assert {"gradient_sync", "fsdp_frozen_gradients"} <= names
    # Without accumulation each micro-batch reduce-scatters: after the backward a rank holds
    # half of the whole, where FSDP2 (0.5.11) holds half of the adapters' 8,388,608 B.
    one = {**FSDP_LORA, "gradient_accumulation_steps": 1}
    old, new = (
        _phases(_budget(one, {"framework": "litgpt", "framework_version": v}))["backward_end"]
        for v in ("0.5.10", "0.5.11")
    )
    assert old - new == whole // 2 - 8_388_608 // 2 == _LLAMA2_LAYERS


def test_litgpt_from_0_5_11_shards_lora_with_fsdp2_and_keeps_adapter_gradients_only() -> None:
    """LitGPT 0.5.11 moved LoRA to FSDP2 (fully_shard per trainable Linear): gradients of the
    4,194,304 adapter parameters only, unsharded under no_sync: 8,388,608 B."""
    b = _budget(FSDP_LORA, {"framework": "litgpt", "framework_version": "0.5.11"})
    grads, _, _ = _gradients(b)
    assert grads == _LLAMA2_ADAPTERS * 2 == 8_388_608
    assert b.stack is not None
    assert "fsdp_frozen_gradients" not in {x.name for x in b.stack.behaviours}


@pytest.mark.parametrize(
    ("software", "expected"),
    [
        # Trainer -> accelerate no_sync: the whole adapter gradients between micro-batches.
        ({"framework": "transformers"}, 8_388_608),
        # DeepSpeed reduces each micro-batch into its partitions: this rank's half.
        ({"framework": "transformers", "libraries": {"deepspeed": "0.16.0"}}, 4_194_304),
        ({"framework": "deepspeed"}, 4_194_304),
        # torchtune's recipes reduce-scatter every micro-batch (no no_sync).
        ({"framework": "torchtune"}, 4_194_304),
    ],
)
def test_gradient_accumulation_under_fsdp_follows_the_frameworks_sync(
    software: dict[str, Any], expected: int
) -> None:
    b = _budget(FSDP_LORA, software)
    grads, phase, _ = _gradients(b)
    assert phase != "optimizer_step"
    assert grads == expected
    assert b.stack is not None
    sync = next(x for x in b.stack.behaviours if x.name == "gradient_sync")
    assert ("no_sync" in sync.assumed) == (expected == 8_388_608)


def test_gradient_sync_is_not_listed_for_one_device() -> None:
    one = {**FSDP_LORA, "parallelism": {"data": 1}}
    b = _budget(one, {"framework": "litgpt", "framework_version": "0.5.10"})
    assert b.stack is not None
    names = {x.name for x in b.stack.behaviours}
    assert not names & {"gradient_sync", "fsdp_frozen_gradients"}
    assert _gradients(b)[0] == _LLAMA2_ADAPTERS * 2


def test_a_compiled_chunked_loss_saves_no_fp32_log_softmax() -> None:
    """torchtune compiles the chunked loss's upcast and cross-entropy (compile_loss): inductor
    saves the bf16 chunk and an fp32 max and log-sum-exp per token (checked with
    saved_tensors_hooks on torch 2.13), not the fp32 log-softmax. Llama 3.1 8B, 4,096
    tokens, vocab 128,256, bf16: forward logits 4,096 x 128,256 x 2 + 4,096 x 8 =
    1,050,705,920 B (eager chunked: 4,096 x 128,256 x 6 + 512 x 128,256 x 4 =
    3,414,687,744 B); backward start 4,096 x 128,256 x 2 + 512 x 128,256 x 2 =
    1,182,007,296 B."""
    w = TRAIN
    eager = resolve_stack(Software(framework="torchtune"))
    compiled = resolve_stack(Software(framework="torchtune", torch_compile=True))
    assert (eager.loss_compiled, compiled.loss_compiled) == (False, True)
    fwd = training_forward_parts(4096, 128_256, 2, "chunked_cross_entropy", 8, compiled=True)
    assert sum(b for _, b in fwd) == 4096 * 128_256 * 2 + 4096 * 8 == 1_050_705_920
    bwd = training_backward_parts(4096, 128_256, "chunked_cross_entropy", 8, 2, compiled=True)
    assert sum(b for _, b in bwd) == (4096 + 512) * 128_256 * 2 == 1_182_007_296
    b = _budget(w, {"framework": "torchtune", "torch_compile": True})
    assert b.stack is not None
    behaviour = next(x for x in b.stack.behaviours if x.name == "loss_compiled")
    assert "saved_tensors_hooks" in behaviour.source
    # Through the budget: the eager forward is larger by the difference at least (plus the
    # allocator's fragmentation share of it).
    saved = _phases(_budget(w, {"framework": "torchtune"}))["forward"] - _phases(b)["forward"]
    assert saved >= 3_414_687_744 - 1_050_705_920


def test_compile_with_an_unread_loss_is_budgeted_as_eager() -> None:
    """Only torchtune's compiled chunked loss was read: a compiled transformers loss keeps
    its eager bytes and the answer says so."""
    w = {**TRAIN, "method": {"kind": "lora"}}
    plain = _budget(w, {"framework": "transformers"})
    named = _budget(w, {"framework": "transformers", "torch_compile": True})
    assert _phases(plain) == _phases(named)
    assert named.stack is not None
    behaviour = next(x for x in named.stack.behaviours if x.name == "loss_compiled")
    assert "budgeted as eager" in behaviour.assumed


def test_torchtune_before_0_3_takes_the_plain_cross_entropy() -> None:
    """torchtune 0.2.1's configs use torch.nn.CrossEntropyLoss; CEWithChunkedOutputLoss
    arrived in 0.3.0."""
    assert resolve_stack(Software(framework="torchtune", framework_version="0.2.1")).loss == (
        "cross_entropy"
    )
    assert resolve_stack(Software(framework="torchtune", framework_version="0.3.0")).loss == (
        "chunked_cross_entropy"
    )


def test_torchtune_qlora_keeps_the_unquantized_parameters_in_bf16() -> None:
    """PEFT's prepare_model_for_kbit_training casts the parameters QLoRA leaves unquantized to
    fp32; torchtune builds the model in bf16 and quantizes the attention and MLP projections
    only. Llama 3.1 8B: embeddings and output projection 2 x 128,256 x 4,096 = 1,050,673,152,
    norms 65 x 4,096 = 266,240: 1,050,939,392 parameters x (4 - 2) B = 2,101,878,784 B less."""
    w = {**TRAIN, "precision": {"weights": "bf16"}, "method": {"kind": "qlora", "rank": 16}}
    peft = _lines(_budget(w, {"framework": "transformers"}))[C.WEIGHTS]
    torchtune = _lines(_budget(w, {"framework": "torchtune"}))[C.WEIGHTS]
    assert 2 * 128_256 * 4_096 + 65 * 4_096 == 1_050_939_392
    assert peft - torchtune == 1_050_939_392 * 2 == 2_101_878_784


QWEN05 = {"source": "preset", "id": "qwen2.5-0.5b"}  # tied: vocab 151,936 x hidden 896
QWEN05_FULL = {
    "kind": "training",
    "model": QWEN05,
    "precision": {"weights": "bf16"},
    "mixed_precision": "pure",
    "micro_batch_size": 1,
    "sequence_length": 512,
    "method": {"kind": "full"},
}


def test_litgpt_trains_a_separate_lm_head_for_a_tied_checkpoint() -> None:
    """LitGPT's GPT has its own lm_head Linear; convert_hf_checkpoint copies the tied
    embedding into it. A bf16 full fine-tune of Qwen2.5-0.5B (tied) then holds one more
    151,936 x 896 matrix: 136,134,656 x 2 = 272,269,312 B of weights, as much of gradients,
    twice that of AdamW moments (mixed_precision pure: bf16) and as much again of foreach
    AdamW's step temporaries (one state-sized tensor per parameter)."""
    w = QWEN05_FULL
    hf = _lines(_budget(w, {"framework": "transformers"}))
    lit = _budget(w, {"framework": "litgpt"})
    head = 151_936 * 896
    assert head == 136_134_656
    assert _lines(lit)[C.WEIGHTS] - hf[C.WEIGHTS] == head * 2 == 272_269_312
    assert _lines(lit)[C.GRADIENTS] - hf[C.GRADIENTS] == head * 2
    optimizer = next(ln for ln in lit.devices[0].lines if ln.component == C.OPTIMIZER_STATE)
    assert dict((p.name, p.bytes) for p in optimizer.parts) == {
        "moments and statistics": (494_032_768 + head) * 2 * 2,
        "optimizer step temporaries": (494_032_768 + head) * 2,
    }
    assert lit.stack is not None
    assert "lm_head_layout" in {x.name for x in lit.stack.behaviours}


def test_litgpt_qlora_quantizes_the_lm_head_and_keeps_embeddings_in_bf16() -> None:
    """Fabric's BitsandbytesPrecision replaces every nn.Linear, LitGPT's separate LM head
    included, with a 4-bit layer; the embedding stays bf16. Against torchtune (tied head,
    embeddings bf16, output projection unquantized here because the checkpoint ties it to the
    embedding) LitGPT adds the 4-bit head: 136,134,656 / 2 = 68,067,328 B of payload and its
    absmax metadata; its dequantized bf16 copy, 272,269,312 B, is the largest 4-bit weight the
    step dequantizes."""
    w = {**QWEN05_FULL, "method": {"kind": "qlora", "rank": 8}}
    tt = _budget(w, {"framework": "torchtune"})
    lit = _budget(w, {"framework": "litgpt"})
    assert _lines(lit)[C.WEIGHTS] - _lines(tt)[C.WEIGHTS] == 136_134_656 // 2 == 68_067_328
    assert _lines(lit)[C.QUANTIZATION_METADATA] > _lines(tt)[C.QUANTIZATION_METADATA]
    workspace = next(ln for ln in lit.devices[0].lines if ln.component == C.RUNTIME_WORKSPACE)
    parts = dict((p.name, p.bytes) for p in workspace.parts)
    assert parts["4-bit dequantized weight (largest projection)"] == 136_134_656 * 2


@pytest.mark.parametrize(
    ("parallelism", "listed"),
    [
        ({"tensor": 2}, set()),  # no data parallelism: neither applies
        ({"data": 2, "zero_stage": 1}, {"fsdp_frozen_gradients"}),  # gradients not sharded
        ({"data": 2, "zero_stage": 3}, {"gradient_sync", "fsdp_frozen_gradients"}),
    ],
)
def test_gradient_behaviours_are_listed_where_the_layout_has_them(
    parallelism: dict[str, int], listed: set[str]
) -> None:
    w = {**FSDP_LORA, "parallelism": parallelism}
    b = _budget(w, {"framework": "litgpt", "framework_version": "0.5.10"})
    assert b.stack is not None
    names = {x.name for x in b.stack.behaviours}
    assert names & {"gradient_sync", "fsdp_frozen_gradients"} == listed


def test_frozen_gradients_stay_through_the_optimizer_step_with_the_master_gradients() -> None:
    """With fp32 masters of the adapters (mixed_precision master_fp32) the FlatParameter's
    gradient shard and the masters' fp32 gradients are both live in the step. Llama 2 7B, LoRA
    r8 on q, v over 2 ranks without accumulation: the shard is (6,476,267,520 + 4,194,304) x 2
    / 2 = 6,480,461,824 B, on top of the 4,194,304 x 4 / 2 = 8,388,608 B of master gradients
    that LitGPT 0.5.11 (FSDP2: adapters' gradients only) also holds."""
    w = {
        **FSDP_LORA,
        "gradient_accumulation_steps": 1,
        "mixed_precision": "master_fp32",
        "optimizer": {"name": "sgd"},
    }
    old, new = (
        _budget(w, {"framework": "litgpt", "framework_version": v}) for v in ("0.5.10", "0.5.11")
    )
    assert _phases(old)["optimizer_step"] - _phases(new)["optimizer_step"] == 6_480_461_824
    # The peak is the backward's end: the shard, with the adapters' own half on the 0.5.11 side.
    assert old.devices[0].peak_phase == "backward_end"
    grads, _, parts = _gradients(old)
    shard = "gradients of every parameter of the adapted layers (FSDP1 FlatParameter)"
    assert grads == 6_480_461_824 and parts == [(shard, 6_480_461_824)]
    assert _phases(old)["backward_end"] - _phases(new)["backward_end"] == 6_480_461_824 - 4_194_304


def test_host_ram_follows_the_frameworks_model_layout() -> None:
    """Offloaded AdamW state of a LitGPT full fine-tune includes its own LM head's: 136,134,656
    parameters x 2 moments x 2 B (bf16, mixed_precision pure) = 544,538,624 B more pinned host
    memory than transformers' tied Qwen2.5-0.5B (ZeRO-1: the gradients stay on the device)."""
    w = {**QWEN05_FULL, "parallelism": {"zero_stage": 1, "offload_optimizer": True}}

    def offloaded(framework: str) -> int:
        items = _budget(w, {"framework": framework}).host_ram.items
        return next(i.bytes for i in items if "offloaded optimizer state" in i.item)

    assert offloaded("litgpt") - offloaded("transformers") == 136_134_656 * 2 * 2 == 544_538_624


def test_sharded_qlora_and_trl_keep_the_unquantized_parameters_in_the_model_dtype() -> None:
    """FSDP / ZeRO-3 flatten parameters into one dtype, so sharded QLoRA keeps the
    unquantized ones in bf16 (TRL skips prepare_model_for_kbit_training for it); on one GPU TRL
    0.9.6 - 0.24 casts the embeddings and LM head back to bf16 after PEFT's upcast (0.9.6 and
    0.21.0 sft_trainer.py peft_module_casting_to_bf16, 0.22 prepare_peft_model), 0.25 upcasts
    the norms only and 0.26 on nothing; releases before 0.9.6 were not read (PEFT's rule).
    Llama 3.1 8B: 1,050,939,392 unquantized parameters x 2 B = 2,101,878,784 B less than PEFT's
    fp32 upcast on one device, half of it per rank over 2."""
    w = {**TRAIN, "precision": {"weights": "bf16"}, "method": {"kind": "qlora", "rank": 16}}
    upcast = _lines(_budget(w))[C.WEIGHTS]
    trl = _lines(_budget(w, {"libraries": {"trl": "0.22.0"}}))[C.WEIGHTS]
    for release in ("0.9.6", "0.21.0", "0.25.1", "1.16.0"):
        assert _lines(_budget(w, {"libraries": {"trl": release}}))[C.WEIGHTS] == trl, release
    old_trl = _lines(_budget(w, {"libraries": {"trl": "0.8.6"}}))[C.WEIGHTS]
    assert upcast - trl == 2_101_878_784 and old_trl == upcast
    two = {"parallelism": {"data": 2, "zero_stage": 3}}
    sharded = _lines(_budget({**w, **two}))[C.WEIGHTS]
    one_rank = _lines(_budget({**w, **two, "parallelism": {"data": 2, "zero_stage": 2}}))
    assert one_rank[C.WEIGHTS] == upcast  # ZeRO-2 does not shard (or flatten) the weights
    assert sharded == -(-trl // 2)


def test_litgpt_generate_holds_its_own_lm_head_too() -> None:
    """LitGPT's generate runs the same GPT: Qwen2.5-0.5B in bf16 holds 136,134,656 x 2 =
    272,269,312 B more weights than transformers' tied model, in /v1/budgets and in the
    solver's total alike."""
    w = {
        "kind": "inference",
        "model": QWEN05,
        "precision": {"weights": "bf16"},
        "batch_size": 1,
        "prompt_tokens": 128,
        "generated_tokens": 16,
    }
    hf, lit = (_budget(w, {"framework": f}) for f in ("transformers", "litgpt"))
    assert _lines(lit)[C.WEIGHTS] - _lines(hf)[C.WEIGHTS] == 272_269_312
    # The solver's hot path (device_subtotal) reads the same statics as the budget.
    from vrambudget.core.budget.analytic import device_subtotal
    from vrambudget.core.deployed import deploy_all
    from vrambudget.core.device import resolve_device
    from vrambudget.core.spec import DeviceRef

    h100 = {"source": "catalog", "id": "h100-sxm5-80gb"}
    r = msgspec.convert({"workloads": [w], "software": {"framework": "litgpt"}}, BudgetRequest)
    ctx = resolve_device(msgspec.convert(h100, DeviceRef), None, r.software)
    workloads, _ = deploy_all(r.workloads)
    on_h100 = _budget(w, {"framework": "litgpt"}, device=h100)
    assert device_subtotal(workloads, ctx) == on_h100.devices[0].total_bytes


def test_autogptq_exllama_scratch_counts_in_the_workspace() -> None:
    """auto-gptq 0.5.1's exllama v2 keeps one scratch buffer per device sized for its largest
    layer, temp_dq (in x out x 2 + 128) and temp_fwd (out x 2048 x 8 x 4 + 128), and q_perm /
    q_invperm (int16, in) per layer. Llama 2 7B (gate/up: in 4,096, out 11,008; per layer
    6 x 4,096 + 11,008 input features): 4,096 x 11,008 x 2 + 11,008 x 65,536 + 256 =
    811,598,080 B and 4 x 32 x 35,584 = 4,554,752 B. exllama v1 keeps temp_dq only:
    90,177,536 B. The v2 - v1 difference on 13B, (2 x 5,120 x 13,824 + 13,824 x 65,536 + 256 +
    4 x 40 x (6 x 5,120 + 13,824)) - 2 x 5,120 x 13,824 = 913,096,960 B, is what
    optimum-benchmark's A100 generate peaks show (9,708 - 8,796 = 912 MB)."""
    from vrambudget.core.formulas.runtime_workspace import exllama_scratch

    assert exllama_scratch("exllamav2", 4096, 11008) == (811_598_080, 16_384)
    assert exllama_scratch("exllama", 4096, 11008) == (90_177_536, 0)
    w = {
        "kind": "inference",
        "model": {"source": "preset", "id": "llama-2-7b"},
        "precision": {
            "weights": "fp16",
            "compute": "fp16",
            "quantization": {"scheme": "gptq", "bits": 4, "group_size": 128},
        },
        "batch_size": 1,
        "prompt_tokens": 256,
        "generated_tokens": 16,
    }

    def workspace(kernel: str | None) -> dict[str, int]:
        q = {**w["precision"]["quantization"], "kernel": kernel}
        b = _budget({**w, "precision": {**w["precision"], "quantization": q}})
        line = next(ln for ln in b.devices[0].lines if ln.component == C.RUNTIME_WORKSPACE)
        return {"total": line.bytes, **{p.name: p.bytes for p in line.parts}}

    plain, v2, v1 = workspace(None), workspace("exllamav2"), workspace("exllama")
    scratch = "quantized kernel scratch (exllama)"
    assert v2[scratch] == 811_598_080 + 4 * 32 * (6 * 4096 + 11008) == 816_152_832
    assert v1[scratch] == 90_177_536
    assert v2["total"] - plain["total"] == 816_152_832
    assert scratch not in plain
    v2_13b = exllama_scratch("exllamav2", 5120, 13824)[0] + 4 * 40 * (6 * 5120 + 13824)
    assert v2_13b - exllama_scratch("exllama", 5120, 13824)[0] == 913_096_960


def test_unsloth_keeps_the_unquantized_parameters_in_the_model_dtype() -> None:
    """Unsloth's own prepare_model_for_kbit_training casts only the LoRA adapters to fp32
    (unsloth 2024.8 models/_utils.py lines 334-351): the embeddings, head and norms of a
    QLoRA model stay bf16, as torchtune's do; plain transformers + PEFT casts them to fp32."""
    body = {**TRAIN, "method": {"kind": "qlora", "rank": 16}}
    peft = _budget(body)
    unsloth = _budget(body, {"framework": "unsloth"})
    behaviour = {b.name: b for b in unsloth.stack.behaviours}["qlora_unquantized_dtype"]
    assert "unsloth" in behaviour.source and "model's dtype" in behaviour.assumed
    assert not resolve_stack(msgspec.convert({"framework": "unsloth"}, Software)).qlora_upcast

    def weights(b: object) -> int:
        return next(x.bytes for x in b.devices[0].lines if x.component == "weights")

    # Llama 3.1 8B: embedding and head 128,256 x 4,096 each, 65 norms of 4,096, at 2 bytes
    # less each
    assert weights(peft) - weights(unsloth) == (2 * 128_256 * 4_096 + 65 * 4_096) * 2


def test_fsdp_and_deepspeed_run_the_named_transformers_releases_loss() -> None:
    """Under FSDP or DeepSpeed the model classes, and the loss their forward computes, are
    transformers': with 4.48.1 (before 4.49's label shift) the loss copies the shifted fp32
    logits, 4,096 x 128,256 x 4 = 2,101,346,304 B more in the forward than under the current
    release; LitGPT has its own model code and takes no transformers release."""
    fsdp = {**TRAIN, "parallelism": {"data": 2, "zero_stage": 3}}

    def forward(b) -> int:
        return _phases(b)["forward"]

    for framework in ("fsdp", "deepspeed"):
        old_sw = {"framework": framework, "libraries": {"transformers": "4.48.1"}}
        old = resolve_stack(msgspec.convert(old_sw, Software))
        new = resolve_stack(msgspec.convert({"framework": framework}, Software))
        assert (old.transformers_version, old.loss_shift_copy) == ("4.48.1", True)
        assert (new.transformers_version, new.loss_shift_copy) == (CURRENT["transformers"], False)
        assert forward(_budget(fsdp, old_sw)) - forward(
            _budget(fsdp, {"framework": framework})
        ) >= (4_096 * 128_256 * 4)
        named = _budget(fsdp, old_sw).stack
        assert any(
            b.name == "model_code" and "transformers 4.48.1" in b.assumed for b in named.behaviours
        )
    assert (
        resolve_stack(msgspec.convert({"framework": "litgpt"}, Software)).transformers_version
        is None
    )


def test_the_transformers_library_is_refused_where_transformers_is_the_framework() -> None:
    """Its release is ``framework_version`` there: naming it twice could disagree."""
    with pytest.raises(msgspec.ValidationError, match=r"libraries\.transformers"):
        msgspec.convert(
            {"workloads": [TRAIN], "software": {"libraries": {"transformers": "4.48.1"}}},
            BudgetRequest,
        )


def test_unsloth_fast_lora_keeps_no_bitsandbytes_inputs() -> None:
    """QLoRA on all seven Llama 3.1 projections without checkpointing, bitsandbytes 0.42
    (whose MatMul4Bit keeps its input): under transformers the fp32 adapters save their own
    copies, so bitsandbytes alone keeps the attention and MLP inputs (4,096 wide each) and the
    MLP product (14,336) -- 32 layers x 4,096 tokens x 22,528 x 2 B = 5,905,580,032 B;
    Unsloth's kernels dequantize the weights themselves, so none (unsloth 2024.8
    kernels/fast_lora.py), and the answer names the behaviour."""
    qlora = {
        **TRAIN,
        "checkpointing": "none",
        "method": {"kind": "qlora", "rank": 16, "target_modules": list(LLAMA_PROJECTIONS)},
    }
    libs = {"libraries": {"bitsandbytes": "0.42.0"}}

    def kept(b) -> int:
        line = next(x for x in b.devices[0].lines if x.component == C.ACTIVATIONS)
        return sum(
            p.bytes for p in line.parts if p.name == "4-bit layer inputs kept by bitsandbytes"
        )

    hf = _budget(qlora, {"framework": "transformers", **libs})
    unsloth = _budget(qlora, {"framework": "unsloth", **libs})
    assert kept(hf) == 5_905_580_032
    assert kept(unsloth) == 0
    assert unsloth.stack is not None and hf.stack is not None
    assert "lora_saved_tensors" in {b.name for b in unsloth.stack.behaviours}
    assert "lora_saved_tensors" not in {b.name for b in hf.stack.behaviours}


def test_unsloth_full_checkpointing_names_offloaded() -> None:
    """Unsloth's notebooks recompute with use_gradient_checkpointing="unsloth", which keeps
    layer inputs in host RAM: an Unsloth budget with `full` says so and names `offloaded`;
    `offloaded` itself and other frameworks do not."""
    lora = {**TRAIN, "method": {"kind": "lora", "rank": 16}}
    note = 'use_gradient_checkpointing="unsloth"'

    def warned(w: dict[str, Any], framework: str) -> bool:
        return any(note in x for x in _budget(w, {"framework": framework}).warnings)

    assert warned(lora, "unsloth")
    assert not warned({**lora, "checkpointing": "offloaded"}, "unsloth")
    assert not warned(lora, "transformers")


def test_unsloth_recompute_has_no_fp32_input_casts_and_one_mlp_gradient(monkeypatch) -> None:
    """The recomputed layer's backward under Unsloth's functions (every projection adapted,
    dropout 0): no fp32 adapter-input gradients (8 h per token) and the MLP's gradients written
    in place (1 f' instead of 2). The budget asks the formula so; the formula then gives, for
    Llama 3.1 8B at 4,096 tokens, bf16, fp32 adapters, 4,096 x (8 x 4,096 + 2 x 14,336) =
    251,658,240 B less than under transformers."""
    import vrambudget.core.budget.training as training
    from vrambudget.core.formulas.activations import recompute_backward_bytes

    w = {
        **TRAIN,
        "method": {
            "kind": "lora",
            "rank": 16,
            "target_modules": list(LLAMA_PROJECTIONS),
            "adapter_dtype": "fp32",
        },
    }
    calls: list[tuple] = []

    def spy(dd, tokens, e, method, fused_swiglu=False, residual=None, eager=0, peft_casts=True):
        calls.append((dd, tokens, e, method, fused_swiglu, residual, eager, peft_casts))
        return recompute_backward_bytes(
            dd, tokens, e, method, fused_swiglu, residual, eager, peft_casts=peft_casts
        )

    monkeypatch.setattr(training, "recompute_backward_bytes", spy)
    _budget(w, {"framework": "transformers"})
    _budget(w, {"framework": "unsloth"})
    _budget({**w, "method": {**w["method"], "dropout": 0.05}}, {"framework": "unsloth"})
    hf, unsloth, unpatched = calls
    assert (hf[4], hf[7]) == (False, True)
    assert (unsloth[4], unsloth[7]) == (True, False)
    assert (unpatched[4], unpatched[7]) == (False, True)  # dropout: PEFT's forward runs
    dd, tokens, e, method, _, residual, eager, _ = hf
    assert tokens == 4_096
    full = recompute_backward_bytes(dd, tokens, e, method, False, residual, eager)
    fast = recompute_backward_bytes(dd, tokens, e, method, True, residual, eager, peft_casts=False)
    assert full - fast == 251_658_240


def test_an_offloaded_optimizer_takes_the_gradient_partition_to_the_host() -> None:
    """ZeRO-Offload (and FSDP's CPU offload) move each rank's reduced gradient partition to host
    memory: Qwen2.5-0.5B full fine-tune, 2 ranks, ZeRO-2, bf16 pure: the partition
    (494,032,768 parameters x 2 B / 2 = 494,032,768 B) leaves the device, and the host item
    holds it per rank beside the two bf16 AdamW moments' partition."""
    from vrambudget.core.deployed import deploy
    from vrambudget.core.resolve import resolve_model
    from vrambudget.core.spec import TrainingWorkload
    from vrambudget.core.statics import statics_for

    def st(parallelism: dict[str, Any]):
        w = msgspec.convert({**QWEN05_FULL, "parallelism": parallelism}, TrainingWorkload)
        arch = resolve_model(w.model)
        return statics_for(deploy(w), arch, resolve_stack(None))[0]

    on = st({"data": 2, "zero_stage": 2, "offload_optimizer": True})
    off = st({"data": 2, "zero_stage": 2})
    assert off.gradient_bytes == on.host_gradient_bytes == 494_032_768
    assert on.gradient_bytes == 0 and off.host_gradient_bytes == 0
    # ZeRO-1 reduces the whole gradient after the backward: it stays on the device
    one = st({"data": 2, "zero_stage": 1, "offload_optimizer": True})
    assert one.gradient_bytes == 2 * 494_032_768 and one.host_gradient_bytes == 0
    w = {**QWEN05_FULL, "parallelism": {"data": 2, "zero_stage": 2, "offload_optimizer": True}}
    host = next(i for i in _budget(w).host_ram.items if "gradient partition" in i.item)
    assert host.bytes == 2 * (494_032_768 * 2 * 2 // 2 + 494_032_768)


def test_a_request_may_name_whether_qlora_upcasts_the_unquantized_parameters() -> None:
    """``software.qlora_upcast`` false keeps embed_tokens and lm_head in the model's dtype where
    the framework's rule is PEFT's fp32 upcast (transformers). Llama 3.1 8B in bf16, 1 x 4,096
    tokens, full checkpointing: the 1,050,939,392 unquantized parameters x (4 - 2) B =
    2,101,878,784 B less of weights, and the 32 layer inputs that full recomputation keeps go
    from fp32 to bf16: 32 x 4,096 x 4,096 x (4 - 2) = 1,073,741,824 B less. The answer names
    the rule as the request's. axolotl casts them back itself (its own rule, the same bytes),
    after a start-up upcast (a model_init phase) that ``embeddings_skip_upcast: true`` --
    ``qlora_upcast`` false -- does not run."""
    w = {**TRAIN, "precision": {"weights": "bf16"}, "method": {"kind": "qlora", "rank": 16}}
    upcast = _budget(w, {"framework": "transformers"})
    kept = _budget(w, {"framework": "transformers", "qlora_upcast": False})
    axolotl = _budget(w, {"framework": "axolotl"})
    skip = _budget(w, {"framework": "axolotl", "qlora_upcast": False})
    assert _lines(axolotl)[C.WEIGHTS] == _lines(skip)[C.WEIGHTS] == _lines(kept)[C.WEIGHTS]
    assert "model_init" in _phases(axolotl) and "model_init" not in _phases(skip)
    assert _lines(upcast)[C.WEIGHTS] - _lines(kept)[C.WEIGHTS] == 2_101_878_784

    def layer_inputs(b) -> int:
        line = next(x for x in b.devices[0].lines if x.component == C.ACTIVATIONS)
        return next(p.bytes for p in line.parts if p.name == "layer inputs (full recomputation)")

    assert layer_inputs(upcast) - layer_inputs(kept) == 32 * 4_096 * 4_096 * 2 == 1_073_741_824
    rule = next(x for x in kept.stack.behaviours if x.name == "qlora_unquantized_dtype")
    assert "software.qlora_upcast false" in rule.assumed
    # and the other way round: TRL 0.22's rule overridden
    trl = {"libraries": {"trl": "0.22.0"}}
    assert (
        _lines(_budget(w, {**trl, "qlora_upcast": True}))[C.WEIGHTS]
        == (_lines(_budget(w))[C.WEIGHTS])
    )


def test_prepare_model_for_kbit_training_is_a_model_init_phase() -> None:
    """PEFT's prepare_model_for_kbit_training casts each unquantized parameter to fp32 in turn:
    while the last large one is converted its bf16 original is live next to every fp32 copy.
    Llama 3.1 8B QLoRA in bf16: the embedding and the LM head are 128,256 x 4,096 each, so the
    phase holds the model's own bytes plus the LM head's bf16 original, 1,050,673,152 B; under
    TRL 0.22-0.24, which casts them back to bf16 before training, the model's bytes are bf16
    and the phase adds the upcast as well: 1,050,939,392 parameters x 2 B = 2,101,878,784 B.
    TRL 0.25 upcasts the norms only: no phase."""
    w = {**TRAIN, "precision": {"weights": "bf16"}, "method": {"kind": "qlora", "rank": 16}}
    head = 128_256 * 4_096 * 2
    assert head == 1_050_673_152

    def held(b) -> int:  # what every phase holds: the model, adapters and the context
        lines = _lines(b)
        return sum(
            lines.get(c, 0)
            for c in (C.WEIGHTS, C.QUANTIZATION_METADATA, C.ADAPTERS, C.CUDA_CONTEXT)
        )

    peft = _budget(w)
    assert _phases(peft)["model_init"] == held(peft) + head
    trl = _budget(w, {"libraries": {"trl": "0.24.0"}})
    assert _phases(trl)["model_init"] == held(trl) + 2_101_878_784 + head
    assert held(peft) - held(trl) == 2_101_878_784
    assert "model_init" not in _phases(_budget(w, {"libraries": {"trl": "0.25.0"}}))
    assert "model_init" not in _phases(_budget(w, {"framework": "torchtune"}))


def test_expandable_segments_take_the_expandable_replays_fractions() -> None:
    """axolotl sets ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` from 0.5.2 when torch is
    2.2 or later and the variable is unset; a request may name it either way. Llama 3.1 8B LoRA,
    1 x 4,096 tokens, full checkpointing: the analytic tier's largest transient bytes are
    7,478,444,032; the fragmentation part is ceil(7,478,444,032 x 0.26) = 1,944,395,449 B with
    fixed segments and ceil(7,478,444,032 x 0.20) = 1,495,688,807 B with expandable ones (the
    full-checkpointing grid's two medians). Nothing else changes."""

    def frag(b) -> int:
        line = next(x for x in b.devices[0].lines if x.component == C.ALLOCATOR_OVERHEAD)
        return next(p.bytes for p in line.parts if p.name == "fragmentation of transient memory")

    def segments(b) -> str:
        return next(x.assumed for x in b.stack.behaviours if x.name == "allocator_segments")

    fixed = _budget(TRAIN)
    assert fixed.devices[0].inputs["largest_transient_bytes"] == 7_478_444_032
    assert frag(fixed) == -(-7_478_444_032 * 26 // 100) == 1_944_395_449
    for on in (
        {"framework": "axolotl"},
        {"framework": "axolotl", "framework_version": "0.5.2", "torch_version": "2.2.0"},
        {"expandable_segments": True},
    ):
        b = _budget(TRAIN, on)
        assert frag(b) == -(-7_478_444_032 * 20 // 100) == 1_495_688_807, on
        assert "expandable_segments:True" in segments(b)
        if "torch_version" not in on:  # (torch 2.2 has cuBLASLt's own workspace too)
            others = {c: n for c, n in _lines(b).items() if c is not C.ALLOCATOR_OVERHEAD}
            assert others == {
                c: n for c, n in _lines(fixed).items() if c is not C.ALLOCATOR_OVERHEAD
            }
    for off in (
        {"framework": "axolotl", "framework_version": "0.5.0"},
        {"framework": "axolotl", "torch_version": "2.1.2"},
        {"framework": "axolotl", "expandable_segments": False},
    ):
        b = _budget(TRAIN, off)
        assert frag(b) == 1_944_395_449, off
        assert "fixed segments" in segments(b)
    assert "axolotl 0.5.2 train.py" in next(
        x.source
        for x in _budget(TRAIN, {"framework": "axolotl"}).stack.behaviours
        if x.name == "allocator_segments"
    )


def test_sglang_says_it_does_not_scale_its_graphs_for_an_old_driver() -> None:
    qwen = {"source": "preset", "id": "qwen3-8b"}
    a100 = {"source": "catalog", "id": "a100-sxm4-40gb"}
    w = {"kind": "llm_serving", "engine": "sglang", "model": qwen}

    def names(software):
        return {b.name: b for b in _budget(w, software, device=a100).stack.behaviours}

    assert "cuda_graph_driver" not in names(None)
    assert "cuda_graph_driver" not in names({"driver_version": "580.82.07"})
    old = names({"driver_version": "535.247.01"})["cuda_graph_driver"]
    assert "not scaled for the driver" in old.assumed and "#5517" in old.source
    # the numbers are the same either way
    plain = _budget(w, None, device=a100)
    named = _budget(w, {"driver_version": "535.247.01"}, device=a100)
    assert plain.devices == named.devices


def test_sglang_driver_note_only_where_graphs_run_on_nvidia() -> None:
    old = {"driver_version": "535.247.01"}
    qwen = {"source": "preset", "id": "qwen3-8b"}

    def names(device: str, **sglang: Any) -> set[str]:
        w = {"kind": "llm_serving", "engine": "sglang", "model": qwen}
        if sglang:
            w["sglang"] = sglang
        dev = {"source": "catalog", "id": device}
        return {b.name for b in _budget(w, old, device=dev).stack.behaviours}

    assert "cuda_graph_driver" in names("a100-sxm4-40gb")
    assert "cuda_graph_driver" not in names("a100-sxm4-40gb", disable_cuda_graph=True)
    assert "cuda_graph_driver" not in names("mi300x-192gb")


def test_gguf_accounting_names_who_places_the_layers() -> None:
    """llama.cpp from b7815 fits unset context and layers to the free memory (--fit); older
    builds take the layers as given; Ollama's own estimate (0.6.7 - 0.12.10), then its scheduler
    (0.12.11 on), then the llama-server it bundles (0.30 on) place them."""
    qwen = {"source": "preset", "id": "qwen3-8b"}
    dev = {"source": "catalog", "id": "rtx-4090-24gb"}

    def accounting(engine: str, version: str | None = None) -> str:
        w: dict[str, Any] = {"kind": "llm_serving", "engine": engine, "model": qwen}
        if version:
            w["engine_version"] = version
        s = _budget(w, device=dev).stack
        assert s.torch_version == ""
        return next(b.assumed for b in s.behaviours if b.name == "engine_accounting")

    assert "--fit (on by default)" in accounting("llama_cpp")
    assert "nothing is sized from the free memory" in accounting("llama_cpp", "b5285")
    assert "Ollama's own memory estimate" in accounting("ollama", "0.11.10")
    assert "Ollama's scheduler" in accounting("ollama", "0.15.5")
    assert "--fit (on by default)" in accounting("ollama")  # 0.30 runs llama-server
