"""LoRA adapters' dtype by the stack's PEFT release (``adapter_dtype`` null): read from PEFT's
released source — 0.5.0 ``tuners/lora.py`` ``update_layer`` moves them to the weight's device
only (fp32), 0.6.x's ``lora.Linear`` has no weight yet when ``update_layer`` runs (fp32),
0.7.0 - 0.11.1 ``tuners/lora/layer.py`` casts them to a floating-point base weight's dtype,
0.12.0 ``get_peft_model(autocast_adapter_dtype=True)`` upcasts 16-bit ones to fp32 (each
release's adapters checked by get_peft_model on bf16, fp16 and fp32 bases)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from vrambudget.core.estimate import estimate
from vrambudget.core.spec import BudgetRequest, Software
from vrambudget.core.stack import resolve_stack
from vrambudget.core.statics import training_plan

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _request(
    peft: str | None,
    dtype: str | None = None,
    kind: str = "lora",
    rank: int = 64,
    parallelism: dict[str, Any] | None = None,
):
    """Llama 3.1 8B in bf16, one 1,024-token sequence, LoRA / QLoRA of ``rank``, under
    ``peft`` (None: the current release)."""
    method: dict[str, Any] = {"kind": kind, "rank": rank}
    if kind == "lora":
        method["target_modules"] = TARGETS
    if dtype is not None:
        method["adapter_dtype"] = dtype
    w: dict[str, Any] = {
        "kind": "training",
        "model": {"source": "preset", "id": "llama-3.1-8b"},
        "precision": {"weights": "bf16"},
        "micro_batch_size": 1,
        "sequence_length": 1024,
        "method": method,
    }
    if parallelism:
        w["parallelism"] = parallelism
    software = {"libraries": {"peft": peft}} if peft is not None else None
    return msgspec.convert({"workloads": [w], "software": software}, BudgetRequest)


def _budget(req: BudgetRequest):
    return estimate(req.workloads, req.device, req.headroom, None, req.software)


@pytest.mark.parametrize(
    ("peft", "kind", "expected"),
    [
        ("0.5.0", "lora", "fp32"),
        ("0.6.2", "lora", "fp32"),
        ("0.7.0", "lora", "bf16"),
        ("0.11.1", "lora", "bf16"),
        ("0.12.0", "lora", "fp32"),
        (None, "lora", "fp32"),  # the current release, 0.21.2
        ("0.8.2", "qlora", "fp32"),  # a 4-bit base's uint8 storage is not cast to
    ],
)
def test_null_adapter_dtype_follows_the_peft_release(peft, kind, expected) -> None:
    sw = msgspec.convert({"libraries": {"peft": peft}}, Software) if peft else None
    stack = resolve_stack(sw)
    quantized = kind == "qlora"
    assert stack.adapter_dtype(None, "bf16", quantized) == expected
    assert stack.adapter_dtype("fp16", "bf16", quantized) == "fp16"  # the request's wins
    names = [b for b in stack.behaviours if b.name == "lora_adapter_dtype"]
    assert len(names) == 1 and "peft" in names[0].source


def test_the_adapters_bytes_by_hand() -> None:
    """Llama 3.1 8B, r 64 on every linear projection: 32 x 64 x (2 x 8,192 + 2 x 5,120 +
    3 x 18,432) = 167,772,160 adapter parameters (hidden 4,096, K/V 1,024, MLP 14,336). With
    PEFT 0.8 they are bf16 (2 B; the request's default mixed precision then keeps fp32 masters
    of them, 4 B), with the current PEFT fp32 (4 B, no masters); AdamW's two fp32 states are
    8 B either way."""
    n = 32 * 64 * (2 * 8192 + 2 * 5120 + 3 * 18432)
    assert n == 167_772_160
    old = _budget(_request("0.8.2")).devices[0]
    new = _budget(_request(None)).devices[0]

    def line(d, name):
        return next((ln.bytes for ln in d.lines if ln.component.value == name), 0)

    assert (line(old, "adapters"), line(new, "adapters")) == (2 * n, 4 * n)
    assert (line(old, "master_weights"), line(new, "master_weights")) == (4 * n, 0)
    assert line(old, "optimizer_state") == line(new, "optimizer_state") == 8 * n
    # the explicit dtype is kept whatever the release
    pinned = _budget(_request("0.8.2", "fp32")).devices[0]
    assert line(pinned, "adapters") == 4 * n


def test_litgpt_and_torchtune_keep_the_default_and_say_so() -> None:
    for framework in ("litgpt", "torchtune"):
        stack = resolve_stack(Software(framework=framework))
        assert stack.adapter_dtype(None, "bf16", False) == "fp32"
        (b,) = [b for b in stack.behaviours if b.name == "lora_adapter_dtype"]
        assert "own LoRA" in b.assumed


def test_the_stack_decides_the_analytic_plan() -> None:
    req = _request("0.8.2")
    w = req.workloads[0]
    stack = resolve_stack(req.software)
    assert training_plan(w, stack).adapter_bytes == 2  # type: ignore[arg-type]
    assert training_plan(w, resolve_stack(None)).adapter_bytes == 4  # type: ignore[arg-type]


def test_sharded_qlora_stores_its_4bit_weights_in_a_dtype_peft_casts_to() -> None:
    """QLoRA over ZeRO-3 / FSDP stores the 4-bit weights in the model's bf16
    (``bnb_4bit_quant_storage``), a floating-point dtype, so PEFT 0.7 - 0.11 casts the adapters
    to it; on one GPU the storage is uint8 and they stay fp32."""
    from vrambudget.core.deployed import adapters_over_integers, deploy_all

    def method_dtype(parallelism: dict[str, Any]) -> str | None:
        req = _request("0.10.0", kind="qlora", rank=16, parallelism=parallelism)
        (w,) = deploy_all(req.workloads, req.software)[0]
        assert adapters_over_integers(w) == (parallelism == {})
        return w.method.adapter_dtype

    assert method_dtype({}) == "fp32"
    assert method_dtype({"data": 2, "zero_stage": 3}) == "bf16"


def test_trl_s_sft_trainer_sets_a_bitsandbytes_base_s_adapters() -> None:
    """TRL's SFTTrainer, read in its wheels: 0.26.0 ``trainer/sft_trainer.py`` lines 715-718
    (and 1.16.0 lines 908-911) cast every trainable parameter of a model transformers marks
    ``is_loaded_in_4bit`` / ``_8bit`` to bf16; 0.21.0 lines 600-626 and 0.22 - 0.25's
    ``prepare_peft_model`` pass ``autocast_adapter_dtype=False`` for sharded QLoRA only. Rank
    8 on q/k/v/o of Llama 3.1 8B: 32 x 8 x [(4,096 + 4,096) x 2 + (4,096 + 1,024) x 2] =
    6,815,744 parameters: 27,262,976 B in fp32, 13,631,488 B in bf16."""
    n = 32 * 8 * ((4096 + 4096) * 2 + (4096 + 1024) * 2)
    assert n == 6_815_744

    def adapters(
        trl: str | None,
        method: str = "qlora",
        scheme: str | None = None,
        data=1,
        framework: str = "fsdp",
        transformers: str | None = None,
    ):
        m: dict[str, Any] = {"kind": method, "rank": 8}
        w: dict[str, Any] = {
            "kind": "training",
            "model": {"source": "preset", "id": "llama-3.1-8b"},
            "precision": {"weights": "bf16", "quantization": {"scheme": scheme}}
            if scheme
            else {"weights": "bf16"},
            "micro_batch_size": 1,
            "sequence_length": 1024,
            "method": m,
        }
        if data > 1:
            w["parallelism"] = {"data": data, "zero_stage": 3}
        software: dict[str, Any] = (
            {"framework": framework} if data > 1 or framework != "fsdp" else {}
        )
        libraries = {"trl": trl, "transformers": transformers}
        if trl or transformers:
            software["libraries"] = {k: v for k, v in libraries.items() if v}
        req = msgspec.convert({"workloads": [w], "software": software or None}, BudgetRequest)
        b = _budget(req)
        names = {x.name for x in b.stack.behaviours}
        line = next(ln.bytes for ln in b.devices[0].lines if ln.component.value == "adapters")
        return line, "trl_quantized_adapter_dtype" in names

    # 0.26 on: bf16 over a bitsandbytes base, one GPU or sharded, 4-bit or LLM.int8.
    assert adapters("1.16.0") == (2 * n, True)
    assert adapters("1.16.0", "lora", "int8") == (2 * n, True)
    # GPTQ is not loaded through bitsandbytes; an unquantized base neither: PEFT's fp32.
    assert adapters("1.16.0", "lora", "gptq") == (4 * n, False)
    assert adapters("1.16.0", "lora") == (4 * n, False)
    # 0.21 - 0.25: the model's bf16 for sharded QLoRA only; no TRL named: PEFT's fp32.
    assert adapters("0.24.0") == adapters("0.9.6") == (4 * n, True)
    assert adapters("0.8.6") == (4 * n, False)  # not read: PEFT's rule
    sharded_fp32, named = adapters(None, data=2)
    assert not named
    assert adapters("0.24.0", data=2) == adapters("0.26.0", data=2) == (sharded_fp32 // 2, True)
    # TRL calls QLoRA sharded when its 4-bit data sits on the host at preparation: under
    # DeepSpeed ZeRO-3 transformers 4.39 - 4.x sends it there, 5.x leaves it on the device.
    ds = {"data": 2, "framework": "deepspeed"}
    assert adapters("0.24.0", transformers="4.46.3", **ds)[0] == sharded_fp32 // 2
    assert adapters("0.24.0", transformers="5.23.0", **ds)[0] == sharded_fp32
    # axolotl trains through transformers' Trainer, not TRL's SFTTrainer.
    assert adapters("1.16.0", framework="axolotl") == (4 * n, False)
