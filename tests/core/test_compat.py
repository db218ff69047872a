"""Compatibility verdicts: one case per rule, from the cases of issue 18 (FlashAttention on a
T4, QLoRA on an RX 7900 XTX, AWQ on a V100, a B200 with CUDA 11.8 or driver 470, MXFP4/NVFP4
before Blackwell, bf16 on a V100, fp8 on an A100), through the entry points a caller uses."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
import pytest

from vrambudget.core import compat
from vrambudget.core import fit as fit_module
from vrambudget.core.compat import needs_of, torch_cuda
from vrambudget.core.device import resolve_device
from vrambudget.core.estimate import estimate
from vrambudget.core.fit import fit
from vrambudget.core.result import Compatibility, RuleOutcome
from vrambudget.core.spec import BudgetRequest, FitRequest, TrainingWorkload

LLAMA = {"source": "preset", "id": "llama-3.1-8b"}


def _budget(workload: dict[str, Any], gpu: str, software: dict[str, Any] | None = None) -> Any:
    body: dict[str, Any] = {"workloads": [workload], "device": {"source": "catalog", "id": gpu}}
    if software is not None:
        body["software"] = software
    req = msgspec.json.decode(msgspec.json.encode(body), type=BudgetRequest)
    return estimate(req.workloads, req.device, req.headroom, None, req.software)


def _verdict(workload: dict[str, Any], gpu: str, software: dict[str, Any] | None = None):
    c = _budget(workload, gpu, software).compatibility
    assert isinstance(c, Compatibility)
    return c


def _check(c: Compatibility, rule: str) -> RuleOutcome:
    (found,) = [o for o in c.checks if o.rule == rule]
    return found


def _without_gfx(workload: dict[str, Any], gpu: str) -> Compatibility:
    """The verdict on a catalog GPU's facts with its gfx target unknown."""
    body = {"workloads": [workload], "device": {"source": "catalog", "id": gpu}}
    req = msgspec.json.decode(msgspec.json.encode(body), type=BudgetRequest)
    ctx = resolve_device(req.device)
    assert ctx is not None
    facts = dataclasses.replace(compat.device_facts(ctx), gfx=None)
    return compat.evaluate(needs_of(req.workloads, req.software), facts)


TRAIN = {"kind": "training", "model": LLAMA, "sequence_length": 512, "attention": "flash"}
INFER = {"kind": "inference", "model": LLAMA, "prompt_tokens": 128, "generated_tokens": 16}
CUDA12 = {"torch_version": "2.10.0"}  # PyPI: CUDA 12.8, which still targets Volta


# ------------------------------------------------------------------- FlashAttention ----


@pytest.mark.parametrize("gpu", ["t4-16gb", "v100-sxm2-32gb"])
def test_flash_attention_before_ampere_is_unsupported_use_sdpa(gpu):
    c = _verdict({**TRAIN, "attention": "flash"}, gpu, CUDA12)
    assert c.verdict == "unsupported"
    o = _check(c, "flash_attention.cuda_arch")
    assert o.verdict == "unsupported"
    assert "needs Ampere or newer (sm80+)" in o.reason
    assert o.remedy == "attention: sdpa (or eager)"
    assert "FlashAttention only supports Ampere GPUs or newer." in o.source


def test_flash_attention_on_a100_and_sdpa_on_t4_are_supported():
    assert _check(_verdict(TRAIN, "a100-sxm4-80gb"), "flash_attention.cuda_arch").verdict == (
        "supported"
    )
    c = _verdict({**TRAIN, "attention": "sdpa"}, "t4-16gb")
    assert c.verdict == "supported" and not [o for o in c.checks if "flash" in o.rule]


def _math(workload: dict[str, Any], gpu: str, software: dict[str, Any] | None = None) -> list[Any]:
    return [o for o in _verdict(workload, gpu, software).checks if o.rule == "attention.sdpa_math"]


FP16 = {"weights": "fp16", "compute": "fp16"}


@pytest.mark.parametrize("kind", ["training", "inference"])
def test_sdpa_without_a_fused_kernel_says_it_runs_the_math_path(kind):
    """torch's SDPA takes grouped-query heads with its flash kernel (sm80+, 16-bit) or the math
    path only, and transformers calls it with enable_gqa when there is no mask; below sm80 its
    memory-efficient kernel takes no bf16. Llama 3.1 8B has 8 key/value heads for 32 query
    heads; GPT-2 has none grouped; Gemma 2 is soft-capped (eager already)."""
    workload = TRAIN if kind == "training" else INFER
    plain = {k: v for k, v in workload.items() if k != "attention"}
    fp16 = {**plain, "precision": FP16}
    torch_2_13 = {"torch_version": "2.13.0"}  # torch 2.14's memory-efficient kernel takes GQA
    (o,) = _math(fp16, "t4-16gb", torch_2_13)
    assert o.verdict == "supported" and "math path" in o.reason
    assert "32 query heads on 8 K/V heads" in o.reason and "sm75" in o.reason
    assert "check_batch_size_and_num_heads_dense<false>" in o.source
    assert any("math path" in w for w in _budget(fp16, "t4-16gb", torch_2_13).warnings)
    fp32 = {**plain, "precision": {"weights": "fp32", "compute": "fp32"}}
    (o,) = _math(fp32, "a100-sxm4-80gb", torch_2_13)
    assert "fp32 with 32 query heads on 8 K/V heads" in o.reason
    (o,) = _math({**plain, "precision": {"weights": "bf16", "compute": "bf16"}}, "t4-16gb")
    assert "bf16 on" in o.reason
    gpt2 = {**plain, "model": {"source": "preset", "id": "gpt2"}}
    (o,) = _math({**gpt2, "precision": {"weights": "bf16", "compute": "bf16"}}, "t4-16gb")
    assert "bf16 on" in o.reason and "fp16 and fp32 only below sm80" in o.reason
    for other, gpu, software in (
        (fp16, "t4-16gb", None),  # torch 2.15: the memory-efficient kernel takes GQA
        (fp32, "a100-sxm4-80gb", None),
        ({**gpt2, "precision": FP16}, "t4-16gb", None),
        ({**fp16, "model": {"source": "preset", "id": "gemma-2-2b"}}, "t4-16gb", None),
        (fp16, "a100-sxm4-80gb", torch_2_13),
        ({**fp16, "attention": "eager"}, "t4-16gb", torch_2_13),
        # transformers 4.53 repeats K/V itself: the memory-efficient kernel takes fp16
        (fp16, "t4-16gb", {**torch_2_13, "framework_version": "4.53.0"}),
        # torchtune's own attention code expands K/V before SDPA (not modelled as math)
        (fp16, "t4-16gb", {**torch_2_13, "framework": "torchtune"}),
    ):
        assert not _math(other, gpu, software), (other, gpu, software)


def test_training_defaults_to_sdpa_which_a_t4_runs():
    """transformers' own default (``attn_implementation`` unset: sdpa where torch has it): a
    training request that names no attention asks for no FlashAttention-2, so a T4 is not
    refused for a kernel the user never chose (it was, while ``flash`` was the default)."""
    plain = {"kind": "training", "model": LLAMA, "sequence_length": 512}
    assert msgspec.convert(plain, TrainingWorkload).attention == "sdpa"
    c = _verdict(plain, "t4-16gb")
    assert not [o for o in c.checks if "flash" in o.rule]
    assert c.verdict == "supported"  # the math path runs: a note, not a refusal
    # the bytes are flash's: both keep O(s) per head (only eager materializes the scores)
    flash = _budget({**plain, "attention": "flash"}, "a100-sxm4-80gb")
    assert _budget(plain, "a100-sxm4-80gb").total_bytes == flash.total_bytes


def test_flash_attention_3_is_hopper_only():
    sw = {"libraries": {"flash_attn": "3.0.0"}}
    assert _check(_verdict(TRAIN, "h100-sxm5-80gb", sw), "flash_attention.fa3").verdict == (
        "supported"
    )
    o = _check(_verdict(TRAIN, "a100-sxm4-80gb", sw), "flash_attention.fa3")
    assert o.verdict == "unsupported" and "is for Hopper (sm90)" in o.reason


def test_flash_attention_on_rocm_follows_the_ck_targets():
    assert _check(_verdict(TRAIN, "mi300x-192gb"), "flash_attention.rocm").verdict == "supported"
    o = _check(_verdict(TRAIN, "mi300x-192gb", {"rocm_version": "5.7"}), "flash_attention.rocm")
    assert o.verdict == "unsupported" and "ROCm 6.0 or above" in o.reason
    assert _check(_verdict(TRAIN, "mi325x-256gb"), "flash_attention.rocm").verdict == "supported"
    # An AMD device whose gfx target is not known: the rule cannot decide.
    o = _check(_without_gfx(TRAIN, "mi325x-256gb"), "flash_attention.rocm")
    assert o.verdict == "unknown"


# ------------------------------------------------------------------- bitsandbytes ------

QLORA = {**TRAIN, "attention": "sdpa", "method": {"kind": "qlora"}}


def test_qlora_on_rx_7900_xtx_needs_a_bitsandbytes_with_rocm_wheels():
    old = _verdict(QLORA, "radeon-rx-7900-xtx-24gb", {"libraries": {"bitsandbytes": "0.45.0"}})
    assert old.verdict == "unsupported"
    o = _check(old, "bitsandbytes")
    assert "has no ROCm build on PyPI" in o.reason
    assert o.remedy == "use bitsandbytes >= 0.49.0 (libraries.bitsandbytes)"
    for version in ("0.49.0", "0.50.2"):
        c = _verdict(QLORA, "radeon-rx-7900-xtx-24gb", {"libraries": {"bitsandbytes": version}})
        assert _check(c, "bitsandbytes").verdict == "supported", version
    # Not named: the current release (0.50.2) is assumed, and said so.
    o = _check(_verdict(QLORA, "radeon-rx-7900-xtx-24gb"), "bitsandbytes")
    assert o.verdict == "supported" and "not named" in o.reason


def test_bitsandbytes_rocm_target_not_in_the_release_list_is_unsupported():
    # MI300X is gfx942, in 0.49's list; the MI250X (gfx90a) too: both supported.
    sw = {"libraries": {"bitsandbytes": "0.49.1"}}
    assert _check(_verdict(QLORA, "mi250x-64gb-gcd", sw), "bitsandbytes").verdict == "supported"


def test_llm_int8_needs_turing():
    w = {**INFER, "precision": {"quantization": {"scheme": "int8"}}}
    o = _check(_verdict(w, "v100-sxm2-32gb", CUDA12), "bitsandbytes")
    assert o.verdict == "unsupported" and "need compute capability 7.5+" in o.reason
    assert _check(_verdict(w, "t4-16gb"), "bitsandbytes").verdict == "supported"


# --------------------------------------------------------------- vLLM quantization -----


def _serving(**kw: Any) -> dict[str, Any]:
    return {"kind": "llm_serving", "model": LLAMA, "max_model_len": 4096, **kw}


def test_awq_on_v100_in_vllm_is_unsupported():
    c = _verdict(_serving(quantization={"method": "awq"}, dtype="float16"), "v100-sxm2-32gb")
    assert c.verdict == "unsupported"
    o = _check(c, "vllm.quantization.awq")
    assert o.reason == (
        "vLLM 0.34.0 (read at 0.33.0) needs compute capability 75 for awq; "
        "NVIDIA V100 SXM2 32GB is 70"
    )
    assert "AutoAWQConfig 75" in o.source
    # The same AWQ checkpoint on a T4 (sm75) runs.
    c = _verdict(_serving(quantization={"method": "awq"}, dtype="float16"), "t4-16gb")
    assert _check(c, "vllm.quantization").verdict == "supported"


def test_vllm_drops_volta_with_its_cuda_12_8_builds():
    o = _check(
        _verdict(_serving(dtype="float16", engine_version="0.11.0"), "v100-sxm2-32gb"),
        "vllm.cuda_arch",
    )
    assert o.verdict == "unsupported"
    assert "torch 2.8 (pinned by vllm 0.11)" in o.reason


def test_bf16_on_v100_vllm_refuses_torch_emulates():
    o = _check(_verdict(_serving(dtype="bfloat16"), "v100-sxm2-32gb"), "dtype.bf16")
    assert o.verdict == "unsupported" and o.remedy == "serve in float16 (dtype: float16)"
    c = _verdict({**INFER, "precision": {"weights": "bf16"}}, "v100-sxm2-32gb", CUDA12)
    o = _check(c, "dtype.bf16")
    assert o.verdict == "supported" and "torch emulates bf16" in o.reason
    assert c.verdict == "supported"
    assert any(
        "no native bf16 support" in w
        for w in _budget(
            {**INFER, "precision": {"weights": "bf16"}}, "v100-sxm2-32gb", CUDA12
        ).warnings
    )


def test_fp8_on_a100_transformers_dequantizes_vllm_runs_weight_only():
    c = _verdict({**INFER, "precision": {"weights": "fp8"}}, "a100-sxm4-80gb")
    o = _check(c, "transformers.fp8")
    assert o.verdict == "unsupported"
    assert "the weights take 2 bytes each, not the budgeted 1" in o.reason
    assert _verdict({**INFER, "precision": {"weights": "fp8"}}, "h100-sxm5-80gb").verdict == (
        "supported"
    )
    c = _verdict(_serving(quantization={"method": "fp8"}), "a100-sxm4-80gb")
    assert _check(c, "vllm.quantization").verdict == "supported"
    # vLLM 0.11's Fp8Config needed 80: a T4 (75) is refused there, run by 0.33.
    c = _verdict(
        _serving(quantization={"method": "fp8"}, dtype="float16", engine_version="0.11.0"),
        "t4-16gb",
    )
    assert _check(c, "vllm.quantization.fp8").verdict == "unsupported"


@pytest.mark.parametrize("gpu", ["h100-sxm5-80gb", "a100-sxm4-80gb", "rtx-4090-24gb"])
def test_nvfp4_before_blackwell(gpu):
    w = {**INFER, "precision": {"quantization": {"scheme": "nvfp4"}}}
    o = _check(_verdict(w, gpu), "transformers.nvfp4")
    assert o.verdict == "unsupported" and "does not load pre-quantized NVFP4" in o.reason


def test_mxfp4_before_blackwell():
    w = {**INFER, "precision": {"quantization": {"scheme": "mxfp4"}}}
    o = _check(_verdict(w, "v100-sxm2-32gb", CUDA12), "transformers.mxfp4")
    assert o.verdict == "unsupported" and "dequantizes MXFP4 to bf16" in o.reason
    # transformers runs MXFP4 from sm75: no rule fails on an H100.
    assert _verdict(w, "h100-sxm5-80gb").verdict == "supported"


def test_mxfp4_in_vllm_on_hopper_runs_other_kernels_and_t4_is_refused():
    n = dataclasses.replace(_needs(_serving()), quant=frozenset({"mxfp4"}))
    h100 = compat.evaluate(n, _facts("h100-sxm5-80gb"))
    o = _check(h100, "vllm.quantization")
    assert o.verdict == "supported" and "without FP4 tensor cores" in o.reason
    assert "SM90 falls through to Humming or Marlin" in o.source
    t4 = compat.evaluate(n, _facts("t4-16gb"))
    assert _check(t4, "vllm.quantization.mxfp4").verdict == "unsupported"


# ---------------------------------------------------------------- CUDA and driver ------


def test_b200_with_cuda_11_8_is_unsupported():
    c = _verdict(INFER, "b200-180gb", {"cuda_version": "11.8"})
    o = _check(c, "cuda.architecture")
    assert o.verdict == "unsupported"
    assert (
        o.reason == "NVIDIA B200 180GB (sm100) needs CUDA >= 12.8; the build is CUDA 11.8 (named)"
    )
    assert "require a minimum of CUDA 12.8" in o.source


def test_b200_with_driver_470_is_unsupported():
    c = _verdict(INFER, "b200-180gb", {"driver_version": "470.82.01"})
    o = _check(c, "cuda.driver_minimum")
    assert o.verdict == "unsupported"
    assert "driver 470.82.01 is below 580, the minimum for any CUDA 13.x runtime" in o.reason
    assert "'13.x >= 580'" in o.source
    # With no CUDA known, the B200 still needs >= 12.8, whose family needs >= 525.
    c = _verdict(INFER, "b200-180gb", {"driver_version": "470.82.01", "torch_version": "9.9+cpu"})
    assert _check(c, "cuda.driver_minimum").verdict == "unsupported"


def test_driver_within_minor_version_compatibility_is_supported_with_the_caveat():
    c = _verdict(INFER, "h100-sxm5-80gb", {"cuda_version": "12.8", "driver_version": "535.104.05"})
    o = _check(c, "cuda.driver_minimum")
    assert o.verdict == "supported"
    assert "below CUDA 12.8's own 570.26 but within CUDA 12.x minor-version" in o.reason


def test_cuda_13_drops_volta():
    o = _check(_verdict(INFER, "v100-sxm2-32gb", {"cuda_version": "13.0"}), "cuda.architecture")
    assert o.verdict == "unsupported" and "Maxwell, Pascal, and Volta" in o.source
    assert "torch_version '2.10.0+cu128'" in (o.remedy or "")


def test_torch_releases_map_to_their_pypi_cuda():
    assert torch_cuda("2.7.0") == ((12, 6), "torch 2.7.0's PyPI wheel")
    assert torch_cuda("2.8.0+cu126")[0] == (12, 6)
    assert torch_cuda("2.13.0")[0] == (13, 0)  # not read: the 2.12 row, said so
    assert "assumed as 2.12's: the nearest release read" in torch_cuda("2.13.0")[1]
    assert torch_cuda("2.3.1")[0] is None
    assert torch_cuda("2.9.0+rocm6.4")[0] is None


def test_unknown_when_the_cuda_cannot_be_known():
    c = _verdict(INFER, "b200-180gb", {"torch_version": "2.9.0+rocm6.4"})
    o = _check(c, "cuda.architecture")
    assert o.verdict == "unknown" and c.verdict == "unknown"
    assert o.remedy is not None and "cuda_version" in o.remedy


def test_custom_device_keeps_the_native_dtype_check_as_unknown():
    body = {
        "workloads": [{**INFER, "precision": {"weights": "bf16"}}],
        "device": {"source": "custom", "memory_total_bytes": 16 << 30, "native_dtypes": ["fp16"]},
    }
    req = msgspec.json.decode(msgspec.json.encode(body), type=BudgetRequest)
    c = estimate(req.workloads, req.device).compatibility
    assert c is not None and c.verdict == "unknown"
    assert "has no native bf16 support" in _check(c, "dtype.native").reason


def test_no_device_no_verdict():
    req = msgspec.json.decode(msgspec.json.encode({"workloads": [INFER]}), type=BudgetRequest)
    assert estimate(req.workloads).compatibility is None


# ------------------------------------------------------------------------- fits --------


def _fit(body: dict[str, Any]) -> Any:
    return fit(msgspec.json.decode(msgspec.json.encode(body), type=FitRequest))


def test_fits_never_offer_an_unsupported_device_and_say_why():
    devices = [
        {"source": "catalog", "id": "t4-16gb"},
        {"source": "catalog", "id": "a100-sxm4-80gb"},
        {"source": "custom", "name": "mystery", "memory_total_bytes": 80 * 10**9},
    ]
    answer = _fit({"workloads": [{**TRAIN, "attention": "flash"}], "devices": devices})
    assert [g.gpu_id for g in answer.gpus] == ["a100-sxm4-80gb", None]
    (t4,) = answer.excluded
    assert t4.gpu_id == "t4-16gb" and t4.compatibility.verdict == "unsupported"
    assert [o.rule for o in t4.compatibility.checks] == ["flash_attention.cuda_arch"]
    a100, mystery = answer.gpus
    assert a100.compatibility is not None and a100.compatibility.verdict == "supported"
    # unknown (a custom device's compute capability) stays offered, with its verdict shown
    assert mystery.compatibility is not None and mystery.compatibility.verdict == "unknown"
    assert any(w.startswith("unknown (flash_attention.cuda_arch)") for w in mystery.warnings)


def test_serving_fit_excludes_and_cheapest_ignores_excluded():
    devices = [{"source": "catalog", "id": g} for g in ("v100-sxm2-32gb", "h100-sxm5-80gb")]
    answer = _fit({"workloads": [_serving(quantization={"method": "awq"})], "devices": devices})
    assert [g.gpu_id for g in answer.gpus] == ["h100-sxm5-80gb"]
    assert answer.excluded[0].gpu_id == "v100-sxm2-32gb"
    assert answer.cheapest is None or answer.cheapest.gpu_id == "h100-sxm5-80gb"


def test_fit_evaluates_the_rules_once_per_device_type(monkeypatch):
    calls: list[str] = []
    real = fit_module.evaluate_on

    def counting(needs: Any, device: Any) -> Compatibility:
        calls.append(device.name)
        return real(needs, device)

    monkeypatch.setattr(fit_module, "evaluate_on", counting)
    answer = _fit({"workloads": [INFER], "device_counts": [1, 2, 4], "solve": ["batch", "context"]})
    assert len(calls) == len(answer.gpus) + len(answer.excluded) == 43


# ------------------------------------------------------------------------ helpers -----


def _needs(workload: dict[str, Any]) -> compat.Needs:
    body = {"workloads": [workload], "device": {"source": "catalog", "id": "h100-sxm5-80gb"}}
    req = msgspec.json.decode(msgspec.json.encode(body), type=BudgetRequest)
    return needs_of(req.workloads, None)


def _facts(gpu: str) -> compat.DeviceFacts:
    from vrambudget.core.device import resolve_device
    from vrambudget.core.spec import CatalogDevice

    ctx = resolve_device(CatalogDevice(id=gpu))
    assert ctx is not None
    return compat.device_facts(ctx)


def test_transformers_rules_apply_only_to_frameworks_that_load_with_transformers():
    w = {**INFER, "precision": {"weights": "fp8"}}
    c = _verdict(w, "a100-sxm4-80gb", {"framework": "torchtune"})
    assert not [o for o in c.checks if o.rule.startswith("transformers.")]
    c = _verdict(w, "a100-sxm4-80gb", {"framework": "unsloth"})
    assert _check(c, "transformers.fp8").verdict == "unsupported"


RULE_IDS = (
    "cuda.architecture",
    "cuda.driver_minimum",
    "cuda.driver_supports",
    "vllm.rocm_target",
    "sglang.rocm_target",
    "vllm.cuda_arch",
    "dtype.bf16",
    "dtype.native",
    "vllm.quantization",
    "transformers.fp8",
    "transformers.mxfp4",
    "transformers.nvfp4",
    "flash_attention.cuda_arch",
    "flash_attention.fa3",
    "flash_attention.rocm",
    "attention.sdpa_math",
    "bitsandbytes",
)


def test_every_rule_is_documented_with_its_source():
    from pathlib import Path

    import vrambudget.core.compat.rules as rules_module

    code = Path(rules_module.__file__).read_text()
    doc = (Path(__file__).parents[2] / "docs" / "COMPATIBILITY.md").read_text()
    for rule in RULE_IDS:
        assert f'"{rule}' in code, rule
        assert f"| `{rule}" in doc, rule
    assert len(rules_module.RULES) == 11


def test_engines_on_rocm_targets():
    vllm = _serving(dtype="float16")
    assert _check(_verdict(vllm, "radeon-rx-7900-xtx-24gb"), "vllm.rocm_target").verdict == (
        "supported"
    )
    assert _check(_verdict(vllm, "mi300x-192gb"), "vllm.rocm_target").verdict == "supported"
    assert _check(_verdict(vllm, "mi325x-256gb"), "vllm.rocm_target").verdict == "supported"
    o = _check(_without_gfx(vllm, "mi325x-256gb"), "vllm.rocm_target")
    assert o.verdict == "unknown" and "gfx target is not in the catalog" in o.reason
    sglang = _serving(engine="sglang", dtype="float16")
    assert _check(_verdict(sglang, "mi300x-192gb"), "sglang.rocm_target").verdict == "supported"
    o = _check(_verdict(sglang, "radeon-rx-7900-xtx-24gb"), "sglang.rocm_target")
    assert o.verdict == "unknown" and "lists no supported targets" in o.reason


def test_driver_named_without_a_cuda_that_decides_is_unknown():
    sw = {"driver_version": "550.54.15", "torch_version": "2.9.0+rocm6.4"}
    o = _check(_verdict(INFER, "h100-sxm5-80gb", sw), "cuda.driver_minimum")
    assert o.verdict == "unknown" and o.remedy == "name software.cuda_version"
