"""In-process speed of the analytic tier, side by side in one run.

    .venv/bin/python bench/estimate_speed.py [--reps N]
    .venv/bin/python bench/estimate_speed.py --llm-analysis-python /path/to/venv/bin/python

Reports medians of 7 repetitions (``--reps``): one budget (distinct requests: the batch size
changes every call, so no answer is reused -- only what does not depend on the batch is cached,
as in the service), the same on a catalog GPU (with its compatibility verdict and fit), the
same with JSON decode + encode, and a whole-catalog /v1/fits with all maxima solved. With
``--llm-analysis-python`` it also times llm-analysis 0.2.2's ``LLMAnalysis.inference`` for the
same model in a subprocess of that interpreter, in the same run, and prints the ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec

from vrambudget.core.estimate import estimate
from vrambudget.core.fit import FitRequest, fit
from vrambudget.core.result import Budget
from vrambudget.core.spec import BudgetRequest, CatalogDevice, Workload

REPS = 7

LLM_ANALYSIS = r"""
import logging, statistics, sys, time
logging.disable(logging.CRITICAL)
from llm_analysis.analysis import LLMAnalysis
from llm_analysis.config import (DtypeConfig, GPUConfig, ModelConfig, ParallelismConfig)
# llm-analysis requires ffn_embed_dim % hidden_dim == 0, so Llama-3.1-8B's 14336 cannot be
# expressed; 16384 (4 x hidden) is the nearest shape it accepts. Only speed is compared.
model = ModelConfig(name="llama-3.1-8b-like", num_layers=32, n_head=32, hidden_dim=4096,
                    vocab_size=128256, max_seq_len=131072, num_key_value_heads=8,
                    ffn_embed_dim=16384, model_type="llama")
gpu = GPUConfig(name="h100", mem_per_GPU_in_GB=80, hbm_bandwidth_in_GB_per_sec=3350,
                intra_node_bandwidth_in_GB_per_sec=450, intra_node_min_message_latency=8e-6,
                peak_fp16_TFLOPS=989, peak_i8_TFLOPS=1979, peak_i4_TFLOPS=3958)
dtype = DtypeConfig(name="w16a16e16", weight_bits=16, activation_bits=16, embedding_bits=16)
reps = []
for rep in range(7):
    n = 200
    t0 = time.perf_counter()
    for i in range(n):
        LLMAnalysis(model, gpu, dtype, ParallelismConfig()).inference(
            batch_size_per_gpu=1 + i % 64, seq_len=1024, num_tokens_to_generate=256)
    reps.append((time.perf_counter() - t0) / n)
print(statistics.median(reps))
"""


def median_us(fn, n: int, reps_n: int = REPS) -> float:
    fn(0)
    reps = []
    for _ in range(reps_n):
        t0 = time.perf_counter()
        for i in range(n):
            fn(i)
        reps.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(reps)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--llm-analysis-python")
    parser.add_argument(
        "--reps",
        type=int,
        default=REPS,
        help="repetitions per measurement (more: a median less moved by a noisy host)",
    )
    args = parser.parse_args()

    workloads = [
        msgspec.convert(
            {
                "kind": "inference",
                "model": {"source": "preset", "id": "llama-3.1-8b"},
                "batch_size": 1 + i % 64,
                "prompt_tokens": 1024,
                "generated_tokens": 256,
            },
            Workload,
        )
        for i in range(64)
    ]
    training = [
        msgspec.convert(
            {
                "kind": "training",
                "model": {"source": "preset", "id": "llama-3.1-8b"},
                "micro_batch_size": 1 + i % 8,
                "parallelism": {"data": 8, "zero_stage": 3},
            },
            Workload,
        )
        for i in range(64)
    ]
    bodies = [json.dumps({"workloads": [msgspec.to_builtins(w)]}).encode() for w in workloads]
    decoder = msgspec.json.Decoder(BudgetRequest)
    encoder = msgspec.json.Encoder()

    def inference_budget(i: int) -> Budget:
        return estimate((workloads[i % 64],))

    h100 = CatalogDevice(id="h100-sxm5-80gb")

    def device_budget(i: int) -> Budget:
        return estimate((workloads[i % 64],), h100)

    def training_budget(i: int) -> Budget:
        return estimate((training[i % 64],))

    def http_shaped(i: int) -> bytes:
        req = decoder.decode(bodies[i % 64])
        return encoder.encode(estimate(req.workloads, req.device, req.headroom))

    fit_req = msgspec.convert(
        {"workloads": [{"kind": "inference", "model": {"source": "preset", "id": "llama-3.1-8b"}}]},
        FitRequest,
    )

    results = {
        "budget, inference (us)": median_us(inference_budget, 2000, args.reps),
        "budget, inference on an H100 (us)": median_us(device_budget, 2000, args.reps),
        "budget, training ZeRO-3 (us)": median_us(training_budget, 2000, args.reps),
        "decode + budget + encode (us)": median_us(http_shaped, 2000, args.reps),
        "whole-catalog fit, all maxima (us)": median_us(lambda i: fit(fit_req), 50, args.reps),
    }
    if args.llm_analysis_python:
        out = (
            subprocess.run(
                [args.llm_analysis_python, "-c", LLM_ANALYSIS],
                check=True,
                capture_output=True,
                text=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        results["llm-analysis 0.2.2 inference (us)"] = float(out) * 1e6
        results["ratio llm-analysis / vrambudget budget"] = (
            results["llm-analysis 0.2.2 inference (us)"] / results["budget, inference (us)"]
        )
    n_gpus = len(fit(fit_req).gpus)
    print(f"medians of {args.reps} repetitions; whole catalog = {n_gpus} GPUs")
    for name, value in results.items():
        print(f"{name:42s} {value:10.2f}")


if __name__ == "__main__":
    main()
