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
