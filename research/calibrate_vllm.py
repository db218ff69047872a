"""Fit the vLLM engine constants on the ``split: calibrate`` runs of
``research/data/vllm_runs.json`` and write ``vrambudget/core/data/vllm_calibration.json``.

Run: .venv/bin/python -m research.calibrate_vllm            (writes the file)
     .venv/bin/python -m research.calibrate_vllm --check    (fails if the file is stale)

Only calibrate-split runs of the modelled versions are used; held-out runs are never read here.
Every fitted constant records the run ids it was fitted on. Fits (all on vLLM's own log lines):

- cuda_context_bytes: median init non-torch memory (before the snapshot) at TP1 PP1;
- nccl_init_bytes: median init non-torch minus the context with TP or PP > 1;
- non_torch_{tp1,tp2,tp4,pp}_bytes: median "non-torch forward increase" per layout class;
- sampler_bytes_per_logit, sampler_hidden_copies: least squares of the torch peak on dense
  last-stage runs whose sampler term dominates (peak = a S V + b T h e);
- forward_working_set_scale: median peak / working set on the runs whose forward dominates;
- pp_hidden_copies: median (peak - forward) / (T h e) on the first stage of PP runs;
- cuda_graph_{base,per_layer}_bytes_per_graph: least squares of graph memory per captured graph
  on layers per stage (every launch's printed graph counts checked against the rule);
- tp_comm_pcie_bytes: median implied tensor-parallel non-torch memory (less the one-GPU part)
  over the PCIe-only launches of research/data/vllm_tp_logs.json;
- non_torch_{tp2,tp4}_transfer_bytes: releases other than the calibrated one on NVLink-class
  fabrics: the larger of the H100 value and the largest implied value of those launches;
- kv_band_{calibrated,transfer}_bytes: the largest |predicted - printed| KV budget on the
  calibrated release's launches and on the tensor-parallel launches of the others.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from statistics import median
from typing import Any

import msgspec

from research import vllm_tp_logs
from research.committed import write_or_check
from research.vllm_runs import compare, load_runs, run_request
from vrambudget.core.formulas.activations import inference_working_set
from vrambudget.core.resolve import resolve_model
from vrambudget.core.serving import calibration as calibration_mod
from vrambudget.core.serving import engine_args, vllm
from vrambudget.core.units import GiB, ceil_div

OUT = Path(__file__).resolve().parents[1] / "vrambudget" / "core" / "data" / "vllm_calibration.json"
VERSION = "0.19.0"


def _features(run: dict[str, Any]) -> dict[str, Any] | None:
    req = run_request(run)
    if isinstance(req, str):
        return None
    w, total, gpu = req
    arch = resolve_model(w.model)
    r = engine_args.resolve(w, arch, total, gpu)
    par = engine_args._layout(arch, r)
    statics = vllm._statics(arch, r.dtype, engine_args.serving_quantization(w), par)
    st = statics[0]  # the first stage: the rank whose log lines were recorded
    T, S = r.max_num_batched_tokens, min(r.max_num_seqs, r.max_num_batched_tokens)
    q = ceil_div(T, S)
    ws = max(
        inference_working_set(layer, arch, st.dims, S, q, q, r.e, "flash")
        for layer, _ in st.layer_kinds
    )
    return {
        "id": run["id"],
        "t": r.tensor,
        "p": r.pipeline,
        "last": st.stage.last,
        "moe": arch.moe is not None,
        "SV": S * arch.vocab_size,
        "The": T * arch.hidden_size * r.e,
        "ws": ws,
        "layers": st.stage.num_layers,
        "graphs": r.cuda_graphs,
        "m": run["measured"],
        "x": run.get("measured_extra") or {},
    }


def _lsq(rows: list[tuple[float, float, float]]) -> tuple[float, float]:
    """Least squares y = a x1 + b x2 (no intercept) over rows (x1, x2, y)."""
    s11 = sum(x1 * x1 for x1, _, _ in rows)
    s12 = sum(x1 * x2 for x1, x2, _ in rows)
    s22 = sum(x2 * x2 for _, x2, _ in rows)
    s1y = sum(x1 * y for x1, _, y in rows)
    s2y = sum(x2 * y for _, x2, y in rows)
    det = s11 * s22 - s12 * s12
    return (s1y * s22 - s2y * s12) / det, (s2y * s11 - s1y * s12) / det


def _const(value: float, unit: str, provenance: str, ids: list[str]) -> dict[str, Any]:
    return {"value": value, "unit": unit, "provenance": provenance, "fitted_on": sorted(ids)}


def _fit_h100() -> dict[str, Any]:
    runs = [r for r in load_runs() if r["split"] == "calibrate" and r["vllm_version"] == VERSION]
    feats = [f for f in map(_features, runs) if f is not None]
    g = float(GiB)

    def med(rows: list[dict[str, Any]], key: Any) -> tuple[float, list[str]]:
        vals = [(key(f), f["id"]) for f in rows]
        vals = [(v, i) for v, i in vals if v is not None]
        return median(v for v, _ in vals), [i for _, i in vals]

    single = [f for f in feats if f["t"] == 1 and f["p"] == 1]
    ctx, ctx_ids = med(single, lambda f: f["x"].get("init_non_torch_memory_gib"))
    multi = [f for f in feats if (f["t"] > 1 or f["p"] > 1) and not f["moe"]]
    nccl, nccl_ids = med(
        multi,
        lambda f: (
            (f["x"]["init_non_torch_memory_gib"] - ctx)
            if f["x"].get("init_non_torch_memory_gib")
            else None
        ),
    )
    nt = {}
    for name, sel in (
        ("tp1", lambda f: f["t"] == 1 and f["p"] == 1),
        ("tp2", lambda f: f["t"] == 2),
        ("tp4", lambda f: f["t"] >= 4),
        ("pp", lambda f: f["t"] == 1 and f["p"] > 1),
    ):
        nt[name] = med([f for f in feats if sel(f)], lambda f: f["m"].get("non_torch_gib"))
    with_peak = [f for f in feats if f["m"].get("activation_peak_gib") and f["last"]]
    sampler_rows = [f for f in with_peak if not f["moe"] and f["SV"] * 15 > 1.5 * f["ws"]]
    a, b = _lsq([(f["SV"], f["The"], f["m"]["activation_peak_gib"] * g) for f in sampler_rows])
    fwd_rows = [f for f in with_peak if not f["moe"] and f["ws"] > a * f["SV"] + b * f["The"]]
    scale = median(f["m"]["activation_peak_gib"] * g / f["ws"] for f in fwd_rows)
    pp_rows = [f for f in feats if f["p"] > 1 and f["m"].get("activation_peak_gib")]
    pp_copies = median(
        (f["m"]["activation_peak_gib"] * g - scale * f["ws"]) / f["The"] for f in pp_rows
    )
    graph_rows = [f for f in feats if f["m"].get("cuda_graph_gib")]
    for f in graph_rows:  # the capture-size rule against what the launches printed
        sizes = f["x"].get("cudagraph_capture_sizes")
        if sizes and sizes["piecewise_count"] + sizes["full_count"] != f["graphs"]:
            raise SystemExit(f"{f['id']}: {sizes} graphs, the rule says {f['graphs']}")
    # graph memory per captured graph, linear in the layers on the stage
    n = len(graph_rows)
    mx = sum(f["layers"] for f in graph_rows) / n
    my = sum(f["m"]["cuda_graph_gib"] * g / f["graphs"] for f in graph_rows) / n
    slope = sum(
        (f["layers"] - mx) * (f["m"]["cuda_graph_gib"] * g / f["graphs"] - my) for f in graph_rows
    ) / sum((f["layers"] - mx) ** 2 for f in graph_rows)
    base = my - slope * mx
    src = "fitted by research/calibrate_vllm.py on vLLM 0.19.0 H100 launch logs (calibrate split)"
    constants = {
        "cuda_context_bytes": _const(
            round(ctx * g),
            "bytes",
            "median 'worker init memory snapshot' non_torch_memory at TP1 PP1; " + src,
            ctx_ids,
        ),
        "nccl_init_bytes": _const(
            round(nccl * g),
            "bytes",
            "median init non-torch memory minus "
            "the CUDA context with TP or PP > 1 (dense models); " + src,
            nccl_ids,
        ),
        **{
            f"non_torch_{k}_bytes": _const(
                round(v * g),
                "bytes",
                f"median 'non-torch forward increase memory' ({k}); " + src,
                ids,
            )
            for k, (v, ids) in nt.items()
        },
        "sampler_bytes_per_logit": _const(
            round(a, 4),
            "bytes per (sequence x vocabulary) element",
            "least squares of 'torch peak memory "
            "increase' = a S V + b T h e over dense runs whose "
            "sampler term dominates; " + src,
            [f["id"] for f in sampler_rows],
        ),
        "sampler_hidden_copies": _const(
            round(b, 4),
            "copies of T x h x e",
            "fitted with sampler_bytes_per_logit",
            [f["id"] for f in sampler_rows],
        ),
        "forward_working_set_scale": _const(
            round(scale, 4),
            "x working set",
            "median torch peak / working set over dense runs whose forward dominates; " + src,
            [f["id"] for f in fwd_rows],
        ),
        "pp_hidden_copies": _const(
            round(pp_copies, 4),
            "copies of T x h x e",
            "median (torch peak - forward) / (T h e) on the first stage of PP runs; " + src,
            [f["id"] for f in pp_rows],
        ),
        "moe_workspace_scale": _const(
            1.0,
            "x fused-MoE caches",
            "hand count of vLLM "
            "fused_experts_impl intermediate caches (not fitted: no "
            "calibrate MoE run with a modelled model logs its peak)",
            [],
        ),
        "cuda_graph_base_bytes_per_graph": _const(
            round(base),
            "bytes per graph",
            "least squares of the graph capture memory ('cuda_graph_actual') per captured "
            "graph (piecewise + FULL, engine_args.cudagraph_sizes) on layers per stage; " + src,
            [f["id"] for f in graph_rows],
        ),
        "cuda_graph_per_layer_bytes_per_graph": _const(
            round(slope),
            "bytes per graph per layer",
            "fitted with cuda_graph_base_bytes_per_graph",
            [f["id"] for f in graph_rows],
        ),
    }
    return {
        "schema": "vrambudget.vllm_calibration/1",
        "note": "Generated by research/calibrate_vllm.py from the calibrate split of "
        "vllm_runs.json and vllm_tp_logs.json; do not edit by hand.",
        "default_version": VERSION,
        "versions": [
            {
                "version": VERSION,
                "accounting": "v1",
                "description": "vLLM 0.19.0 (V1 engine): KV budget = ceil(total x util) - weights "
                "- profile torch peak - non-torch increase; CUDA context, NCCL init "
                "and CUDA graphs outside it; hybrid KV-cache manager on",
                "hybrid_kv_cache_manager": True,
                "cudagraph_in_budget": False,
                "baseline_in_budget": False,
                "defaults": {
                    "large_gpu_min_bytes": 70 * GiB,
                    "large_gpu_excluded": ["a100"],
                    "max_num_seqs_large": 1024,
                    "max_num_seqs_small": 256,
                    "max_num_batched_tokens_large": {"api_server": 8192, "llm_class": 16384},
                    "max_num_batched_tokens_small": {"api_server": 2048, "llm_class": 8192},
                    "block_size": 16,
                    "source": "vllm/engine/arg_utils.py EngineArgs.get_batch_defaults; logged "
                    "'Defaulting max_num_batched_tokens to 8192 / max_num_seqs to 1024' "
                    "on H100 (llmd019-llama31-8b-tp1-16384); CacheConfig block_size 16",
                },
                "constants": constants,
            }
        ],
    }


@contextmanager
def _provisional(doc: dict[str, Any]) -> Iterator[None]:
    """The engine model reading ``doc`` instead of the file (the fit's first stage)."""
    decoded = msgspec.json.decode(json.dumps(doc).encode(), type=calibration_mod._File)
    saved = calibration_mod._file
    calibration_mod._file = lambda: decoded  # type: ignore[assignment]
    calibration_mod.calibration.cache_clear()
    try:
        yield
    finally:
        calibration_mod._file = saved
        calibration_mod.calibration.cache_clear()


def fit() -> dict[str, Any]:
    """The H100 0.19.0 constants, then the tensor-parallel ones of other fabrics and releases
    from the implied non-torch memory of ``research/data/vllm_tp_logs.json`` (calibrate)."""
    doc = _fit_h100()
    constants = doc["versions"][0]["constants"]
    g = float(GiB)
    # provisional: the fabric and release classes take the H100 values while the launches'
    # implied values are computed (the implied value does not depend on them)
    for k in ("tp2", "tp4"):
        constants[f"non_torch_{k}_transfer_bytes"] = dict(constants[f"non_torch_{k}_bytes"])
    constants["tp_comm_pcie_bytes"] = _const(0, "bytes", "provisional", [])
    with _provisional(doc):
        rows = vllm_tp_logs.implied()
    src = "research/data/vllm_tp_logs.json (calibrate); research/vllm_tp_logs.py implied()"
    pcie = [r for r in rows if r.fabric == "pcie"]
    comm = median(r.implied_non_torch_bytes - r.base_non_torch_bytes for r in pcie)
    constants["tp_comm_pcie_bytes"] = _const(
        max(round(comm), 0),
        "bytes",
        "median implied non-torch increase less the one-GPU part over tensor-parallel "
        f"launches on PCIe-only GPUs ({len(pcie)} launches, vLLM "
        f"{', '.join(sorted({r.version for r in pcie}))}); {src}",
        [r.log for r in pcie],
    )
    for k, sel in (("tp2", lambda t: t == 2), ("tp4", lambda t: t >= 4)):
        other = [r for r in rows if r.fabric == "nvlink" and sel(r.tensor) and r.version != VERSION]
        h100 = constants[f"non_torch_{k}_bytes"]
        top = max((r.implied_non_torch_bytes for r in other), default=0)
        value = max(h100["value"], top)
        constants[f"non_torch_{k}_transfer_bytes"] = _const(
            value,
            "bytes",
            f"releases other than {VERSION} on NVLink / NVSwitch / unknown fabrics: the larger "
            f"of non_torch_{k}_bytes ({h100['value'] / g:.2f} GiB) and the largest implied "
            f"value of a calibrate launch of another release ({top / g:.2f} GiB); {src}",
            sorted(h100["fitted_on"] + [r.log for r in other]),
        )
    # the KV-token band: how far the KV budget landed from the printed one, in bytes, on the
    # calibrate launches of the calibrated release (vllm_runs.json) and on the others
    with _provisional(doc):
        runs = [
            r for r in load_runs() if r["split"] == "calibrate" and r["vllm_version"] == VERSION
        ]
        gaps = [
            (abs(c.predicted - c.measured) * g, c.run_id)
            for r in runs
            for c in compare(r)
            if c.quantity == "kv_cache_gib"
        ]
        rows = vllm_tp_logs.implied()
    constants["kv_band_calibrated_bytes"] = _const(
        round(max(v for v, _ in gaps)),
        "bytes",
        f"largest |predicted - printed| KV budget ('Available KV cache memory') over the "
        f"{len(gaps)} calibrate launches of {VERSION} (research/vllm_runs.py compare)",
        [i for _, i in gaps],
    )
    constants["kv_band_transfer_bytes"] = _const(
        round(max(abs(r.implied_non_torch_bytes - r.modelled_non_torch_bytes) for r in rows)),
        "bytes",
        "largest |predicted - printed| KV budget over the re-created launches of "
        f"research/data/vllm_tp_logs.json (other releases and fabrics); {src}",
        [r.log for r in rows],
    )
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    text = json.dumps(fit(), indent=1) + "\n"
    return write_or_check(OUT, text, args.check, "python -m research.calibrate_vllm")


if __name__ == "__main__":
    raise SystemExit(main())
