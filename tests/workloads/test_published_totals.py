"""Published totals of real checkpoints against the framework's inventory, and the closed forms
against the framework, exact to the element and the byte.

1. Every published total (the presets' ``checkpoint`` facts in ``models.json`` and the corpus
   ``research/data/published_checkpoints.json``) equals what ``transformers`` 5.23.0 builds
   from the checkpoint's ``config.json`` on the meta device -- parameters (tied ones once) plus
   persistent buffers -- or differs by named corrections computed from the config, each with
   its reason (:data:`CORRECTIONS`). Byte totals compare with bytes: the parameters at the
   config's ``torch_dtype``, every other tensor in its own dtype.
2. Every preset's closed form (``preset_arch``) has the framework's parameter count, and the
   weights of a bf16 budget (``estimate``) are the framework's bf16 bytes; the framework path
   (an inventory resolved and budgeted) gives those bytes exactly.

Run with ``-s`` to see the table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import msgspec
import pytest

from tests.support.published import (
    FrameworkCount,
    Total,
    framework_count,
    totals,
)
from tests.support.workloads import workload
from vrambudget.core.catalog import preset_arch, presets
from vrambudget.core.components import Component
from vrambudget.core.estimate import estimate
from vrambudget.core.inventory import ModelInventory
from vrambudget.core.resolved import ResolvedModel, resolved_key
from vrambudget.workloads.hf.inventory import inventory

TOTALS = totals()
PRESET_IDS = tuple(presets())


@cache
def _inventory(config_json: str) -> ModelInventory:
    return inventory(msgspec.json.decode(config_json), profile_cache=False)


def inv_of(config: dict[str, Any]) -> ModelInventory:
    """The framework inventory of ``config`` (weights only: the cache is not profiled)."""
    return _inventory(msgspec.json.encode(config, order="sorted").decode())


# --- named corrections -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Correction:
    """published = framework + value, for one stated reason."""

    name: str
    value: int
    reason: str


Rule = Callable[[dict[str, Any], FrameworkCount], tuple[Correction, ...]]


def _mtp_module(c: dict[str, Any], _: FrameworkCount) -> tuple[Correction, ...]:
    # Source: models.json deepseek-v3 checkpoint.how (hub safetensors total 684,531,386,000 less
    # the 41,540,496 F32 weight_scale_inv block scales; counts "checkpoint").
    # DeepSeek-V3's multi-token-prediction module (modeling_deepseek.py of the checkpoint;
    # inference stacks skip layer 61): one more MoE decoder layer plus enorm, hnorm, eh_proj,
    # shared_head.norm and its own copies of embed_tokens and shared_head.head.
    h, v, heads = c["hidden_size"], c["vocab_size"], c["num_attention_heads"]
    q_rank, kv_rank = c["q_lora_rank"], c["kv_lora_rank"]
    nope, rope, vdim = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    experts, width = c["n_routed_experts"], c["moe_intermediate_size"]
    attention = (
        q_rank * h  # q_a_proj
        + q_rank  # q_a_layernorm
        + heads * (nope + rope) * q_rank  # q_b_proj
        + (kv_rank + rope) * h  # kv_a_proj_with_mqa
        + kv_rank  # kv_a_layernorm
        + heads * (nope + vdim) * kv_rank  # kv_b_proj
        + h * heads * vdim  # o_proj
    )
    moe = (
        experts * h  # gate.weight
        + experts  # gate.e_score_correction_bias
        + experts * 3 * width * h  # experts.{gate,up,down}_proj
        + 3 * c["n_shared_experts"] * width * h  # shared_experts
    )
    layer = attention + moe + 2 * h  # + input / post-attention RMSNorm
    module = layer + 2 * h + 2 * h * h + h + 2 * v * h  # enorm, hnorm, eh_proj, norm, emb, head
    return (
        Correction(
            "MTP module",
            c["num_nextn_predict_layers"] * module,
            "the checkpoint stores layer 61 (multi-token prediction), which the model skips",
        ),
    )


def _bert_model(c: dict[str, Any], _: FrameworkCount) -> tuple[Correction, ...]:
    # Source: models.json bert-*-uncased checkpoint.how (BertModel with its pooler, the count
    # BertModel.from_pretrained gives). The config's architectures[0] is BertForMaskedLM.
    h, v = c["hidden_size"], c["vocab_size"]
    return (
        Correction("pooler", h * h + h, "BertModel has pooler.dense; BertForMaskedLM has not"),
        Correction(
            "MLM head",
            -(h * h + h + 2 * h + v),
            "BertForMaskedLM's cls.predictions transform dense, its LayerNorm and decoder bias",
        ),
    )


def _llama2_inv_freq_bytes(c: dict[str, Any], _: FrameworkCount) -> tuple[Correction, ...]:
    # Source: models.json llama-2-7b checkpoint.how (model.safetensors.index.json total_size).
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    return (
        Correction(
            "stored rotary inv_freq",
            c["num_hidden_layers"] * (head_dim // 2) * 4,
            "the checkpoint stores layers.N.self_attn.rotary_emb.inv_freq (fp32); "
            "transformers computes one at load",
        ),
    )


def _fp32_revision(_: dict[str, Any], fw: FrameworkCount) -> tuple[Correction, ...]:
    # Source: gmadiyar00/tapssp-project phi-2/model.safetensors.index.json, the index of the
    # earlier microsoft/phi-2 revision whose shards are float32 (the config beside it says
    # "torch_dtype": "float32"); the current config says float16 for the same tensors.
    return (
        Correction(
            "float32 revision",
            fw.following * (4 - 2),
            "the index read is of the float32 revision: 4 bytes a parameter, not 2",
        ),
    )


def _t5_cross_attention_bias(c: dict[str, Any], _: FrameworkCount) -> tuple[Correction, ...]:
    # Source: huggingface/safetensors temp.md (per-dtype counts of the hub headers).
    return (
        Correction(
            "cross-attention relative bias",
            c["relative_attention_num_buckets"] * c["num_heads"],
            "stored decoder.block.0.layer.1.EncDecAttention.relative_attention_bias; T5 "
            "builds no relative bias for cross-attention",
        ),
    )


def _position_ids(c: dict[str, Any], _: FrameworkCount) -> tuple[Correction, ...]:
    # Source: huggingface.js parse-safetensors-metadata.spec.ts / safetensors temp.md
    # ({F32: ..., I64: 514}).
    return (
        Correction(
            "stored position_ids",
            c["max_position_embeddings"],
            "embeddings.position_ids (1, P) int64 is stored; transformers makes it non-persistent",
        ),
    )


def _pooler(c: dict[str, Any], _: FrameworkCount) -> tuple[Correction, ...]:
    # Source: huggingface/safetensors temp.md.
    h = c["hidden_size"]
    return (
        Correction(
            "stored pooler",
            h * h + h,
            "the pre-trained encoder's pooler.dense is stored; *ForMaskedLM is built "
            "with add_pooling_layer=False",
        ),
    )


def _causal_masks(c: dict[str, Any], _: FrameworkCount) -> tuple[Correction, ...]:
    # Source: huggingface/safetensors temp.md.
    return (
        Correction(
            "stored attn.bias masks",
            c["n_layer"] * c["n_positions"] ** 2,
            "the checkpoint stores h.N.attn.bias (1, 1, P, P) causal masks; transformers "
            "does not load them",
        ),
    )


def _fairseq_versions(_: dict[str, Any], __: FrameworkCount) -> tuple[Correction, ...]:
    # Source: huggingface/safetensors temp.md. The two tensors are named by a load log:
    # "Some weights of the model checkpoint at facebook/bart-large-mnli were not used when
    # initializing BartForSequenceClassification: ['model.encoder.version',
    # 'model.decoder.version']" (exact-string search hit 3684581877); fairseq stores each as
    # torch.Tensor([1]), one element (transformers' convert_bart_original_pytorch_checkpoint_
    # to_pytorch.py drops the same IGNORE_KEYS).
    return (
        Correction(
            "fairseq version tensors",
            2 * 1,
            "model.encoder.version and model.decoder.version, one element each",
        ),
    )


def _albert_heads(c: dict[str, Any], _: FrameworkCount) -> tuple[Correction, ...]:
    # Source: huggingface/safetensors temp.md. The stored names: a load log of albert-base-v2
    # lists 'predictions.bias' and 'predictions.decoder.bias' as separate unused weights
    # (exact-string search hit 33279092735), and AlbertModel loads a pooler from it.
    h, v = c["hidden_size"], c["vocab_size"]
    return (
        Correction("stored pooler", h * h + h, "AlbertForMaskedLM is built without the pooler"),
        Correction(
            "second MLM bias",
            v,
            "predictions.bias is stored beside predictions.decoder.bias; transformers ties them",
        ),
    )


def _masked_spec_embed(c: dict[str, Any], _: FrameworkCount) -> tuple[Correction, ...]:
    # Source: huggingface/safetensors temp.md. modeling_wav2vec2.py 1205-1206 creates
    # masked_spec_embed (hidden_size,) when mask_time_prob or mask_feature_prob > 0.
    assert c["mask_time_prob"] > 0
    return (
        Correction(
            "masked_spec_embed",
            -c["hidden_size"],
            "built for SpecAugment, not stored in this CTC checkpoint",
        ),
    )


def _esm_legacy_tensors(c: dict[str, Any], _: FrameworkCount) -> tuple[Correction, ...]:
    # Source: huggingface/safetensors temp.md ({F32: 7,840,842, I64: 1,026}).
    h, p = c["hidden_size"], c["max_position_embeddings"]
    half = h // c["num_attention_heads"] // 2  # rotary inv_freq: head_dim / 2 values
    return (
        Correction(
            "absolute position table",
            p * h,
            "the old checkpoint stores embeddings.position_embeddings; ESM-2 is rotary",
        ),
        Correction(
            "per-layer inv_freq",
            c["num_hidden_layers"] * half - half,
            "stored once per layer; transformers keeps one persistent esm.rotary_embeddings",
        ),
        Correction("stored position_ids", p, "(1, P) int64, non-persistent in transformers"),
    )


def _siglip_position_ids(c: dict[str, Any], _: FrameworkCount) -> tuple[Correction, ...]:
    # Source: keras-team/keras-hub SigLIP presets ("params"), a Keras port that keeps the
    # position-id index tensors as variables. Absent keys take SiglipVisionConfig's defaults
    # image_size 224, patch_size 16 and SiglipTextConfig's max_position_embeddings 64
    # (models/siglip/configuration_siglip.py 52, 98-99).
    vision, text = c["vision_config"], c["text_config"]
    patches = (vision.get("image_size", 224) // vision.get("patch_size", 16)) ** 2
    return (
        Correction(
            "Keras position-id tensors",
            patches + text.get("max_position_embeddings", 64),
            "vision (one per patch) and text position ids: non-persistent buffers here",
        ),
    )


def _vit_without_pooler(c: dict[str, Any], _: FrameworkCount) -> tuple[Correction, ...]:
    # Source: keras-team/keras-hub ViT preset vit_base_patch16_224_imagenet21k ("params").
    h = c["hidden_size"]
    return (
        Correction(
            "pooler",
            -(h * h + h),
            "the Keras backbone has no pooler; ViTModel (the config's class) has one",
        ),
    )


CORRECTIONS: dict[str, Rule] = {
    # presets (models.json)
    "deepseek-v3:num_params": _mtp_module,
    "bert-base-uncased:num_params": _bert_model,
    "bert-large-uncased:num_params": _bert_model,
    "llama-2-7b:bytes": _llama2_inv_freq_bytes,
    # corpus (research/data/published_checkpoints.json)
    "microsoft/phi-2:bytes": _fp32_revision,
    "google-t5/t5-small:num_params": _t5_cross_attention_bias,
    "google-t5/t5-base:num_params": _t5_cross_attention_bias,
    "FacebookAI/roberta-base:num_params": _position_ids,
    "FacebookAI/roberta-large:num_params": _position_ids,
    "FacebookAI/xlm-roberta-base:num_params": _pooler,
    "almanach/camembert-base:num_params": _pooler,
    "openai-community/gpt2-medium:num_params": _causal_masks,
    "openai-community/openai-gpt:num_params": _causal_masks,
    "facebook/bart-large-mnli:num_params": _fairseq_versions,
    "albert/albert-base-v2:num_params": _albert_heads,
    "facebook/wav2vec2-base-960h:num_params": _masked_spec_embed,
    "facebook/esm2_t6_8M_UR50D:num_params": _esm_legacy_tensors,
    "google/siglip-base-patch16-224:num_params": _siglip_position_ids,
    "google/siglip-base-patch16-256:num_params": _siglip_position_ids,
    "google/siglip-large-patch16-256:num_params": _siglip_position_ids,
    "google/siglip-large-patch16-384:num_params": _siglip_position_ids,
    "google/siglip-so400m-patch14-384:num_params": _siglip_position_ids,
    "google/vit-base-patch16-224-in21k:num_params": _vit_without_pooler,
}

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def _dtype_bytes(config: dict[str, Any]) -> int:
    """Bytes per parameter of the checkpoint: its ``torch_dtype`` (``dtype`` since 4.56)."""
    name = config.get("torch_dtype") or config.get("dtype")
    return _DTYPE_BYTES[str(name)]


def framework_value(t: Total, fw: FrameworkCount) -> int:
    """The framework's number in the total's unit (elements, or bytes as stored)."""
    if t.kind == "num_params":
        return fw.count
    return fw.bytes_at(_dtype_bytes(t.config), nonpersistent=False)


def corrections_of(t: Total, fw: FrameworkCount) -> tuple[Correction, ...]:
    rule = CORRECTIONS.get(t.id)
    return () if rule is None else rule(t.config, fw)


# --- 1. published totals -------------------------------------------------------------------


def test_every_correction_names_a_published_total() -> None:
    assert set(CORRECTIONS) <= {t.id for t in TOTALS}


@pytest.mark.parametrize("total", TOTALS, ids=lambda t: t.id)
def test_published_total_is_the_framework_count_plus_named_corrections(total: Total) -> None:
    fw = framework_count(inv_of(total.config))
    corrections = corrections_of(total, fw)
    assert all(c.value != 0 for c in corrections)
    assert total.value == framework_value(total, fw) + sum(c.value for c in corrections), (
        total.source
    )


# --- 2. closed forms against the framework, per preset ----------------------------------------

CLOSED_FORM_CLASS = {
    # gpt2_bert.py _bert: "BertModel with its pooler (what AutoModel loads)"; the config's
    # architectures[0] (BertForMaskedLM) differs by the MLM head (see _bert_model).
    "bert-base-uncased": "BertModel",
    "bert-large-uncased": "BertModel",
}


def _closed_form_config(pid: str) -> dict[str, Any]:
    config = dict(presets()[pid].config or {})
    if pid in CLOSED_FORM_CLASS:
        config["architectures"] = [CLOSED_FORM_CLASS[pid]]
    return config


BF16 = {"weights": "bf16", "compute": "bf16", "quantization": None}


def _weights(pid: str, model: ResolvedModel | None = None) -> tuple[int, int]:
    """(weights, quantization_metadata) of a bf16 inference budget of preset ``pid`` (or of
    ``model`` in its place), on one device."""
    w = workload(kind="inference", model={"source": "preset", "id": pid}, precision=BF16)
    if model is not None:
        w = msgspec.structs.replace(w, model=model)
    budget = estimate((w,))
    assert len(budget.devices) == 1
    lines = {line.component: line.bytes for line in budget.devices[0].lines}
    return lines[Component.WEIGHTS], lines.get(Component.QUANTIZATION_METADATA, 0)


@pytest.mark.parametrize("pid", PRESET_IDS)
def test_closed_form_parameter_count_is_the_frameworks(pid: str) -> None:
    fw = framework_count(inv_of(_closed_form_config(pid)))
    assert preset_arch(pid).num_params == fw.count


@pytest.mark.parametrize("pid", PRESET_IDS)
def test_closed_form_bf16_weights_are_the_frameworks_bytes(pid: str) -> None:
    fw = framework_count(inv_of(_closed_form_config(pid)))
    # Named correction: the closed forms leave out the buffers transformers computes at load
    # (non-persistent: rotary inv_freq, position_ids, Gemma's embed_scale), which the framework
    # path counts in the weights (a few hundred bytes to 34 KB; reported as an omission).
    computed_at_load = fw.nonpersistent_buffer_bytes
    expected = fw.bytes_at(2, nonpersistent=True) - computed_at_load
    assert _weights(pid) == (expected, 0)


def _resolved(config: dict[str, Any], name: str) -> ResolvedModel:
    inv = inv_of(config)
    return ResolvedModel(
        key=resolved_key(config, None, inv, "test"),
        name=name,
        origin="test",
        config=config,
        inventory=inv,
    )


@pytest.mark.parametrize("pid", PRESET_IDS)
def test_framework_path_bf16_weights_are_the_inventory_bytes(pid: str) -> None:
    config = dict(presets()[pid].config or {})
    fw = framework_count(inv_of(config))
    assert _weights(pid, _resolved(config, pid)) == (fw.bytes_at(2, nonpersistent=True), 0)


# --- 3. coverage and the table -----------------------------------------------------------------


def test_coverage_and_table() -> None:
    rows = []
    for t in TOTALS:
        fw = framework_count(inv_of(t.config))
        corrections = corrections_of(t, fw)
        words = ", ".join(f"{c.name} {c.value:+,}" for c in corrections) or "-"
        rows.append((t.id, t.model_type, f"{t.value:,}", f"{framework_value(t, fw):,}", words))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    print()
    print("  ".join(h.ljust(w) for h, w in zip(("checkpoint", "model_type", "published",
                                                  "framework"), widths, strict=True)),
          "correction")  # fmt: skip
    for r in rows:
        print("  ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in
                        enumerate(zip(r[:4], widths, strict=True))), r[4])  # fmt: skip
    checkpoints = {t.checkpoint for t in TOTALS}
    model_types = {t.model_type for t in TOTALS}
    print(f"{len(checkpoints)} checkpoints, {len(TOTALS)} totals, {len(model_types)} model_types")
    assert len(checkpoints) >= 60
    assert len(model_types) >= 25
