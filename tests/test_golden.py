"""Numbers with an exact answer, each against an independent hand computation (the expected
values are written out, not computed by the code under test)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from vrambudget.core.activations import device_dims, training_saved
from vrambudget.core.catalog import preset_arch
from vrambudget.core.components import Component
from vrambudget.core.estimate import estimate, statics_for, training_activations
from vrambudget.core.quantization import tensor_storage
from vrambudget.core.resolve import resolve_model
from vrambudget.core.spec import AWQ, FP8, GPTQ, BitsAndBytes4bit, DimensionsModel, Int8

from .helpers import workload

C = Component


def lines(budget, index=None):
    device = budget.devices[budget.most_loaded if index is None else index]
    return {line.component: line.bytes for line in device.lines}


def infer(model_id, **kw):
    return workload(kind="inference", model={"source": "preset", "id": model_id}, **kw)


def train(model_id, **kw):
    return workload(kind="training", model={"source": "preset", "id": model_id}, **kw)


def test_llama2_7b_parameters_and_bf16_weights():
    # Meta's Llama-2-7b-hf checkpoint: 6,738,415,616 parameters; bf16 = 2 bytes each.
    assert preset_arch("llama-2-7b").num_params == 6_738_415_616
    assert lines(estimate((infer("llama-2-7b"),)))[C.WEIGHTS] == 13_476_831_232


def test_llama31_8b_kv_cache_is_131072_bytes_per_token():
    # 32 layers x 2 (K, V) x 8 KV heads x 128 head_dim x 2 bytes = 131,072 B per token.
    one = infer("llama-3.1-8b", prompt_tokens=1000, generated_tokens=24)
    assert lines(estimate((one,)))[C.KV_CACHE] == 131_072 * 1024
    many = infer("llama-3.1-8b", prompt_tokens=1000, generated_tokens=24, batch_size=3,
                 concurrent_requests=5)
    assert lines(estimate((many,)))[C.KV_CACHE] == 131_072 * 1024 * 15


def test_fp8_kv_cache_halves_bytes():
    w = infer("llama-3.1-8b", prompt_tokens=4096, generated_tokens=0,
              precision={"kv_cache": "fp8_e4m3"})
    assert lines(estimate((w,)))[C.KV_CACHE] == 65_536 * 4096


def test_mla_kv_cache_is_the_latent():
    # DeepSeek-V3: 61 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 bytes = 70,272 B.
    w = infer("deepseek-v3", prompt_tokens=100, generated_tokens=0, parallelism={"tensor": 8})
    assert lines(estimate((w,)))[C.KV_CACHE] == 70_272 * 100


def test_sliding_window_layers_cap_at_the_window():
    # Gemma 2 9B: 42 layers alternating sliding (4096) / global; 16 KV heads? No: 8 KV heads,
    # head_dim 256 -> 2 x 8 x 256 x 2 = 8,192 B per token per layer.
    w = infer("gemma-2-9b", prompt_tokens=8000, generated_tokens=0)
    per_layer_token = 2 * 8 * 256 * 2
    expected = 21 * per_layer_token * 8000 + 21 * per_layer_token * 4096
    assert lines(estimate((w,)))[C.KV_CACHE] == expected


PSI = 6_738_415_616  # Llama-2-7B


@pytest.mark.parametrize(
    ("stage", "expected"),
    [
        # Rajbhandari et al. 2020, Fig. 1: mixed-precision Adam keeps 2 (fp16 params) + 2
        # (grads) + 12 (fp32 params, momentum, variance) bytes per parameter.
        (0, 16 * PSI),
        (1, 4 * PSI + 12 * PSI // 8),
        (2, 2 * PSI + 14 * PSI // 8),
        (3, 16 * PSI // 8),
    ],
)
def test_zero_model_states(stage, expected):
    w = train("llama-2-7b", gradient_accumulation_steps=2,
              parallelism={"data": 8, "zero_stage": stage})
    # The persistent model states (the optimizer step adds fp32 gradients and temporaries on
    # top, see test_trace_oracle.py).
    (st,) = statics_for(w, resolve_model(w.model))
    total = st.weights_bytes + st.gradient_bytes + st.master_bytes + st.optimizer_bytes
    assert total == expected


# Korthikanti et al. 2022, Table 3 configurations (sequence 2048, tensor parallel 8).
TABLE3 = [
    ("22B", 64, 6144, 48),
    ("175B", 96, 12288, 96),
    ("530B", 128, 20480, 105),
    ("1T", 160, 25600, 128),
]


def _gpt(h, a, layers):
    return resolve_model(DimensionsModel(hidden_size=h, num_layers=layers,
                                         num_attention_heads=a, intermediate_size=4 * h,
                                         vocab_size=51200, mlp="dense", norm="layernorm"))


def _per_layer(arch, t, *, sp, selective, s=2048, b=1):
    layer = arch.layer_runs[0][0]
    saved = training_saved(layer, arch, device_dims(arch, t, 1), seq=s, batch=b, e=2,
                           attention="eager", dropout=True, sequence_parallel=sp,
                           drop_scores=selective)
    return sum(saved.values())


@pytest.mark.parametrize(("name", "a", "h", "layers"), TABLE3)
def test_korthikanti_table2(name, a, h, layers):
    arch = _gpt(h, a, layers)
    s, b, t = 2048, 1, 8
    sbh = s * b * h
    r = Fraction(a * s, h)

    def exact(x):
        assert x.denominator == 1
        return int(x)

    # Table 2 rows: activations memory per transformer layer (bytes). The paper's 5as/h term is
    # softmax output (2) + dropout mask (1) + dropout output (2) bytes per score with Megatron's
    # fused fp16 softmax; the eager attention here is transformers', whose softmax runs in fp32
    # and is cast back, keeping 4 more bytes per score (9as/h). Without the s^2 term (selective
    # rows) the paper's numbers hold exactly.
    assert _per_layer(arch, 1, sp=False, selective=False) == exact(sbh * (34 + 9 * r))
    assert _per_layer(arch, t, sp=False, selective=False) == exact(
        sbh * (10 + Fraction(24, t) + 9 * r / t))
    assert _per_layer(arch, t, sp=True, selective=False) == exact(
        sbh * (Fraction(34, t) + 9 * r / t))
    assert _per_layer(arch, t, sp=False, selective=True) == exact(sbh * (10 + Fraction(24, t)))
    assert _per_layer(arch, t, sp=True, selective=True) == exact(sbh * Fraction(34, t))


def test_full_recompute_keeps_2sbh_per_layer():
    arch_layers = 48
    w = workload(kind="training", model={"source": "dimensions", "hidden_size": 6144,
                 "num_layers": arch_layers, "num_attention_heads": 64,
                 "intermediate_size": 4 * 6144, "vocab_size": 51200, "mlp": "dense",
                 "norm": "layernorm"}, precision={"weights": "fp16", "compute": "fp16"},
                 sequence_length=2048, micro_batch_size=1, checkpointing="full",
                 attention="eager", dropout=True)
    arch = resolve_model(w.model)
    (st,) = statics_for(w, arch)
    _, _, parts = training_activations(w, arch, st)
    assert dict(parts)["layer inputs (full recomputation)"] == 48 * 2 * 2048 * 6144


def test_gptq_awq_bnb_fp8_int8_storage_of_a_4096_square():
    rows = cols = 4096
    # GPTQ 4-bit g128: qweight 512 x 4096 int32; qzeros 32 x 512 int32; scales 32 x 4096 fp16;
    # g_idx 4096 int32.
    assert tensor_storage(GPTQ(), rows, cols, 1) == (8_388_608, 65_536 + 262_144 + 16_384)
    # AWQ 4-bit g128: qweight 4096 x 512 int32; qzeros 32 x 512 int32; scales 32 x 4096 fp16.
    assert tensor_storage(AWQ(), rows, cols, 1) == (8_388_608, 65_536 + 262_144)
    # NF4, blocksize 64: 8,388,608 packed bytes; 262,144 fp32 absmax; 16-entry fp32 code.
    assert tensor_storage(BitsAndBytes4bit(), rows, cols, 1) == (8_388_608, 1_048_576 + 64)
    # Double quantization: uint8 absmax (262,144) + fp32 per 256 blocks (1,024 x 4) + offset.
    assert tensor_storage(BitsAndBytes4bit(double_quant=True), rows, cols, 1) == (
        8_388_608, 262_144 + 4_096 + 4 + 64)
    assert tensor_storage(FP8(), rows, cols, 1) == (16_777_216, 4)
    assert tensor_storage(FP8(granularity="block"), rows, cols, 1) == (16_777_216, 32 * 32 * 4)
    assert tensor_storage(Int8(), rows, cols, 1) == (16_777_216, 4096 * 4)


def test_gptq_llama2_7b_weights_exact():
    # Hand count: 32 layers x (4 attention 4096^2 + 3 MLP 4096x11008) linear weights at 0.5 B
    # each, the rest (embeddings, lm_head, norms) stay bf16.
    w = infer("llama-2-7b", precision={"quantization": {"scheme": "gptq"}})
    linear = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)
    other = 6_738_415_616 - linear
    assert lines(estimate((w,)))[C.WEIGHTS] == linear // 2 + other * 2


def test_tensor_parallel_splits_heads_and_replicates_norms():
    base = lines(estimate((infer("llama-3.1-8b"),)))[C.WEIGHTS]
    tp2 = lines(estimate((infer("llama-3.1-8b", parallelism={"tensor": 2}),)))[C.WEIGHTS]
    norms = (32 * 2 + 1) * 4096 * 2  # RMSNorm weights, replicated, bf16
    assert tp2 == (base - norms) // 2 + norms


def test_zero3_shards_a_frozen_lora_base():
    # ZeRO-3 / FSDP FULL_SHARD partition every parameter, trainable or not: bf16 Llama-2-70B
    # base over 8 ranks = 68,976,648,192 x 2 / 8 bytes per device.
    w = train("llama-2-70b", method={"kind": "lora"}, parallelism={"data": 8, "zero_stage": 3})
    assert lines(estimate((w,)))[C.WEIGHTS] == 68_976_648_192 * 2 // 8


def test_expert_parallel_needs_devices_that_exist():
    from vrambudget.core.errors import InvalidWorkload

    with pytest.raises(InvalidWorkload, match="must divide tensor x data"):
        estimate((infer("mixtral-8x7b", parallelism={"expert": 8}),))
    # EP 2 within TP 2: each device holds 4 of the 8 experts of every layer, whole.
    one = lines(estimate((infer("mixtral-8x7b", parallelism={"tensor": 2, "expert": 2}),)))
    full = lines(estimate((infer("mixtral-8x7b"),)))
    experts = 32 * 8 * 3 * 4096 * 14336 * 2  # routed expert weights, bf16
    assert one[C.WEIGHTS] == (full[C.WEIGHTS] - experts) // 2 + experts // 2 + (
        32 * 2 + 1) * 4096 * 2 // 2 + 32 * 8 * 4096 * 2 // 2


def test_interleaving_with_one_chunk_is_plain_1f1b():
    def stage0(schedule, v):
        w = train("llama-2-13b", gradient_accumulation_steps=8,
                  parallelism={"pipeline": 4, "pipeline_schedule": schedule,
                               "virtual_stages": v})
        return lines(estimate((w,)), 0)[C.ACTIVATIONS]

    assert stage0("interleaved_1f1b", 1) == stage0("1f1b", 1)
    # Narayanan et al. 2021: 1 + (p - 1) / (p v) more in-flight activation memory, v = 2.
    assert stage0("interleaved_1f1b", 2) > stage0("1f1b", 1)
