"""Probe reports built by hand, shaped like the agent's CUDA path, with round numbers."""

from __future__ import annotations

from typing import Any

import msgspec

from vrambudget.core.probe_report import (
    DeviceView,
    Iteration,
    ProbeRequest,
    ProbeResource,
    ProbeResult,
    TorchView,
)

MiB = 1 << 20
H100_TOTAL = 85_045_477_376  # the catalog's h100-sxm5-80gb runtime total
WORKLOAD = {
    "kind": "inference",
    "model": {"source": "preset", "id": "qwen2.5-0.5b"},
    "batch_size": 4,
    "prompt_tokens": 512,
    "generated_tokens": 64,
}


def cuda_report(
    *,
    probe_id: str = "p-h100",
    nvml: bool = True,
    kv: bool = True,
    status: str = "succeeded",
    workload: dict[str, Any] | None = None,
    torch_version: str = "2.13.0+cu130",
    context: int = 560 * MiB,
    reserved_extra: int = 300 * MiB,
) -> ProbeResource:
    """A report shaped like the CUDA path's, with round numbers to check the arithmetic."""
    req = msgspec.convert({"workload": workload or WORKLOAD, "iterations": 3}, ProbeRequest)
    weights = 1_000 * MiB
    kv_bytes = 200 * MiB
    workspace = 36 * MiB
    allocated_peak = weights + workspace + (kv_bytes if kv else 0) + 150 * MiB
    reserved_peak = allocated_peak + reserved_extra
    view = (
        DeviceView(
            baseline_used_bytes=2 * MiB,
            peak_used_bytes=0,
            samples=100,
            sample_interval_s=0.005,
            max_sample_interval_s=0.02,
            process_peak_used_bytes=reserved_peak + context + 12 * MiB,
            accounting_max_memory_bytes=None,
            cuda_context_bytes=context,
            others_changed_bytes=0,
            others_visible=True,
        )
        if nvml
        else None
    )
    result = ProbeResult(
        device="cuda",
        device_name="NVIDIA H100 80GB HBM3",
        torch_version=torch_version,
        cuda_version="13.0",
        driver_version="580.82.07",
        torch=TorchView(
            allocated_peak_bytes=allocated_peak,
            reserved_peak_bytes=reserved_peak,
            num_alloc_retries=0,
            num_ooms=0,
            inactive_split_peak_bytes=8 * MiB,
            weights_bytes=weights,
            kv_cache_bytes=kv_bytes if kv else None,
            workspace_bytes=workspace,
            iteration_peak_bytes=(
                allocated_peak - 4 * MiB,
                allocated_peak,
                allocated_peak - 2 * MiB,
            ),
        ),
        nvml=view,
        host_peak_rss_bytes=3 << 30,
        iterations=Iteration(p50_s=0.1, p95_s=0.2, count=3, throughput_per_s=30.0, errors=0),
        outputs_finite=True,
        memory_total_bytes=85_024_112_640,
        compute_capability="9.0",
    )
    return ProbeResource(
        id=probe_id,
        status=status,
        created_at=1.0,  # type: ignore[arg-type]
        updated_at=2.0,
        request=req,
        result=result,
    )
