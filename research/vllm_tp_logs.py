"""The tensor-parallel launches of ``research/data/vllm_tp_logs.json`` (the calibrate split for
vLLM's tensor-parallel communication cost) re-created as requests, and what each implies.

For each launch vrambudget can re-create (a preset with the model's shapes, the settings the
log states), the *implied* non-torch memory is the value of the modelled non-torch increase that
would make the predicted KV budget equal the printed one::

    implied = modelled non-torch + (predicted available - printed "Available KV cache memory")

Everything else (weights, activation peak, CUDA context, NCCL init where it counts) stays as
the model has it, so the implied value carries their errors too. ``research/calibrate_vllm.py``
fits ``tp_comm_pcie_bytes`` and the ``non_torch_tp*_transfer_bytes`` from these.

    .venv/bin/python -m research.vllm_tp_logs        # the table docs/ACCURACY.md quotes
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from vrambudget.core.catalog import gpu
from vrambudget.core.resolve import resolve_model
from vrambudget.core.serving.vllm import account
from vrambudget.core.spec import LLMServingWorkload

LOGS = Path(__file__).parent / "data" / "vllm_tp_logs.json"
GiB = 1 << 30

REQUESTS: dict[str, tuple[dict[str, Any], str]] = {
    # Qwen3-32B, kv fp8, TP8 on H100 (NVSwitch), vLLM 0.10.0, defaults otherwise
    "vllm-daisuketakai-qwen3-32b-kvfp8-8xh100-tp8": (
        {
            "engine_version": "0.10.0",
            "model": {"source": "preset", "id": "qwen3-32b"},
            "max_model_len": 32768,
            "kv_cache_dtype": "fp8",
            "parallelism": {"tensor": 8},
        },
        "h100-sxm5-80gb",
    ),
    # Qwen3-30B-A3B TP2 on H100, vLLM 0.12.0, max_num_seqs 64
    "vllm-zzsf11-qwen3-30b-a3b-2xh100-tp2": (
        {
            "engine_version": "0.12.0",
            "model": {"source": "preset", "id": "qwen3-30b-a3b"},
            "max_model_len": 40960,
            "max_num_seqs": 64,
            "parallelism": {"tensor": 2},
        },
        "h100-sxm5-80gb",
    ),
    # Llama-3-8B-Instruct TP4 on A100 80GB (capability 8.0 printed; SXM inferred), vLLM
    # 0.13.0; Llama 3.1 8B has its shapes (max_model_len 8192 as the engine config prints)
    "vllm-emocat17-llama3-8b-4xa100-tp4": (
        {
            "engine_version": "0.13.0",
            "model": {"source": "preset", "id": "llama-3.1-8b"},
            "max_model_len": 8192,
            "parallelism": {"tensor": 4},
        },
        "a100-sxm4-80gb",
    ),
    # Qwen2.5-32B TP4 over four PCIe RTX 3090, eager, one sequence, custom all-reduce off
    "vllm-lambo-qwen25-32b-4x3090-tp4-eager": (
        {
            "engine_version": "0.18.0",
            "model": {"source": "preset", "id": "qwen2.5-32b"},
            "max_model_len": 32768,
            "gpu_memory_utilization": 0.88,
            "max_num_seqs": 1,
            "enforce_eager": True,
            "parallelism": {"tensor": 4},
        },
        "rtx-3090-24gb",
    ),
    # Qwen3-8B fp16 TP2 over two T4 (Kaggle), eager; LoRA enabled (its buffers fall into the
    # implied value: an over-count, the safe side)
    "vllm-exact-qwen3-8b-fp16-2xt4-tp2-eager-lora-8k": (
        {
            "engine_version": "0.22.0",
            "model": {"source": "preset", "id": "qwen3-8b"},
            "max_model_len": 8192,
            "dtype": "float16",
            "gpu_memory_utilization": 0.85,
            "enforce_eager": True,
            "parallelism": {"tensor": 2},
        },
        "t4-16gb",
    ),
    "vllm-exact-qwen3-8b-fp16-2xt4-tp2-eager-lora-4k-seqs1": (
        {
            "engine_version": "0.22.0",
            "model": {"source": "preset", "id": "qwen3-8b"},
            "max_model_len": 4096,
            "max_num_seqs": 1,
            "dtype": "float16",
            "gpu_memory_utilization": 0.85,
            "enforce_eager": True,
            "parallelism": {"tensor": 2},
        },
        "t4-16gb",
    ),
}

_HYBRID = "Qwen3.5 (hybrid linear attention): no preset"
LEFT_OUT: dict[str, str] = {
    "vllm-daisuketakai-qwen3-235b-a22b-fp8-8xh100-tp8-ep": "no Qwen3-235B-A22B preset",
    "vllm-zzsf11-qwen3-vl-30b-a3b-2xh100-tp2-seqs64": "vision-language model (encoder profiled)",
    "vllm-zzsf11-qwen3-vl-30b-a3b-2xh100-tp2-seqs256": "vision-language model (encoder profiled)",
    "vllm-hanzhizhz-qwen3-30b-a3b-w4a16-2xada-tp2-nop2p": "GPU model and total memory unknown",
    "vllm-lambo-qwen35-27b-4x3090-tp4-eager-gmu090": _HYBRID,
    "vllm-lambo-qwen35-27b-4x3090-tp4-eager-gmu092": _HYBRID,
    "vllm-lambo-qwen35-27b-4x3090-tp4-eager-50k-seqs1": _HYBRID,
    "vllm-lambo-qwen35-9b-4x3090-tp4-cudagraph": _HYBRID,
}


@dataclass(frozen=True)
class Implied:
    log: str
    version: str
    gpu_id: str
    fabric: str
    tensor: int
    modelled_non_torch_bytes: int
    implied_non_torch_bytes: int
    base_non_torch_bytes: int
    """The one-GPU part of the modelled non-torch increase (``non_torch_tp1_bytes``)."""
    predicted_kv_tokens: int
    measured_kv_tokens: int


def logs() -> dict[str, dict[str, Any]]:
    return {entry["id"]: entry for entry in json.loads(LOGS.read_text())["logs"]}


def implied() -> list[Implied]:
    """The implied non-torch increase of every re-created launch (constants as in the file)."""
    entries = logs()
    out = []
    for key, (workload, gpu_id) in REQUESTS.items():
        measured = entries[key]["measured"]
        w = msgspec.convert({"kind": "llm_serving", **workload}, LLMServingWorkload)
        g = gpu(gpu_id)
        a = account(w, resolve_model(w.model), g.memory_total_bytes, g.name)
        st = a.stages[0]
        delta = st.available_bytes - round(measured["kv_cache_gib"] * GiB)
        out.append(
            Implied(
                log=key,
                version=workload["engine_version"],
                gpu_id=gpu_id,
                fabric=a.resolved.fabric,
                tensor=a.resolved.tensor,
                modelled_non_torch_bytes=st.non_torch_bytes,
                implied_non_torch_bytes=st.non_torch_bytes + delta,
                base_non_torch_bytes=st.non_torch_bytes - st.non_torch_comm_bytes,
                predicted_kv_tokens=a.kv_tokens,
                measured_kv_tokens=measured["kv_cache_tokens"],
            )
        )
    return out


def main() -> int:
    print("| log | vLLM | GPU | fabric | TP | implied non-torch GiB | modelled | KV tokens err |")
    print("|---|---|---|---|---:|---:|---:|---:|")
    for r in implied():
        err = (r.predicted_kv_tokens - r.measured_kv_tokens) / r.measured_kv_tokens
        print(
            f"| {r.log} | {r.version} | {r.gpu_id} | {r.fabric} | {r.tensor} | "
            f"{r.implied_non_torch_bytes / GiB:.2f} | {r.modelled_non_torch_bytes / GiB:.2f} | "
            f"{err:+.1%} |"
        )
    for key, why in LEFT_OUT.items():
        print(f"- left out: {key}: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
