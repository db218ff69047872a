"""Corpus records from a GPU campaign (``bench/gpu/campaign.py``): one record per measured
number of each finished workload -- ``torch.cuda.max_memory_allocated``,
``max_memory_reserved``, the NVML device peak, and the weights and the KV cache the allocator
held -- with the conditions the campaign recorded, the result's JSON line as the quote and the
repository path of the results file as the source.

The results file is kept whole under ``research/data/gpu/`` (copied there byte for byte when it
lies elsewhere), so every quote is a line a reader finds in it. The records go to
``research/data/corpus/gpu_campaign_<date>.json``; ingesting again replaces the records of the
same campaign (its group) and keeps the others of that date.

A dry run's numbers (the CPU path: the trace tier's tracker on real tensors) become records too,
each ``excluded``: they check the pipeline, they are no GPU measurement.

Run from the repository root:
    python -m research.gpu_campaign RESULTS.json [--gpu-dir DIR] [--corpus-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path
from typing import Any

import msgspec

from research.corpus import CORPUS, Framework, Quantity, Record, View, load

__all__ = ["GPU_DATA", "ingest", "records", "result_lines"]

ROOT = Path(__file__).resolve().parents[1]
GPU_DATA = Path(__file__).parent / "data" / "gpu"
CAMPAIGN_SCHEMA = "vrambudget.gpu_campaign/1"

# (key in the result's "measured", the view, the quantity, the id's suffix)
_NUMBERS: tuple[tuple[str, View, Quantity, str], ...] = (
    ("torch_max_memory_allocated", "torch_max_allocated", "peak_device_bytes", "allocated"),
    ("torch_max_memory_reserved", "torch_max_reserved", "peak_device_bytes", "reserved"),
    ("nvml_device_peak", "nvidia_smi", "peak_device_bytes", "nvml"),
    ("torch_weights", "torch_max_allocated", "weights_bytes", "weights"),
    ("torch_kv_cache", "torch_max_allocated", "kv_cache_bytes", "kv-cache"),
)

_WHAT = {
    "allocated": "torch.cuda.max_memory_allocated() over the measured iterations (peaks reset "
    "after the warm-up; the weights and any KV cache are allocated then)",
    "reserved": "torch.cuda.max_memory_reserved() over the measured iterations (peaks reset "
    "after the warm-up)",
    "nvml": "NVML's device used memory, sampled in a thread during the measured iterations, "
    "peak minus the device's used memory read before the process started: the process's "
    "whole footprint, CUDA context included",
    "weights": "torch.cuda.memory_allocated() after the model was built minus before "
    "(parameters and buffers)",
    "kv-cache": "the KV cache tensors the last generate held, each rounded up to the "
    "allocator's 512-byte blocks",
}
_CPU_WHAT = "the trace tier's tracker on real CPU tensors (a dry run: no CUDA allocator)"


def result_lines(text: str) -> dict[str, str]:
    """The verbatim line of each result in a campaign file (by workload name), trailing comma
    dropped."""
    out: dict[str, str] = {}
    inside = False
    for line in text.split("\n"):
        if line == '"results": [':
            inside = True
            continue
        if inside and line.startswith("]"):
            break
        if inside:
            body = line.removesuffix(",")
            out[json.loads(body)["name"]] = body
    return out


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _gpu_slug(doc: dict[str, Any]) -> str:
    d = doc.get("device") or {}
    if doc.get("dry_run"):
        return "cpu-dry-run"
    return str(d.get("gpu_id") or _slug(str(d.get("gpu_name") or "gpu")))


def _date(doc: dict[str, Any]) -> str:
    return str(doc["started_at"])[:10]


def _stamp(doc: dict[str, Any]) -> str:
    """The campaign's start, ``2026-12-04T164803``: two campaigns of one day on one GPU (a
    rerun of what the first skipped, say) are two groups and two kept files."""
    return re.sub(r"[^0-9T-]", "", str(doc["started_at"]))[:17]


def _kind(workload: dict[str, Any]) -> str:
    if workload["kind"] == "inference":
        return "inference"
    method = (workload.get("method") or {}).get("kind", "full")
    return "fine_tuning" if method in ("lora", "qlora") else "training"


def _program(doc: dict[str, Any], r: dict[str, Any]) -> str:
    pk = doc["host"]["packages"]
    w = r["workload"]
    lora = (w.get("method") or {}).get("kind") in ("lora", "qlora")
    if r["code"] == "framework":
        step = (
            "generate (DynamicCache, greedy, fp32 last-position logits)"
            if w["kind"] == "inference"
            else "a Trainer step (forward, loss_function, backward, clip_grad_norm_, "
            "optimizer.step, zero_grad)"
        )
        peft = f" with PEFT {pk.get('peft')} LoRA" if lora else ""
        return f"transformers {pk.get('transformers')} {step}{peft}"
    what = "inference (prefill, then decode into a preallocated KV cache)"
    if w["kind"] == "training":
        what = "training step (forward, backward, optimizer step)" + (" with LoRA" if lora else "")
    return f"vrambudget's built-in builders (plain torch) {what}"


def _model(w: dict[str, Any]) -> str:
    m = w["model"]
    if m.get("source") == "preset":
        return f"preset {m['id']} built from its config.json with random weights (no checkpoint)"
    return f"{m.get('name') or 'a model'} from an inline config.json with random weights"


def _conditions(doc: dict[str, Any], r: dict[str, Any]) -> str:
    w, m, f = r["workload"], r["measured"], doc.get("device") or {}
    fields = ", ".join(
        f"{k}={json.dumps(v) if isinstance(v, dict | list) else v}"
        for k, v in w.items()
        if k not in ("kind", "model")
    )
    parts = [
        _program(doc, r),
        f"{_model(w)}; {w['kind']}: {fields}",
        f"{r['warmup_iterations']} warm-up and {r['iterations']} measured iterations, "
        f"{r['concurrency']} stream(s), a fresh process",
    ]
    if doc.get("dry_run"):
        parts.append(f"dry run on the CPU, torch {doc['host']['packages'].get('torch')}")
        return "; ".join(parts)
    nv = doc.get("nvml") or {}
    total = f.get("memory_total_bytes")
    parts.append(
        f"{f.get('gpu_name')} (compute capability {f.get('compute_capability')}, "
        f"{total / 2**30:.1f} GiB)"
        if total
        else str(f.get("gpu_name"))
    )
    parts.append(
        f"torch {f.get('torch_version')}, CUDA {f.get('cuda_version')}, driver "
        f"{nv.get('driver_version')}"
    )
    alloc = doc["host"].get("env", {}).get("PYTORCH_CUDA_ALLOC_CONF")
    if r.get("expandable_segments"):
        alloc = "expandable_segments:True (the probe request's)"
    parts.append(f"PYTORCH_CUDA_ALLOC_CONF={alloc}" if alloc else "default allocator settings")
    if m.get("nvml_samples"):
        parts.append(
            f"NVML sampled every {1000 * m['nvml_interval_mean_s']:.1f} ms (worst "
            f"{1000 * m['nvml_interval_max_s']:.1f} ms), {m['nvml_samples']} samples; device "
            f"used before the process {m['nvml_idle_used'] / 2**20:.0f} MiB; CUDA context "
            f"{(m.get('nvml_cuda_context') or 0) / 2**20:.0f} MiB"
        )
    return "; ".join(parts)


STALE_OPTIMIZER_SHARE = 0.01
"""A training peak of a campaign whose program rebuilt the optimizer per iteration is kept only
where the optimizer's state (the analytic estimate) is under this share of it."""


def _stale_optimizer(doc: dict[str, Any], r: dict[str, Any], value: float) -> str | None:
    """Campaigns without ``training_loop`` (before 2026-12-04 17:10 UTC) ran training programs
    that built the fp32 masters and the optimizer anew on every ``run(1)`` call the probe made:
    the moments did not exist during the measured forward and backward, so a peak there is
    low by up to the optimizer's state. LoRA's few adapter moments hardly matter; a full
    fine-tune's do."""
    if doc.get("training_loop") is not None or r["workload"]["kind"] != "training":
        return None
    state = ((r.get("analytic") or {}).get("components") or {}).get("optimizer_state", 0)
    if state < STALE_OPTIMIZER_SHARE * value:
        return None
    return (
        "measured by a program that rebuilt the optimizer on every iteration (fixed after this "
        f"campaign): its {state / 2**20:.0f} MiB of state was absent from the forward and "
        "backward, so this peak is low"
    )


def _excluded(
    doc: dict[str, Any], r: dict[str, Any], suffix: str, quantity: Quantity, value: float
) -> str | None:
    m = r["measured"]
    if doc.get("dry_run") or m.get("device") != "cuda":
        return "a dry run on the CPU (the trace tier's tracker on real tensors): no GPU measurement"
    if r["status"] == "oom":
        return "out of memory: the peak is where the allocation failed, not the workload's"
    if r["status"] == "unreliable" or (suffix == "nvml" and (m.get("nvml_others_changed") or 0)):
        return "other processes changed device memory during the measurement"
    if not m.get("outputs_finite", True):
        return "the outputs were not finite"
    if quantity != "peak_device_bytes":
        return None
    if (r.get("concurrency") or 1) > 1:
        return (
            f"the probe ran {r['concurrency']} threads, each on its own CUDA stream (a cuBLAS "
            "workspace and handles per stream); the estimate is of as many requests batched "
            "on one stream, as a serving process runs them: not the same program"
        )
    return _stale_optimizer(doc, r, value)


def records(doc: dict[str, Any], lines: dict[str, str], url: str) -> list[Record]:
    """One record per measured number of every result with a measurement."""
    if doc.get("schema") != CAMPAIGN_SCHEMA:
        raise ValueError(f"not a GPU campaign file (schema {doc.get('schema')!r})")
    date, stamp, gpu = _date(doc), _stamp(doc), _gpu_slug(doc)
    device = doc.get("device") or {}
    packages = doc["host"]["packages"]
    out: list[Record] = []
    for r in doc["results"]:
        m = r.get("measured")
        if m is None:
            continue
        w = r["workload"]
        lora = (w.get("method") or {}).get("kind") in ("lora", "qlora")
        for key, view, quantity, suffix in _NUMBERS:
            value = m.get(key)
            if value is None or (quantity != "peak_device_bytes" and not value):
                continue
            if suffix == "weights" and lora:
                continue  # the measured bytes hold the adapters too (a separate component)
            framework: Framework = "transformers" if r["code"] == "framework" else "pytorch"
            version = packages.get("transformers") if framework == "transformers" else None
            notes = _CPU_WHAT if m.get("device") != "cuda" else _WHAT[suffix]
            if r.get("estimate_notes"):
                notes += "; " + "; ".join(r["estimate_notes"])
            out.append(
                Record(
                    id=f"gpu-campaign-{stamp}-{gpu}-{r['name']}-{suffix}",
                    group=f"gpu-campaign-{stamp}-{gpu}",
                    kind=_kind(w),  # type: ignore[arg-type]
                    framework=framework,
                    framework_version=version,
                    torch_version=device.get("torch_version") or packages.get("torch"),
                    cuda_version=device.get("cuda_version"),
                    gpu=str(device.get("gpu_name") or "cpu"),
                    gpu_id=device.get("gpu_id"),
                    view=view,
                    quantity=quantity,
                    value=float(value),
                    unit="B",
                    conditions=_conditions(doc, r),
                    quote=lines[r["name"]],
                    url=url,
                    title=f"vrambudget GPU campaign {date}: {r['name']} on {gpu}",
                    published=date,
                    workload=r.get("estimated_workload") or w,
                    # The RMSNorm the built-in builders imitated (campaigns before the field
                    # ran one F.rms_norm, fused); the framework code is transformers' own.
                    software=_software(doc, r, framework),
                    excluded=_excluded(doc, r, suffix, quantity, float(value)),
                    notes=notes,
                )
            )
    return out


def _software(doc: dict[str, Any], r: dict[str, Any], framework: str) -> dict[str, Any] | None:
    """The run's software as the estimate needs it: the built-in builders' RMSNorm, and the
    allocator's expandable segments where the probe ran with them."""
    sw = _builtin_software(doc) if framework == "pytorch" else {}
    if r.get("expandable_segments"):
        sw["expandable_segments"] = True
    return sw or None


def _builtin_software(doc: dict[str, Any]) -> dict[str, Any]:
    norm = doc.get("builtin_rms_norm", "fused")
    # The request's norm names the implementation; LitGPT's fp32 variant is not the builders'.
    return {"norm": "fused" if norm == "fused" else "fp32_upcast"}


def _repo_path(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.resolve().as_posix()


def ingest(
    results: Path,
    *,
    gpu_dir: Path = GPU_DATA,
    corpus_dir: Path = CORPUS,
    root: Path = ROOT,
    allow_dry_run: bool = False,
) -> Path:
    """Keep the results file under ``gpu_dir`` and write (or update) the date's corpus file;
    returns the corpus file's path. A dry run is refused unless ``allow_dry_run``."""
    text = results.read_text(encoding="utf-8")
    doc = json.loads(text)
    if doc.get("dry_run") and not allow_dry_run:
        raise ValueError(f"{results} is a dry run (the CPU path): not GPU measurements")
    lines = result_lines(text)
    date = _date(doc)
    kept = gpu_dir / f"gpu_campaign_{_stamp(doc)}_{_gpu_slug(doc)}.json"
    if results.resolve() != kept.resolve():
        gpu_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(results, kept)
    new = records(doc, lines, _repo_path(kept, root))
    target = corpus_dir / f"gpu_campaign_{date}.json"
    groups = {r.group for r in new}
    old = [r for r in load([target]) if r.group not in groups] if target.exists() else []
    body = {
        "schema": "vrambudget.corpus/1",
        "about": "vrambudget's own GPU campaigns (bench/gpu/campaign.py): small models with "
        "random weights run for real through transformers (generate, a Trainer step with PEFT "
        "LoRA) and the built-in builders; each number quotes its line of the results file kept "
        "under research/data/gpu/. Group prefix gpu-campaign-.",
        "records": [msgspec.to_builtins(r) for r in (*old, *new)],
    }
    corpus_dir.mkdir(parents=True, exist_ok=True)
    target.write_bytes(msgspec.json.format(msgspec.json.encode(body), indent=1) + b"\n")
    load([target])  # decodes, ids unique
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("results", type=Path, help="a campaign's JSON file")
    ap.add_argument("--gpu-dir", type=Path, default=GPU_DATA)
    ap.add_argument("--corpus-dir", type=Path, default=CORPUS)
    ap.add_argument("--allow-dry-run", action="store_true", help="ingest a dry run (excluded)")
    a = ap.parse_args(argv)
    try:
        target = ingest(
            a.results,
            gpu_dir=a.gpu_dir,
            corpus_dir=a.corpus_dir,
            allow_dry_run=a.allow_dry_run,
        )
    except ValueError as exc:
        ap.error(str(exc))
    n = len(load([target]))
    print(f"wrote {target} ({n} records)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
