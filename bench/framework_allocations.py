"""What the framework's code allocates that the built-in builders do not: each workload traced
both ways on fake tensors, the storages live at each trace's allocated peak grouped by the source
line that allocated them (the first frame in transformers / PEFT / the workload programs).

    .venv/bin/python bench/framework_allocations.py            # the table in docs/ACCURACY.md
    .venv/bin/python bench/framework_allocations.py --top 12   # more lines per workload

Prints, per workload, the peak (allocated) of each code path, the live bytes by component, and
the framework's largest live allocation sites at its peak.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402
import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from vrambudget.core.deployed import deploy  # noqa: E402
from vrambudget.core.resolve import resolve_model  # noqa: E402
from vrambudget.core.spec import InferenceWorkload, TrainingWorkload, Workload  # noqa: E402
from vrambudget.trace.events import ALLOC  # noqa: E402
from vrambudget.trace.recorder import Recorder  # noqa: E402
from vrambudget.workloads import kernels  # noqa: E402
from vrambudget.workloads.hf.program import prepare_framework  # noqa: E402
from vrambudget.workloads.run import prepare  # noqa: E402

WORKLOADS: list[tuple[str, dict[str, object]]] = [
    (
        "qwen2.5-0.5b training, full, seq 1024",
        {"kind": "training", "model": {"source": "preset", "id": "qwen2.5-0.5b"},
         "sequence_length": 1024},
    ),
    (
        "qwen2.5-0.5b training, LoRA, seq 1024",
        {"kind": "training", "model": {"source": "preset", "id": "qwen2.5-0.5b"},
         "sequence_length": 1024, "method": {"kind": "lora"}},
    ),
    (
        "qwen2.5-0.5b training, QLoRA, seq 1024",
        {"kind": "training", "model": {"source": "preset", "id": "qwen2.5-0.5b"},
         "sequence_length": 1024, "method": {"kind": "qlora"}},
    ),
    (
        "qwen2.5-0.5b training, full recompute, seq 2048",
        {"kind": "training", "model": {"source": "preset", "id": "qwen2.5-0.5b"},
         "sequence_length": 2048, "checkpointing": "full",
         "optimizer": {"name": "adamw", "implementation": "fused"}},
    ),
    (
        "qwen2.5-0.5b inference, batch 4, 512 + 256",
        {"kind": "inference", "model": {"source": "preset", "id": "qwen2.5-0.5b"},
         "batch_size": 4, "prompt_tokens": 512},
    ),
    (
        "gemma-2-2b inference bf16, batch 2, 8192 + 64",
        {"kind": "inference", "model": {"source": "preset", "id": "gemma-2-2b"},
         "batch_size": 2, "prompt_tokens": 8192, "generated_tokens": 64,
         "precision": {"weights": "bf16"}},
    ),
]  # fmt: skip


def _peak(recorder: Recorder) -> tuple[int, dict[int, int], str]:
    """The allocated peak, the storages live at it, and the phase it falls in."""
    live: dict[int, int] = {}
    sizes: dict[int, int] = {}
    total = best = 0
    best_live: dict[int, int] = {}
    best_phase = 0
    t = recorder.trace
    for kind, handle, nbytes, phase in t.events:
        if t.tags.get(handle) == "host":
            continue
        if kind == ALLOC:
            live[handle] = sizes[handle] = nbytes
            total += nbytes
            if total > best:
                best, best_live, best_phase = total, dict(live), phase
        else:
            total -= sizes.pop(handle, 0)
            live.pop(handle, None)
    it, name = t.phases[best_phase]
    return best, best_live, f"{name} (iteration {it})"


def trace(spec: dict[str, object], framework: bool) -> Recorder:
    w = deploy(msgspec.convert(spec, Workload))  # type: ignore[arg-type]
    assert isinstance(w, InferenceWorkload | TrainingWorkload)
    arch = resolve_model(w.model)
    recorder = Recorder(sources=True)
    with FakeTensorMode(), kernels.emulation(), recorder.recording():
        if framework:
            program = prepare_framework(w, arch, recorder, torch.device("cpu"), emulate=True)
        else:
            program = prepare(w, arch, recorder, torch.device("cpu"))
        program.run(2)
        del program
    return recorder


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f}"


def report(name: str, spec: dict[str, object], top: int) -> None:
    print(f"\n## {name}\n")
    rows = {}
    for framework in (False, True):
        rec = trace(spec, framework)
        peak, live, phase = _peak(rec)
        by_component: dict[str, int] = defaultdict(int)
        by_site: dict[tuple[str, str], int] = defaultdict(int)
        for handle, nbytes in live.items():
            tag = rec.trace.tags.get(handle, "activations")
            by_component[tag] += nbytes
            by_site[(tag, rec.trace.sources.get(handle, "?"))] += nbytes
        rows["framework" if framework else "builtin"] = (peak, phase, by_component, by_site)
    b, f = rows["builtin"], rows["framework"]
    print(f"peak allocated: built-in {_mib(b[0])} MiB at {b[1]}; framework {_mib(f[0])} MiB at "
          f"{f[1]} ({(f[0] - b[0]) / b[0]:+.1%})\n")  # fmt: skip
    print("| component | built-in MiB | framework MiB |")
    print("| --- | ---: | ---: |")
    for c in sorted(set(b[2]) | set(f[2])):
        print(f"| {c} | {_mib(b[2].get(c, 0))} | {_mib(f[2].get(c, 0))} |")
    print(f"\nframework, largest live allocation sites at its peak (top {top}):\n")
    print("| component | MiB | allocated at |")
    print("| --- | ---: | --- |")
    for (tag, site), nbytes in sorted(f[3].items(), key=lambda kv: -kv[1])[:top]:
        if tag in ("weights", "adapters", "quantization_metadata", "optimizer_state",
                   "master_weights", "gradients"):  # fmt: skip
            continue
        print(f"| {tag} | {_mib(nbytes)} | `{site}` |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args(argv)
    for name, spec in WORKLOADS:
        report(name, spec, args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
