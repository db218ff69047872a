"""vLLM speculative decoding (vrambudget/core/serving/speculative.py): the drafter's weights,
its layers' KV cache in the target's pool and its CUDA graphs, on the last stage."""

from __future__ import annotations

import msgspec
import pytest

from tests.support.workloads import serving_budget
from vrambudget.core.catalog import preset_arch
from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.serving.vllm import account
from vrambudget.core.spec import BudgetRequest, LLMServingWorkload
from vrambudget.core.units import GiB

H100 = {"source": "catalog", "id": "h100-sxm5-80gb"}
# An EAGLE-1 head for Llama 3.1 8B (yuhuili/EAGLE-LLaMA3.1-Instruct-8B's shapes): one Llama
# decoder layer of the target's dimensions.
EAGLE = {
    "source": "dimensions",
    "name": "eagle-llama3.1-8b",
    "hidden_size": 4096,
    "num_layers": 1,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
}


def serving(model: str, **fields: object) -> LLMServingWorkload:
    return msgspec.convert(
        {"kind": "llm_serving", "model": {"source": "preset", "id": model}, **fields},
        LLMServingWorkload,
    )


def _pair(model: str, spec: dict, **fields: object):
    base = account(serving(model, **fields), preset_arch(model), 80 * GiB, "H100")
    spec_ = account(
        serving(model, speculative=spec, **fields), preset_arch(model), 80 * GiB, "H100"
    )
    return base, spec_


def test_ngram_takes_no_memory() -> None:
    """NgramProposer matches the prompt on the CPU: a published A/B pair on vLLM 0.18.0 (Qwen3-8B,
    eager) logs the same weights, KV memory and 143,872 tokens with and without it."""
    base, ng = _pair(
        "llama-3.1-8b",
        {"method": "ngram", "num_speculative_tokens": 4},
        max_model_len=8192,
        engine_version="0.19.0",
    )
    assert ng.kv_tokens == base.kv_tokens
    assert ng.stages[0].weights_memory_bytes == base.stages[0].weights_memory_bytes
    assert ng.stages[0].cuda_graph_bytes == base.stages[0].cuda_graph_bytes


def test_an_eagle_head_by_hand() -> None:
    """Llama 3.1 8B + an EAGLE-1 head on one H100, vLLM 0.19.0 (block 16). The head's weights:
    one decoder layer (q, o 4,096 x 4,096; k, v 1,024 x 4,096; gate, up, down 4,096 x 14,336; the
    post-attention norm, 4,096: the first layer has no input norm) and fc 8,192 x 4,096, bf16:
    (218,103,808 + 4,096 + 33,554,432) x 2 = 503,324,672 B. Its attention layer joins the
    target's group: 33 layers of 2 x 16 x 8 x 128 x 2 = 65,536 B pages."""
    base, ea = _pair(
        "llama-3.1-8b",
        {"method": "eagle", "num_speculative_tokens": 3, "model": EAGLE},
        max_model_len=8192,
        engine_version="0.19.0",
    )
    head = (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 4096 * 14336 + 4096 + 8192 * 4096) * 2
    assert head == 503_324_672
    s, b = ea.stages[0], base.stages[0]
    assert s.draft_weights_bytes == head
    assert s.weights_memory_bytes - b.weights_memory_bytes == head
    assert ea.groups.stage_group_size(0) == 33
    assert ea.num_blocks == max(s.available_bytes, 0) // 65_536 // 33
    assert ea.kv_tokens == ea.num_blocks * 16
    # The budget lost the head, and its graphs where the release counts graphs in the budget.
    lost = b.available_bytes - s.available_bytes
    graphs = s.draft_graph_bytes if ea.resolved.cal.cudagraph_in_budget else 0
    assert lost == head + graphs
    assert (
        s.draft_graph_bytes > 0 and s.cuda_graph_bytes == b.cuda_graph_bytes + s.draft_graph_bytes
    )


def test_a_draft_model_loads_whole_on_the_last_stage() -> None:
    """Llama 3.1 70B with Llama 3.1 8B as its draft model over 4 GPUs, 2 pipeline stages:
    the draft (8,030,261,248 parameters, bf16, tensor-parallel over 2) sits on the last stage
    only, its 32 layers with the target's KV layout (8 KV heads x 128, 4 per GPU) after the
    last stage's 40."""
    fields = {
        "max_model_len": 8192,
        "engine_version": "0.19.0",
        "parallelism": {"tensor": 2, "pipeline": 2},
    }
    spec = {
        "method": "draft_model",
        "num_speculative_tokens": 3,
        "model": {"source": "preset", "id": "llama-3.1-8b"},
    }
    base, dm = _pair("llama-3.1-70b", spec, **fields)
    first, last = dm.stages
    assert first.draft_weights_bytes == 0 and first.draft_graph_bytes == 0
    # per GPU: the vocabulary-split embedding and head, each layer's column/row halves
    layer = (4096 * 4096 + 1024 * 4096) + 3 * 4096 * 14336 // 2 + 2 * 4096
    per_gpu = (2 * 128_256 * 4096 // 2 + 32 * layer + 4096) * 2
    assert last.draft_weights_bytes == per_gpu
    assert dm.groups.stage_layers == ((0, 40), (40, 112))
    assert dm.groups.stage_group_size(1) == 72 and dm.groups.stage_group_size(0) == 40
    assert first.available_bytes == base.stages[0].available_bytes


@pytest.mark.parametrize(
    ("spec", "version", "model", "field", "words"),
    [
        (
            {
                "method": "draft_model",
                "num_speculative_tokens": 3,
                "model": {"source": "preset", "id": "llama-3.1-8b"},
            },
            "0.14",
            "llama-3.1-70b",
            "speculative.method",
            "from 0.15",
        ),
        (
            {
                "method": "draft_model",
                "num_speculative_tokens": 3,
                "model": {"source": "preset", "id": "qwen2.5-0.5b"},
            },
            "0.19.0",
            "qwen2.5-32b",
            "speculative.model",
            "2 KV heads x 64",
        ),
        (
            {"method": "eagle", "num_speculative_tokens": 3},
            "0.19.0",
            "llama-3.1-8b",
            "speculative.model",
            "needs the drafter's model",
        ),
        (
            {
                "method": "eagle",
                "num_speculative_tokens": 3,
                "model": {"source": "hub", "id": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B"},
            },
            "0.19.0",
            "llama-3.1-8b",
            "speculative.model",
            "needs resolving",
        ),
    ],
)
def test_what_is_not_run_or_not_modelled_is_refused(spec, version, model, field, words) -> None:
    with pytest.raises(InvalidWorkload) as e:
        account(
            serving(model, speculative=spec, engine_version=version),
            preset_arch(model),
            80 * GiB,
            "H100",
        )
    assert e.value.field == field and words in e.value.message


@pytest.mark.parametrize(
    ("workload", "words"),
    [
        (
            {"engine": "sglang", "speculative": {"method": "ngram", "num_speculative_tokens": 2}},
            "engine 'vllm' only",
        ),
        (
            {
                "speculative": {
                    "method": "ngram",
                    "num_speculative_tokens": 2,
                    "model": {"source": "preset", "id": "llama-3.1-8b"},
                }
            },
            "takes no draft model",
        ),
        ({"speculative": {"method": "eagle", "num_speculative_tokens": 0}}, ">= 1"),
    ],
)
def test_bad_settings_fail_validation(workload, words) -> None:
    req = {
        "workloads": [
            {"kind": "llm_serving", "model": {"source": "preset", "id": "llama-3.1-8b"}, **workload}
        ],
        "device": H100,
    }
    with pytest.raises(msgspec.ValidationError, match=words):
        msgspec.convert(req, BudgetRequest)


def test_the_answer_itemizes_the_drafter_and_launches_it() -> None:
    spec = {"method": "eagle", "num_speculative_tokens": 3, "model": EAGLE}
    b = msgspec.to_builtins(
        serving_budget(
            "h100-sxm5-80gb", max_model_len=8192, engine_version="0.19.0", speculative=spec
        )
    )
    (dev,) = b["devices"]
    weights = next(ln for ln in dev["lines"] if ln["component"] == "weights")
    names = {p["name"]: p["bytes"] for p in weights["parts"]}
    assert names["EAGLE head: fc (2 x hidden -> hidden)"] == 8192 * 4096 * 2
    graphs = next(ln for ln in dev["lines"] if ln["component"] == "runtime_workspace")
    assert any(p["name"].startswith("the drafter's CUDA graphs") for p in graphs["parts"])
    assert (
        '--speculative-config \'{"method": "eagle", "model": "eagle-llama3.1-8b", '
        '"num_speculative_tokens": 3}\''
    ) in b["serving"]["launch"]
    (beh,) = [x for x in b["stack"]["behaviours"] if x["name"] == "speculative_decoding"]
    assert "shares the target's embedding" in beh["assumed"]


def test_an_eagle3_head_by_hand() -> None:
    """An EAGLE-3 head for Llama 3.1 8B (one layer, a 32,000-token draft vocabulary) on one
    H100, vLLM 0.19.0, bf16: the layer (218,112,000 parameters) plus its wider qkv input
    ((32 + 2 x 8) x 128 rows over 4,096 more columns) and hidden_norm (4,096); fc 12,288 x
    4,096; the final norm; its LM head 32,000 x 4,096 (a multiple of 64 already); the int64
    draft-to-target map of 32,000 tokens."""
    spec = {
        "method": "eagle3",
        "num_speculative_tokens": 3,
        "model": {**EAGLE, "name": "eagle3-llama3.1-8b"},
        "draft_vocab_size": 32000,
    }
    _, e3 = _pair("llama-3.1-8b", spec, max_model_len=8192, engine_version="0.19.0")
    layer = (218_112_000 + 6_144 * 4_096 + 4_096) * 2
    expected = layer + 12_288 * 4_096 * 2 + 4_096 * 2 + 32_000 * 4_096 * 2 + 8 * 32_000
    assert expected == 849_635_328
    assert e3.stages[0].draft_weights_bytes == expected
    assert e3.groups.stage_group_size(0) == 33


def test_an_eagle_head_keeps_its_own_embedding_under_pipeline_parallelism() -> None:
    """EagleProposer shares the target's embedding only when there is one pipeline stage
    (get_pp_group().world_size == 1): over 2 stages and TP 2 the head keeps its own, 128,256 x
    4,096 split over 2 GPUs."""
    spec = {"method": "eagle", "num_speculative_tokens": 3, "model": EAGLE}
    one = account(
        serving(
            "llama-3.1-8b",
            speculative=spec,
            engine_version="0.19.0",
            max_model_len=8192,
            parallelism={"tensor": 2},
        ),
        preset_arch("llama-3.1-8b"),
        80 * GiB,
        "H100",
    )
    two = account(
        serving(
            "llama-3.1-8b",
            speculative=spec,
            engine_version="0.19.0",
            max_model_len=8192,
            parallelism={"tensor": 2, "pipeline": 2},
        ),
        preset_arch("llama-3.1-8b"),
        80 * GiB,
        "H100",
    )
    assert two.stages[1].draft_weights_bytes - one.stages[0].draft_weights_bytes == (
        128_256 * 4_096 // 2 * 2
    )
    assert two.stages[0].draft_weights_bytes == 0


def _deepseek(layers: int | None = None, **fields: object) -> tuple[LLMServingWorkload, object]:
    from vrambudget.core.catalog import preset
    from vrambudget.core.resolve import resolve_model

    config = dict(preset("deepseek-v3").config or {})
    if layers is not None:
        config["num_hidden_layers"] = layers
    w = msgspec.convert(
        {
            "kind": "llm_serving",
            "model": {"source": "hf_config", "config": config},
            "engine_version": "0.19.0",
            "max_model_len": 8192,
            "parallelism": {"tensor": 8},
            **fields,
        },
        LLMServingWorkload,
    )
    return w, resolve_model(w.model)


def test_deepseek_v3_mtp_by_hand() -> None:
    """DeepSeek-V3's MTP module (num_nextn_predict_layers 1) over 8 H200s: its decoder layer is
    one more of the target's MoE layers, fp8 as they are (checked against the same model with 62
    layers: what the 62nd adds to each GPU's weights and scales); beside it, by hand in bf16:
    enorm, hnorm and the shared head's norm (3 x 7,168), eh_proj 14,336 x 7,168 (replicated),
    the shared head's own LM head, 129,280 x 7,168 over 8 GPUs. Its MLA layer takes one more page
    per block; the launch names it deepseek_mtp (0.10's name, which 0.34 maps to mtp)."""
    total = 141 * GiB
    w, arch = _deepseek()
    assert arch.mtp_layers == 1
    w_mtp, _ = _deepseek(speculative={"method": "mtp", "num_speculative_tokens": 1})
    w62, arch62 = _deepseek(layers=62)
    base = account(w, arch, total, "NVIDIA H200")
    mtp = account(w_mtp, arch, total, "NVIDIA H200")
    one_more = account(w62, arch62, total, "NVIDIA H200")
    s0, s1, s62 = base.stages[0], mtp.stages[0], one_more.stages[0]
    layer = (s62.weights_bytes + s62.metadata_bytes) - (s0.weights_bytes + s0.metadata_bytes)
    hand = 3 * 7_168 * 2 + 14_336 * 7_168 * 2 + 129_280 // 8 * 7_168 * 2
    assert s1.draft_weights_bytes == layer + hand
    assert mtp.groups.stage_group_size(0) == 62
    b = msgspec.to_builtins(
        serving_budget(
            "h200-sxm-141gb",
            "deepseek-v3",
            engine_version="0.19.0",
            max_model_len=8192,
            parallelism={"tensor": 8},
            speculative={"method": "mtp", "num_speculative_tokens": 1},
        )
    )
    assert '"method": "deepseek_mtp"' in b["serving"]["launch"]


def test_mtp_needs_a_model_that_has_the_module() -> None:
    with pytest.raises(InvalidWorkload) as e:
        account(
            serving("llama-3.1-8b", speculative={"method": "mtp", "num_speculative_tokens": 1}),
            preset_arch("llama-3.1-8b"),
            80 * GiB,
            "H100",
        )
    assert e.value.field == "speculative.method" and "num_nextn_predict_layers" in e.value.message


def test_a_latency_answer_says_speculation_is_not_modelled() -> None:
    from vrambudget.core.fit import fit
    from vrambudget.core.spec import FitRequest

    req = msgspec.convert(
        {
            "workloads": [
                {
                    "kind": "llm_serving",
                    "model": {"source": "preset", "id": "llama-3.1-8b"},
                    "max_model_len": 8192,
                    "speculative": {"method": "ngram", "num_speculative_tokens": 3},
                }
            ],
            "devices": [H100],
            "latency_target": {"time_per_output_token_ms": 30},
        },
        FitRequest,
    )
    (layout, *_) = fit(req).gpus[0].layouts
    assert layout.latency is not None
    assert any("speculative decoding is not modelled" in x for x in layout.warnings)
