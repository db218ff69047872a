"""The caching allocator's fragmentation where the oracle grid's medians do not fit, as a
fraction of the analytic tier's largest transient bytes: the fragmentation line's fractions
for eager-attention inference and for training with full activation checkpointing
(``EAGER_INFERENCE_FRAGMENTATION_FRACTION``, ``CHECKPOINTED_TRAINING_FRAGMENTATION_FRACTION`` in
``vrambudget/core/formulas/allocator_overhead.py``); and every class's replay with
``expandable_segments:True`` (``EXPANDABLE_REPLAY_MEDIANS``), for which the SDPA-inference and
no-checkpointing training grids are here too; and LoRA without checkpointing, whose median
(0.069) lies below the training fraction but not for every model (a large vocabulary's loss
tensors fragment as a full fine-tune's do), so LoRA keeps the training fraction
(tests/research/test_fragmentation_grids.py says why).

* Eager attention materializes each layer's scores in the compute dtype and their softmax in
  fp32 (transformers' ``eager_attention_forward``): per layer a run of equal-sized large
  requests -- the product, the scaled and the masked scores, the fp32 copy and its softmax,
  the cast back -- whose best fit splits the fp32 segments and leaves them partly cached.
* Full checkpointing recomputes each layer's forward inside backward, so a layer's recomputed
  activations and its gradients' temporaries are allocated and freed between gradients that
  stay: the cached segments are cut up around them.

For each workload of a grid, the trace tier records transformers' own code (two iterations,
the default device's GEMM workspaces) and replays it through the allocator model; the
fraction is (replayed reserved peak - replayed allocated peak) / the analytic tier's
``largest_transient_bytes``. The constant is the median. ``--campaign`` adds the GPU
campaigns' runs of the same kind (measured ``max_memory_reserved`` - ``max_memory_allocated``
over the same bytes), which check it.

Run from the repository root (torch and transformers; a few minutes per grid); ``--write``
records the rows in ``research/data/fragmentation_grids.json``:
    python -m research.fragmentation_grids {eager,checkpointing,sdpa,training,lora} [--campaign]
        [--write]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from research.gpu_campaign import GPU_DATA
from vrambudget.core.estimate import estimate
from vrambudget.core.spec import BudgetRequest, Workload
from vrambudget.trace.engine import record_workload_code, request_workspaces
from vrambudget.trace.replay import replay

__all__ = [
    "GRIDS",
    "RESULTS",
    "Row",
    "campaign_fractions",
    "expandable_fraction",
    "fraction",
    "grid",
    "recorded",
    "row",
    "rows",
    "workload_name",
]

RESULTS = Path(__file__).parent / "data" / "fragmentation_grids.json"
"""Each grid's rows as the last ``--write`` replayed them (the fractions' constants are their
medians: tests/research/test_fragmentation_grids.py)."""
SHAPES = ((1, 4096), (4, 2048), (8, 1024), (16, 512))
"""(batch or micro-batch, tokens per sequence)."""
GPT2_SHAPES = ((2, 1000), (4, 1000), (8, 1000), (16, 512))
"""GPT-2's context is 1,024 positions."""


def _model(m: str) -> dict[str, str]:
    return {"source": "preset", "id": m}


def _eager(m: str, batch: int, tokens: int) -> dict[str, Any]:
    return {
        "kind": "inference",
        "model": _model(m),
        "batch_size": batch,
        "prompt_tokens": tokens,
        "generated_tokens": 16,
        "attention": "eager",
    }


def _sdpa(m: str, batch: int, tokens: int) -> dict[str, Any]:
    return {**_eager(m, batch, tokens), "attention": "sdpa"}


def _checkpointing(m: str, batch: int, tokens: int) -> dict[str, Any]:
    return {
        "kind": "training",
        "model": _model(m),
        "micro_batch_size": batch,
        "sequence_length": tokens,
        "checkpointing": "full",
        "attention": "sdpa",
    }


def _training(m: str, batch: int, tokens: int) -> dict[str, Any]:
    return {**_checkpointing(m, batch, tokens), "checkpointing": "none"}


LORA = {"kind": "lora", "rank": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
"""The GPU campaigns' LoRA (PEFT's r 16 on the attention projections; GPT-2's fused c_attn and
c_proj, a name that also reaches its MLP's output projection, as PEFT matches names)."""


def _lora(m: str, batch: int, tokens: int) -> dict[str, Any]:
    targets = ["c_attn", "c_proj"] if m == "gpt2" else LORA["target_modules"]
    return {**_training(m, batch, tokens), "method": {**LORA, "target_modules": targets}}


GRIDS: dict[str, tuple[tuple[str, ...], Callable[[str, int, int], dict[str, Any]]]] = {
    "eager": (("qwen2.5-0.5b", "qwen2.5-1.5b", "gpt2", "gemma-2-2b"), _eager),
    # Gemma 2 trains with eager attention (soft-capped logits): Granite 3.1 2B instead.
    "checkpointing": (("qwen2.5-0.5b", "qwen2.5-1.5b", "gpt2", "granite-3.1-2b"), _checkpointing),
    # The two classes whose default fractions come from the oracle grid (docs/ACCURACY.md):
    # here for their expandable-segments replay, which the oracle grid does not run.
    "sdpa": (("qwen2.5-0.5b", "qwen2.5-1.5b", "gpt2", "gemma-2-2b"), _sdpa),
    "training": (("qwen2.5-0.5b", "qwen2.5-1.5b", "gpt2", "granite-3.1-2b"), _training),
    # LoRA without checkpointing (a finding, not a fraction: see the module's docstring).
    "lora": (("qwen2.5-0.5b", "qwen2.5-1.5b", "gpt2", "granite-3.1-2b"), _lora),
}
"""Each grid: its models (4 shapes each), and the request of one workload."""


def grid(kind: str) -> tuple[Workload, ...]:
    models, make = GRIDS[kind]
    return tuple(
        msgspec.convert(make(m, b, t), Workload)
        for m in models
        for b, t in (GPT2_SHAPES if m == "gpt2" else SHAPES)
    )


def _matches(kind: str, w: dict[str, Any]) -> bool:
    if kind in ("eager", "sdpa"):
        return w.get("kind") == "inference" and w.get("attention", "sdpa") == kind
    full = w.get("checkpointing") == "full"
    lora = (w.get("method") or {}).get("kind") == "lora"
    if kind == "lora":
        return w.get("kind") == "training" and lora and not full
    return (
        w.get("kind") == "training"
        and full == (kind == "checkpointing")
        and not (lora and kind == "training")
    )


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    transient: int
    reserved_minus_allocated: int
    expandable_reserved_minus_allocated: int
    """The same trace replayed with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``."""

    @property
    def fraction(self) -> float:
        return self.reserved_minus_allocated / self.transient

    @property
    def expandable_fraction(self) -> float:
        return self.expandable_reserved_minus_allocated / self.transient


def _transient(w: Workload) -> int:
    """The analytic tier's ``largest_transient_bytes``: what its fraction multiplies."""
    return int(estimate((w,)).devices[0].inputs["largest_transient_bytes"])


def workload_name(w: Any) -> str:
    batch = getattr(w, "batch_size", None) or w.micro_batch_size
    tokens = getattr(w, "prompt_tokens", None) or w.sequence_length
    return f"{w.model.id} {batch} x {tokens}"


def row(w: Workload) -> Row:
    """One workload's replay (two iterations, the default device's GEMM workspaces)."""
    trace, _ = record_workload_code(
        w,  # type: ignore[arg-type]
        workspaces=request_workspaces(BudgetRequest(workloads=(w,), method="trace")),
    )
    r = replay(trace)
    x = replay(trace, expandable_segments=True)
    return Row(
        workload_name(w),
        _transient(w),
        r.peak_reserved_bytes - r.peak_allocated_bytes,
        x.peak_reserved_bytes - x.peak_allocated_bytes,
    )


def rows(kind: str) -> list[Row]:
    return [row(w) for w in grid(kind)]


def recorded(kind: str) -> list[Row]:
    """The grid's rows as :data:`RESULTS` holds them."""
    doc = json.loads(RESULTS.read_text())
    return [Row(**r) for r in doc[kind]]


def fraction(found: list[Row]) -> float:
    return statistics.median(r.fraction for r in found)


def expandable_fraction(found: list[Row]) -> float:
    return statistics.median(r.expandable_fraction for r in found)


def campaign_fractions(kind: str) -> list[tuple[str, str, float]]:
    """(file, run, measured reserved - allocated over the analytic transient bytes) of every
    campaign run of the grid's kind. Training runs count only from campaigns that kept the
    optimizer state across iterations (``training_loop``): the earlier ones measured steps
    without the AdamW moments."""
    out = []
    for path in sorted(GPU_DATA.glob("gpu_campaign_*.json")):
        doc = json.loads(path.read_text())
        for r in doc["results"]:
            w = r.get("workload") or {}
            m = r.get("measured") or {}
            if not _matches(kind, w) or not m.get("torch_max_memory_reserved"):
                continue
            if w.get("kind") == "training" and not doc.get("training_loop"):
                continue
            gap = m["torch_max_memory_reserved"] - m["torch_max_memory_allocated"]
            out.append((path.name, r["name"], gap / _transient(msgspec.convert(w, Workload))))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("grid", choices=sorted(GRIDS))
    p.add_argument("--campaign", action="store_true", help="also the GPU campaigns' runs")
    p.add_argument("--write", action="store_true", help=f"record the rows in {RESULTS.name}")
    args = p.parse_args(argv)
    found = rows(args.grid)
    if args.write:
        doc = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
        doc[args.grid] = [dataclasses.asdict(r) for r in found]
        RESULTS.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(
        "| workload | transient, MiB | reserved - allocated, MiB | fraction "
        "| expandable segments, MiB | fraction |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in found:
        print(
            f"| {r.name} | {r.transient / 2**20:,.0f} | "
            f"{r.reserved_minus_allocated / 2**20:,.0f} | {r.fraction:.3f} | "
            f"{r.expandable_reserved_minus_allocated / 2**20:,.0f} | "
            f"{r.expandable_fraction:.3f} |"
        )
    for label, of in (
        ("", lambda r: r.fraction),
        ("expandable segments: ", lambda r: r.expandable_fraction),
    ):
        fs = sorted(of(r) for r in found)
        print(
            f"\n{label}median {statistics.median(fs):.3f} over {len(fs)} "
            f"(range {fs[0]:.3f} .. {fs[-1]:.3f})"
        )
    if args.campaign:
        for name, run, f in campaign_fractions(args.grid):
            print(f"{name} {run}: measured {f:.3f}")


if __name__ == "__main__":
    main()
