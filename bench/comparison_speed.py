"""Cost of a comparison next to a budget, side by side in one run, through the whole ASGI stack
(Litestar TestClient): ``POST /v1/comparisons`` of a CUDA-shaped probe report (Llama 3.1 8B
inference on an H100) vs ``POST /v1/budgets`` of the same workload with a distinct body every
call (no answer cache), interleaved, medians of 5 rounds of 200 requests.

    .venv/bin/python -m bench.comparison_speed
"""

from __future__ import annotations

import statistics
import time

import msgspec
from litestar.testing import TestClient

from vrambudget.core.probe_report import (
    DeviceView,
    Iteration,
    ProbeRequest,
    ProbeResource,
    ProbeResult,
    TorchView,
)
from vrambudget.service.app import create_app

WORKLOAD = {
    "kind": "inference",
    "model": {"source": "preset", "id": "llama-3.1-8b"},
    "batch_size": 8,
    "prompt_tokens": 4096,
    "generated_tokens": 512,
}
GiB = 1 << 30


def _report(batch: int) -> bytes:
    req = msgspec.convert({"workload": {**WORKLOAD, "batch_size": batch}}, ProbeRequest)
    result = ProbeResult(
        device="cuda",
        device_name="NVIDIA H100 80GB HBM3",
        torch_version="2.13.0+cu130",
        cuda_version="13.0",
        driver_version="580.82.07",
        torch=TorchView(
            allocated_peak_bytes=40 * GiB,
            reserved_peak_bytes=44 * GiB,
            num_alloc_retries=0,
            num_ooms=0,
            inactive_split_peak_bytes=GiB,
            weights_bytes=15 * GiB,
            kv_cache_bytes=20 * GiB,
            workspace_bytes=36 << 20,
            iteration_peak_bytes=(40 * GiB,) * 3,
        ),
        nvml=DeviceView(
            baseline_used_bytes=0,
            peak_used_bytes=45 * GiB,
            samples=100,
            sample_interval_s=0.005,
            max_sample_interval_s=0.01,
            process_peak_used_bytes=45 * GiB,
            accounting_max_memory_bytes=None,
            cuda_context_bytes=534 << 20,
            others_changed_bytes=0,
            others_visible=True,
        ),
        host_peak_rss_bytes=8 * GiB,
        iterations=Iteration(p50_s=1.0, p95_s=1.1, count=3, throughput_per_s=8.0, errors=0),
        outputs_finite=True,
        memory_total_bytes=85_045_477_376,
        compute_capability="9.0",
    )
    return msgspec.json.encode(
        ProbeResource(
            id=f"p{batch}",
            status="succeeded",
            created_at=0,
            updated_at=0,
            request=req,
            result=result,
        )
    )


def main() -> None:
    n = 200
    reports = [_report(b) for b in range(1, n + 1)]
    budgets = [
        msgspec.json.encode(
            {
                "workloads": [{**WORKLOAD, "batch_size": b}],
                "device": {"source": "catalog", "id": "h100-sxm5-80gb"},
            }
        )
        for b in range(1, n + 1)
    ]
    rounds: dict[str, list[float]] = {"comparison": [], "budget": []}
    with TestClient(create_app()) as client:
        for body in reports[:5]:  # warm-up
            assert client.post("/v1/comparisons", content=body).status_code == 200
        for r in range(5):
            for name, path, bodies in (
                ("comparison", "/v1/comparisons", reports),
                ("budget", "/v1/budgets", budgets),
            ):
                # distinct bodies per round too, so no answer is reused
                salt = b" " * (r + 1)
                t = time.perf_counter()
                for body in bodies:
                    assert client.post(path, content=body + salt).status_code == 200
                rounds[name].append((time.perf_counter() - t) / n * 1e3)
    c, b = statistics.median(rounds["comparison"]), statistics.median(rounds["budget"])
    print(
        f"POST /v1/comparisons  median {c:.3f} ms per request (rounds: "
        f"{', '.join(f'{x:.3f}' for x in rounds['comparison'])})"
    )
    print(
        f"POST /v1/budgets      median {b:.3f} ms per request (rounds: "
        f"{', '.join(f'{x:.3f}' for x in rounds['budget'])})"
    )
    print(f"ratio comparison / budget: {c / b:.2f}")


if __name__ == "__main__":
    main()
