"""vrambudget's llama.cpp buffers against a real llama.cpp on the CPU (bench/llamacpp_cpu.py's
results): the model buffer from the ggml type table, the KV buffer and the compute buffer from
``vrambudget.core.serving.gguf.llamacpp``, run by run.

    .venv/bin/python -m bench.llamacpp_compare [bench/results/llamacpp_cpu.json]

Prints one line per class of run (cache type x flash attention) with the median and largest
relative error of the compute buffer, and the count of model / KV buffers that differ from
the measured ones by more than the log's 0.01 MiB print resolution.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vrambudget.core.resolve import resolve_model
from vrambudget.core.serving.gguf.llamacpp import (
    LlamaSettings,
    compute_buffer,
    kv_cells,
    kv_layer_bytes,
)
from vrambudget.core.serving.gguf.types import tensor_bytes
from vrambudget.core.spec import DimensionsModel, MoESpec

RESULTS = Path(__file__).parent / "results" / "llamacpp_cpu.json"
MiB = 1 << 20


@dataclass(frozen=True)
class Compared:
    klass: str
    model_mib: tuple[float, float] | None
    kv_mib: tuple[float, float] | None
    compute_mib: tuple[float, float] | None


def arch_of(m: dict[str, Any]) -> Any:
    return resolve_model(
        DimensionsModel(
            hidden_size=m["n_embd"],
            num_layers=m["n_layer"],
            num_attention_heads=m["n_head"],
            num_key_value_heads=m["n_head_kv"],
            head_dim=m["head_dim"],
            intermediate_size=m["n_ff"],
            vocab_size=m["vocab"],
            max_position_embeddings=4096,
            tie_word_embeddings=m["tied_output"],
            moe=MoESpec(
                num_experts=m["n_expert"],
                experts_per_token=m["n_expert_used"],
                expert_intermediate_size=m["n_ff"],
            )
            if m.get("n_expert")
            else None,
        )
    )


def settings_of(run: dict[str, Any]) -> LlamaSettings:
    ctx = run["parsed"]["context"]
    s = run["settings"]
    unified = ctx.get("kv_unified") == "true"
    return LlamaSettings(
        n_ctx=int(ctx["n_ctx"]),
        n_ctx_seq=int(ctx["n_ctx_seq"]),
        n_parallel=int(ctx["n_seq_max"]),
        kv_unified=unified,
        n_gpu_layers=0,
        flash_attn=ctx["flash_attn"] == "enabled",
        n_ubatch=int(ctx["n_ubatch"]),
        n_batch=int(ctx["n_batch"]),
        type_k=s["type_k"],
        type_v=s["type_v"],
        devices=0,
        splits=(),
        kv_offload=True,
    )


def compare(run: dict[str, Any], model: dict[str, Any]) -> Compared | None:
    p = run.get("parsed") or {}
    if run.get("error") or "context" not in p:
        return None
    arch = arch_of(model)
    s = settings_of(run)
    klass = f"{s.type_k}/{s.type_v} cache, flash attention {'on' if s.flash_attn else 'off'}"
    cells = kv_cells(arch, s)
    kv = sum(kv_layer_bytes(arch, s, c) for c in cells)
    measured_kv = sum(p.get("kv_buffers", {}).values())
    files = sum(tensor_bytes(t["type"], tuple(t["ne"])) for t in model["tensors"])
    buffers = p.get("model_buffers", {})
    measured_model = buffers.get("CPU_Mapped", buffers.get("CPU"))
    compute = compute_buffer(arch, s, tuple(range(arch.num_layers)), True, cells, gpu=False)
    exact = p.get("compute_buffers_exact", {}).get("CPU")
    return Compared(
        klass=klass,
        model_mib=(files / MiB, measured_model) if measured_model is not None else None,
        kv_mib=(kv / MiB, measured_kv) if measured_kv else None,
        compute_mib=(compute / MiB, exact["actual_MiB"]) if exact else None,
    )


def load(path: Path = RESULTS) -> list[Compared]:
    data = json.loads(path.read_text())
    models = data["models"]
    out = []
    for run in data["runs"]:
        c = compare(run, models[run["model"]])
        if c is not None:
            out.append(c)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    rows = load(Path(args[0]) if args else RESULTS)
    model_off = sum(1 for r in rows if r.model_mib and abs(r.model_mib[0] - r.model_mib[1]) > 0.01)
    kv_off = sum(1 for r in rows if r.kv_mib and abs(r.kv_mib[0] - r.kv_mib[1]) > 0.01)
    print(
        f"{len(rows)} loads: model buffer off by > 0.01 MiB in {model_off}, KV buffer in {kv_off}"
    )
    print(f"{'class':<44}{'runs':>6}{'median':>9}{'max':>9}{'under':>7}")
    for klass in sorted({r.klass for r in rows}):
        errs = [
            (r.compute_mib[0] - r.compute_mib[1]) / r.compute_mib[1]
            for r in rows
            if r.klass == klass and r.compute_mib
        ]
        if not errs:
            continue
        under = sum(1 for e in errs if e < -1e-4)
        print(
            f"{klass:<44}{len(errs):>6}{statistics.median(map(abs, errs)):>8.1%}"
            f"{max(map(abs, errs)):>9.1%}{under:>7}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
