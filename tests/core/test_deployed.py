"""The deployed format (issue 14 item 2): a checkpoint's ``torch_dtype`` and
``quantization_config`` are honoured and shown; a request field wins and a conflict is a
warning (vrambudget/core/deployed.py)."""

from __future__ import annotations

from typing import Any

import msgspec

from vrambudget.core.components import Component
from vrambudget.core.estimate import estimate
from vrambudget.core.spec import AWQ, FP8, BudgetRequest

# Qwen2.5-7B's dimensions (the qwen2.5-7b preset's config.json) with the AWQ block Qwen's
# AWQ releases carry (tests/core/test_quant_config.py QWEN3_32B_AWQ cites it).
QWEN_AWQ: dict[str, Any] = {
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "quantization_config": {
        "bits": 4,
        "group_size": 128,
        "quant_method": "awq",
        "version": "gemm",
        "zero_point": True,
        "modules_to_not_convert": None,
    },
}


def _budget(model: dict[str, Any], **workload: Any) -> Any:
    body = {"workloads": [{"kind": "inference", "model": model, **workload}]}
    req = msgspec.convert(body, BudgetRequest)
    return estimate(req.workloads)


def _weights(budget: Any) -> tuple[int, int]:
    lines = {line.component: line.bytes for line in budget.devices[0].lines}
    return lines[Component.WEIGHTS], lines[Component.QUANTIZATION_METADATA]


def test_an_awq_config_is_budgeted_as_awq() -> None:
    """28 layers of 4-bit AWQ GEMM linears (q 3584^2, k and v 512 x 3584, o 3584^2, gate/up
    18944 x 3584, down 3584 x 18944): qweight in x out/8 int32; embeddings, LM head, norms and
    the q/k/v biases in fp16 (torch_dtype)."""
    budget = _budget({"source": "hf_config", "config": QWEN_AWQ})
    fmt = budget.workloads[0].format
    assert (fmt.weights, fmt.compute, fmt.weights_from, fmt.quantization_from) == (
        "fp16",
        "fp16",
        "checkpoint",
        "checkpoint",
    )
    assert fmt.quantization.startswith("AWQ 4-bit GEMM, group 128")
    h, f, kv, layers, vocab = 3584, 18944, 512, 28, 152064
    linears = [(h, h), (kv, h), (kv, h), (h, h), (f, h), (f, h), (h, f)]
    qweight = sum(cols * rows // 8 * 4 for rows, cols in linears)
    meta = sum(cols // 128 * (rows // 8 * 4 + rows * 2) for rows, cols in linears)
    plain = 2 * vocab * h + h + (2 * h + h + 2 * kv) * layers  # embed, head, norms, q/k/v bias
    assert _weights(budget) == (layers * qweight + plain * 2, layers * meta)
    assert not budget.warnings


def test_a_request_field_wins_and_the_conflict_is_said() -> None:
    model = {"source": "hf_config", "config": QWEN_AWQ}
    none = _budget(model, precision={"quantization": None, "weights": "bf16"})
    assert none.workloads[0].format.quantization is None
    assert _weights(none)[1] == 0
    assert any("quantization_config" in w and "(none)" in w for w in none.warnings)
    assert any("precision.weights 'bf16' differs" in w for w in none.warnings)
    fp8 = _budget(model, precision={"quantization": {"scheme": "fp8"}})
    assert fp8.workloads[0].format.quantization_from == "request"
    assert any("differs from the checkpoint's quantization_config" in w for w in fp8.warnings)


def test_torch_dtype_is_honoured() -> None:
    """gpt2 and gemma-2-9b are stored fp32 (torch_dtype float32): transformers 5 loads them in
    fp32 (dtype="auto"); llama-2-7b float16; llama-3.1-8b bfloat16."""
    for preset, dtype, per_param in (
        ("gpt2", "fp32", 4),
        ("llama-2-7b", "fp16", 2),
        ("llama-3.1-8b", "bf16", 2),
    ):
        budget = _budget({"source": "preset", "id": preset})
        assert budget.workloads[0].format.weights == dtype, preset
        assert _weights(budget)[0] == budget.workloads[0].num_params * per_param, preset
    asked = _budget({"source": "preset", "id": "gpt2"}, precision={"weights": "bf16"})
    assert _weights(asked)[0] == asked.workloads[0].num_params * 2
    assert asked.workloads[0].format.weights_from == "request"


def test_the_deepseek_v3_preset_deploys_its_fp8_blocks_and_serves_on_8_h200() -> None:
    """DeepSeek-V3's checkpoint is fp8 with 128 x 128 block scales (README_WEIGHTS.md): vLLM
    detects it from the config, and 8 x H200 hold it with KV cache to spare."""
    from vrambudget.core.deployed import checkpoint_of
    from vrambudget.core.spec import PresetModel

    ckpt = checkpoint_of(PresetModel(id="deepseek-v3"))
    assert ckpt is not None and ckpt.quantization is not None
    assert ckpt.quantization.scheme == FP8(granularity="block", block_size=128)
    body = {
        "workloads": [
            {
                "kind": "llm_serving",
                "model": {"source": "preset", "id": "deepseek-v3"},
                "parallelism": {"tensor": 8},
            }
        ],
        "device": {"source": "catalog", "id": "h200-sxm-141gb"},
    }
    req = msgspec.convert(body, BudgetRequest)
    serving = estimate(req.workloads, req.device).serving
    assert serving is not None and serving.would_start and serving.kv_cache_tokens > 100_000
    body["workloads"][0]["quantization"] = None  # type: ignore[index]
    req = msgspec.convert(body, BudgetRequest)
    dequantized = estimate(req.workloads, req.device).serving
    assert dequantized is not None and not dequantized.would_start


def test_awq_scheme_equals_the_parsed_config() -> None:
    from vrambudget.core.quant_config import parse_quantization_config

    parsed = parse_quantization_config(QWEN_AWQ["quantization_config"])
    assert parsed.scheme == AWQ(bits=4, group_size=128, version="gemm")
