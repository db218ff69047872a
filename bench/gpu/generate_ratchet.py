"""Does the caching allocator's reserved memory grow call after call under repeated
``generate``? Benchmarks that report NVML's peak over many ``generate`` calls (optimum-benchmark
does) publish numbers far above one call's ``max_memory_allocated``: the KV cache grows by
``torch.cat`` every step, and freed blocks may be too small for the next, larger tensors.

Qwen2.5-0.5B's config with random bf16 weights, transformers' ``generate`` (DynamicCache), greedy,
a fixed number of new tokens; per call: ``max_memory_allocated`` and ``max_memory_reserved``
(peaks reset before the call), ``memory_reserved`` after it, NVML's device used after it, and
after each series' first call its cached segments (``memory_snapshot``). Then
the same after ``torch.cuda.empty_cache()``, to show which part is reclaimable cache.

    python3 bench/gpu/generate_ratchet.py [OUT.json]             # about 40 s on one H100/H200
    python3 bench/gpu/generate_ratchet.py --dry-run [OUT.json]   # the CPU, tiny, no counters

Runs with the machine's torch and transformers (and msgspec for the preset's config)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CALLS = 6
SHAPES = ((1, 512, 256), (16, 512, 256), (16, 1024, 512))
"""(batch, prompt tokens, new tokens) per series."""


def _nvml_used() -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used)
    except Exception:  # noqa: BLE001 -- no NVML: the torch views still say it
        return None


def _segments(torch: Any) -> list[list[Any]]:
    """Every cached segment after a call, largest first: [pool, bytes, bytes allocated in it]
    (``torch.cuda.memory_snapshot()``), to set beside the allocator replay's segments."""
    snap = torch.cuda.memory_snapshot()
    rows = [[s["segment_type"], s["total_size"], s["allocated_size"]] for s in snap]
    return sorted(rows, key=lambda r: (-r[1], r[0]))


def main(argv: list[str] | None = None) -> int:
    import torch
    import transformers

    from vrambudget.core.catalog import preset

    args = list(sys.argv[1:] if argv is None else argv)
    dry = "--dry-run" in args
    args = [a for a in args if a != "--dry-run"]
    out = Path(
        args[0]
        if args
        else os.path.join(os.environ.get("OUT", "bench/results"), "generate_ratchet.json")
    )
    config = dict(preset("qwen2.5-0.5b").config or {})
    if dry:  # two tiny layers on the CPU: the script's path, no allocator counters
        config.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                      bos_token_id=None, eos_token_id=None)  # fmt: skip
    cuda = not dry
    device = "cuda" if cuda else "cpu"
    shapes = SHAPES if cuda else ((1, 8, 4), (2, 8, 4))
    cfg = transformers.AutoConfig.for_model(**config)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.eval()
    model.generation_config.pad_token_id = 0
    counters = torch.cuda if cuda else None
    head = {
        "schema": "vrambudget.generate_ratchet/1",
        "dry_run": dry,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "gpu": torch.cuda.get_device_name(0) if cuda else "cpu",
        "weights_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
    }
    series: list[dict[str, Any]] = []
    for batch, prompt, new in shapes:
        calls = []
        for _ in range(CALLS if cuda else 2):
            ids = torch.randint(10, cfg.vocab_size - 10, (batch, prompt), device=device)
            if counters is not None:
                counters.synchronize()
                counters.reset_peak_memory_stats()
            t0 = time.perf_counter()
            with torch.no_grad():
                model.generate(
                    ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, use_cache=True
                )
            seconds = round(time.perf_counter() - t0, 3)
            if counters is None:
                calls.append({"seconds": seconds})
                continue
            counters.synchronize()
            call: dict[str, Any] = {
                "max_allocated": counters.max_memory_allocated(),
                "max_reserved": counters.max_memory_reserved(),
                "reserved_after": counters.memory_reserved(),
                "nvml_used_after": _nvml_used(),
                "seconds": seconds,
            }
            if not calls:  # the first call's cached segments, for the allocator replay
                call["segments_after"] = _segments(torch)
            calls.append(call)
            del ids
        after = None
        if counters is not None:
            counters.empty_cache()
            after = {
                "reserved": counters.memory_reserved(),
                "allocated": counters.memory_allocated(),
                "nvml_used": _nvml_used(),
            }
        series.append(
            {
                "batch_size": batch,
                "prompt_tokens": prompt,
                "new_tokens": new,
                "calls": calls,
                "after_empty_cache": after,
            }
        )
        print(json.dumps(series[-1]), flush=True)
        # Written after every series: a run stopped by campaign.sh's time limit still brings
        # back the series it finished ("complete": false).
        _write(out, {**head, "complete": len(series) == len(shapes), "series": series})
    return 0


def _write(out: Path, doc: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(out)


if __name__ == "__main__":
    raise SystemExit(main())
