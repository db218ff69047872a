"""The GPU campaign (bench/gpu/campaign.py) and its ingest into the corpus
(research/gpu_campaign.py).

The end-to-end test runs the dry run as the script runs it -- the whole matrix on the CPU, tiny
sizes, every workload probed in its own process and estimated by both tiers -- then ingests the
JSON and decodes the records with research.corpus. The fast tests check, without a GPU, what only
a GPU run produces: the NVML footprint of a result and the records of a CUDA result.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from bench.gpu.campaign import TRAINING_LOOP, Case, _measured, _Nvml, _probe, dumps, matrix
from research.corpus import load, request_of
from research.gpu_campaign import ingest, records, result_lines
from tests.support.fake_nvml import FakeGPU, FakeNVML
from tests.support.workloads import TINIEST
from vrambudget.agent import nvml
from vrambudget.agent.nvml import binding
from vrambudget.agent.sampler import SamplerResult
from vrambudget.agent.spec import DeviceView, Iteration, ProbeResult, TorchView

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.trace_grid  # a fork server, 13 probes and 26 estimates: about 20 s on 2 cores
def test_dry_run_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "campaign.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gpu.campaign", "--dry-run", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["dry_run"] and doc["complete"] and doc["device"]["device"] == "cpu"
    assert [r["name"] for r in doc["results"]] == [c.name for c in matrix(dry_run=True)]
    for r in doc["results"]:
        assert r["status"] == "succeeded", r
        agent = r["agent"]
        assert agent["headroom"] is not None or agent["engine"] is not None, r
        if r["name"] == "agent-engine-vllm":  # the fake engine on the CPU
            engine = agent["engine"]
            assert engine["started"] and engine["errors"] == 0 and r["measured"] is None
            assert engine["requests"] == 32 and engine["startup"]["kv_cache_tokens"] > 0
            assert engine["ttft"]["p50_s"] <= engine["end_to_end"]["p50_s"]
            continue
        if r["name"] == "agent-quality":
            q = agent["quality"]
            assert [c["label"] for c in q["candidates"]] == ["bf16", "nf4"] and q["passed"]
            bf16, nf4 = q["candidates"]
            assert nf4["mean_kl"] > bf16["mean_kl"] >= 0.0  # 4-bit rounds more than bf16
        if r["name"] == "agent-snapshot":
            snap = agent["snapshot"]
            assert snap is not None and snap["bytes"] > 0 and snap["entries"] > 0
            assert (out.parent / "agent-snapshot.pickle").stat().st_size == snap["bytes"]
        m = r["measured"]
        assert m["device"] == "cpu"
        assert m["torch_max_memory_allocated"] > m["torch_weights"] > 0
        assert m["torch_max_memory_reserved"] is None and m["nvml_device_peak"] is None
        assert r["analytic"]["total"] > 0 and r["trace"]["total"] > 0, r
        assert r["trace"]["code"].startswith("framework" if r["code"] == "framework" else "built")
    assert len(doc["reports"]) == len(doc["results"])
    assert all(
        rep["report"]["comparison"] is not None
        for rep in doc["reports"]
        if rep["name"] != "agent-engine-vllm"
    )

    gpu, corpus = tmp_path / "gpu", tmp_path / "corpus"
    with pytest.raises(ValueError, match="dry run"):
        ingest(out, gpu_dir=gpu, corpus_dir=corpus, root=tmp_path)
    target = ingest(out, gpu_dir=gpu, corpus_dir=corpus, root=tmp_path, allow_dry_run=True)
    recs = load([target])
    assert target.name == f"gpu_campaign_{doc['started_at'][:10]}.json"
    (kept,) = gpu.iterdir()
    assert kept.read_bytes() == out.read_bytes()
    lines = {line.removesuffix(",") for line in kept.read_text().split("\n")}
    assert len(recs) >= 2 * len(doc["results"])
    for rec in recs:
        assert rec.excluded and rec.gpu == "cpu" and rec.unit == "B"
        assert rec.url == f"gpu/{kept.name}"
        assert rec.quote in lines
        request_of(rec)  # the workload reproduces the run as a budget request
    assert len(load([ingest(out, gpu_dir=gpu, corpus_dir=corpus, allow_dry_run=True)])) == len(
        recs
    )  # ingesting again replaces the campaign's records


def _cuda_result() -> ProbeResult:
    return ProbeResult(
        device="cuda",
        device_name="NVIDIA H200",
        torch_version="2.11.0+cu130",
        cuda_version="13.0",
        driver_version="580.159.04",
        torch=TorchView(
            allocated_peak_bytes=3 << 30,
            reserved_peak_bytes=4 << 30,
            num_alloc_retries=0,
            num_ooms=0,
            inactive_split_peak_bytes=1 << 20,
            weights_bytes=1 << 30,
            kv_cache_bytes=256 << 20,
            workspace_bytes=32 << 20,
            iteration_peak_bytes=(3 << 30, 3 << 30),
        ),
        nvml=DeviceView(
            baseline_used_bytes=2 << 30,
            peak_used_bytes=6 << 30,
            samples=400,
            sample_interval_s=0.005,
            max_sample_interval_s=0.02,
            process_peak_used_bytes=None,
            accounting_max_memory_bytes=None,
            cuda_context_bytes=500 << 20,
            others_changed_bytes=0,
            others_visible=False,
        ),
        host_peak_rss_bytes=3 << 30,
        iterations=Iteration(p50_s=1.0, p95_s=1.1, count=2, throughput_per_s=8.0, errors=0),
        outputs_finite=True,
        memory_total_bytes=150_000 << 20,
        compute_capability="9.0",
    )


def _samples(peak: int) -> SamplerResult:
    return SamplerResult(
        baseline_used_bytes=2 << 30,
        peak_used_bytes=peak,
        min_used_bytes=2 << 30,
        final_used_bytes=2 << 30,
        samples=400,
        failed_samples=0,
        mean_interval_s=0.005,
        max_interval_s=0.02,
        memory_api="v2",
        process_peak_bytes=None,
        others_changed_bytes=0,
        others_changed=False,
        others_visible=False,
    )


def test_nvml_footprint_is_the_peak_above_the_idle_device() -> None:
    idle = 600 << 20
    m = _measured(_cuda_result(), idle, _samples(5 << 30))
    assert m["nvml_device_peak"] == (5 << 30) - idle
    assert m["nvml_cuda_context"] == 500 << 20
    assert m["torch_max_memory_reserved"] == 4 << 30
    assert _measured(_cuda_result(), None, None)["nvml_device_peak"] is None


def _gpu_doc(measured: dict[str, Any]) -> dict[str, Any]:
    case = matrix()[0]
    return {
        "schema": "vrambudget.gpu_campaign/1",
        "dry_run": False,
        "started_at": "2026-12-04T10:00:00Z",
        "host": {"packages": {"torch": "2.11.0+cu130", "transformers": "5.23.0"}, "env": {}},
        "nvml": {"driver_version": "580.159.04"},
        "device": {
            "device": "cuda",
            "gpu_name": "NVIDIA H200",
            "gpu_id": "h200-sxm-141gb",
            "compute_capability": "9.0",
            "memory_total_bytes": 150_000 << 20,
            "torch_version": "2.11.0+cu130",
            "cuda_version": "13.0",
        },
        "results": [
            {
                "name": case.name,
                "code": case.code,
                "status": "succeeded",
                "workload": case.workload,
                "iterations": 2,
                "warmup_iterations": 1,
                "concurrency": 1,
                "measured": measured,
            }
        ],
    }


def test_a_cuda_result_becomes_one_record_per_view() -> None:
    measured = _measured(_cuda_result(), 600 << 20, _samples(5 << 30))
    doc = _gpu_doc(measured)
    text = dumps(doc)
    lines = result_lines(text)
    recs = records(json.loads(text), lines, "research/data/gpu/x.json")
    by_view = {(r.view, r.quantity): r for r in recs}
    assert {v for v, _ in by_view} == {"torch_max_allocated", "torch_max_reserved", "nvidia_smi"}
    assert by_view["nvidia_smi", "peak_device_bytes"].measured == (5 << 30) - (600 << 20)
    assert by_view["torch_max_reserved", "peak_device_bytes"].measured == 4 << 30
    assert by_view["torch_max_allocated", "kv_cache_bytes"].measured == 256 << 20
    for r in recs:
        assert r.excluded is None and r.gpu_id == "h200-sxm-141gb" and r.framework == "transformers"
        assert r.quote == lines[doc["results"][0]["name"]] and r.quote in text
        assert "NVIDIA H200" in r.conditions and "NVML sampled every 5.0 ms" in r.conditions
        assert r.id.startswith("gpu-campaign-2026-12-04T100000-h200-sxm-141gb-framework-generate-")
        assert r.group == "gpu-campaign-2026-12-04T100000-h200-sxm-141gb"
        request_of(r)
    # the corpus file format decodes them
    body = {"schema": "vrambudget.corpus/1", "records": [msgspec.to_builtins(r) for r in recs]}
    assert len(msgspec.json.decode(msgspec.json.encode(body))["records"]) == len(recs)


def test_a_run_with_expandable_segments_is_estimated_with_them() -> None:
    """The matrix's expandable twins ask the probe for the setting; their records carry it in
    the request the estimate is made from, and in the conditions."""
    twins = [c for c in matrix() if c.name.endswith("-expandable")]
    assert [c.name.removesuffix("-expandable") for c in twins] == [
        "framework-lora",
        "framework-full-checkpointing-1.5b",
    ]
    assert all(c.request(60.0).expandable_segments for c in twins)
    doc = _gpu_doc(_measured(_cuda_result(), 600 << 20, _samples(5 << 30)))
    doc["results"][0]["expandable_segments"] = True
    text = dumps(doc)
    for r in records(json.loads(text), result_lines(text), "research/data/gpu/x.json"):
        assert r.software is not None and r.software["expandable_segments"] is True
        assert "expandable_segments:True" in r.conditions
        assert request_of(r).software is not None
        assert request_of(r).software.expandable_segments


def _training_doc(
    training_loop: str | None, optimizer_state: int, concurrency: int = 1
) -> dict[str, Any]:
    measured = _measured(_cuda_result(), 600 << 20, _samples(5 << 30))
    doc = _gpu_doc(measured)
    if training_loop is not None:
        doc["training_loop"] = training_loop
    r = doc["results"][0]
    r["workload"] = {
        "kind": "training",
        "model": {"source": "preset", "id": "qwen2.5-0.5b"},
        "sequence_length": 512,
    }
    r["concurrency"] = concurrency
    r["analytic"] = {"total": 5 << 30, "components": {"optimizer_state": optimizer_state}}
    return doc


@pytest.mark.parametrize(
    ("loop", "state", "concurrency", "why"),
    [
        (None, 3 << 30, 1, "rebuilt the optimizer"),  # before the fix, a full fine-tune
        (None, 16 << 20, 1, None),  # LoRA's moments: under 1% of every peak
        (TRAINING_LOOP, 3 << 30, 1, None),  # after the fix
        (TRAINING_LOOP, 0, 16, "16 threads"),  # the probe's streams are not batched requests
    ],
)
def test_peaks_a_campaign_could_not_measure_as_estimated_are_excluded(
    loop: str | None, state: int, concurrency: int, why: str | None
) -> None:
    """Campaigns before ``training_loop`` existed measured training programs that rebuilt the
    optimizer per probe iteration: a peak lacking moments worth 1% or more of it is excluded,
    naming the bytes; a concurrency-mode run (threads on their own streams) is no batched
    estimate's program. The weights record stays either way."""
    doc = _training_doc(loop, state, concurrency)
    text = dumps(doc)
    recs = records(json.loads(text), result_lines(text), "research/data/gpu/x.json")
    peaks = [r for r in recs if r.quantity == "peak_device_bytes"]
    assert len(peaks) == 3
    for r in peaks:
        assert (r.excluded is None) if why is None else (why in (r.excluded or "")), r.excluded
    if why == "rebuilt the optimizer":
        assert all("3072 MiB of state" in (r.excluded or "") for r in peaks)
    assert all(r.excluded is None for r in recs if r.quantity == "weights_bytes")


def test_nvml_wiring_with_a_fake_binding(monkeypatch: pytest.MonkeyPatch) -> None:
    """What only a GPU host runs, on a fake NVML: the idle reading before the child, the
    sampler the child's load phase starts here, its peak in the result (the child itself takes
    the CPU path)."""
    fake = FakeNVML([FakeGPU(used_bytes=600 << 20)])
    monkeypatch.setattr(binding, "load_binding", lambda: fake)
    monkeypatch.setattr(nvml, "load_binding", lambda: fake)
    meter = _Nvml.open()
    assert meter is not None and meter.idle() == 600 << 20
    tiny = TINIEST
    case = Case(
        "tiny",
        "builtin",
        {"kind": "inference", "model": tiny, "prompt_tokens": 8, "generated_tokens": 2},
        "the wiring",
        iterations=1,
    )
    entry, report = _probe(case, 60, meter, None)
    assert report is not None and entry.result["status"] == "succeeded", entry.result
    m = entry.result["measured"]
    assert m["nvml_idle_used"] == 600 << 20 and m["nvml_device_peak"] == 0
    assert m["nvml_samples"] >= 2 and entry.extra["nvml_sampler"]["memory_api"] == "v2"
