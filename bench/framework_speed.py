"""Speed of the framework paths (issue 14): the inventory of a 70B model built by transformers
on the meta device (first time in a warm worker, then cached), a trace of a 70B inference run
through transformers' own code, and a whole-catalog fit of a model resolved like a Hub one
(config + safetensors headers) against the same fit of a preset, side by side.

    .venv/bin/python bench/framework_speed.py            # medians; the table in PERFORMANCE.md
    .venv/bin/python bench/framework_speed.py --rounds 5

The machine is shared and noisy: compare the ratios measured side by side in one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402

LLAMA70 = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
}
"""meta-llama/Llama-3.1-70B's dimensions (the preset llama-3.1-70b cites its config.json)."""
FALCON40 = {"model_type": "falcon", "architectures": ["FalconForCausalLM"],
            "hidden_size": 8192, "num_attention_heads": 128, "num_hidden_layers": 60,
            "num_kv_heads": 8, "new_decoder_architecture": True, "vocab_size": 65024,
            "parallel_attn": True, "bias": False, "torch_dtype": "bfloat16"}  # fmt: skip
"""tiiuae/falcon-40b's dimensions: a family without a closed form here."""


def _median_s(fn: object, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def inventory_speed(rounds: int) -> None:
    t0 = time.perf_counter()
    from vrambudget.workloads.hf import inventory as inv
    from vrambudget.workloads.hf.resolve import cached_inventory

    print(f"import transformers + torch: {time.perf_counter() - t0:.2f} s (once per worker)")
    for name, config in (("llama 70B", LLAMA70), ("falcon 40B", FALCON40)):
        t0 = time.perf_counter()
        inv.inventory(config)
        first = time.perf_counter() - t0
        again = _median_s(lambda c=config: inv.inventory(c), rounds)
        cached_inventory(config)
        hit = _median_s(lambda c=config: cached_inventory(c), 200) * 1e6
        print(f"{name} inventory: first {first:.2f} s, again (median of {rounds}) {again:.2f} s, "
              f"cached {hit:.1f} us")  # fmt: skip


def trace_speed(rounds: int) -> None:
    from vrambudget.core.spec import BudgetRequest
    from vrambudget.trace.engine import trace_budget

    req = msgspec.convert(
        {
            "method": "trace",
            "workloads": [
                {
                    "kind": "inference",
                    "model": {"source": "preset", "id": "llama-3.1-70b"},
                    "batch_size": 8,
                    "prompt_tokens": 4096,
                    "generated_tokens": 256,
                }
            ],
            "device": {"source": "catalog", "id": "h100-sxm5-80gb"},
        },
        BudgetRequest,
    )
    t0 = time.perf_counter()
    budget = trace_budget(req)
    first = time.perf_counter() - t0
    again = _median_s(lambda: trace_budget(req), rounds)
    assert budget.trace is not None
    print(f"trace llama-3.1-70b inference, batch 8, 4096 + 256 ({budget.trace.code}): first "
          f"{first:.2f} s, median of {rounds} {again:.2f} s")  # fmt: skip


def fit_speed(rounds: int) -> None:
    from vrambudget.core.checkpoint import Checkpoint, StoredTensor
    from vrambudget.core.fit import FitRequest, fit
    from vrambudget.workloads.hf.resolve import cached_inventory, resolve_config

    # A checkpoint's headers as a Hub repository would give them: every tensor the framework
    # builds, stored in bf16 (the 70B's 723 tensors).
    config = LLAMA70
    layers = config["num_hidden_layers"]
    tensors = []
    for t in cached_inventory(config).tensors:
        if t.kind != "parameter":
            continue
        numel = 1
        for d in t.shape:
            numel *= d
        for i in t.layers or (None,):
            name = t.pattern.replace("{}", str(i)) if i is not None else t.pattern
            tensors.append(StoredTensor(name=name, dtype="BF16", shape=t.shape, nbytes=2 * numel))
    assert len({t.name for t in tensors}) >= layers
    resolved = resolve_config(config, name="hub llama 70B", origin="hub (bench)",
                              checkpoint=Checkpoint(tensors=tuple(tensors)))  # fmt: skip
    preset = {"source": "preset", "id": "llama-3.1-70b"}
    body = {"workloads": [{"kind": "inference", "model": preset, "batch_size": 8,
                           "prompt_tokens": 4096}]}  # fmt: skip
    preset_req = msgspec.convert(body, FitRequest)
    w = msgspec.structs.replace(preset_req.workloads[0], model=resolved)
    hub_req = msgspec.structs.replace(preset_req, workloads=(w,))
    fit(preset_req), fit(hub_req)  # warm both
    a, b = [], []
    for _ in range(rounds):
        a.append(_median_s(lambda: fit(preset_req), 1))
        b.append(_median_s(lambda: fit(hub_req), 1))
    pa, pb = statistics.median(a), statistics.median(b)
    print(f"whole-catalog fit (31 GPUs; batch, context, concurrency, device count solved): "
          f"preset {pa * 1000:.1f} ms, the same model "
          f"resolved from config + headers {pb * 1000:.1f} ms, ratio {pb / pa:.2f} "
          f"(medians of {rounds} alternating rounds)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    inventory_speed(args.rounds)
    fit_speed(max(args.rounds, 5))
    trace_speed(args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
