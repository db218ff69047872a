"""Per-process GPU memory that no tensor holds, step by step, on the machine's own stack: the
CUDA context (``torch.cuda.init``), then the first bf16 GEMM (cuBLAS/cuBLASLt workspace and the
kernels' modules), the first fp32 GEMM, the first flash SDPA, the first cuDNN convolution --
each as NVML's device-used delta and the caching allocator's allocated bytes -- under
``CUDA_MODULE_LOADING=LAZY`` (the default since CUDA 11.7 / torch 1.13) and ``EAGER``.

    python3 bench/gpu/stack_overheads.py [OUT.json]     # about 30 s on one GPU

Each mode runs in a fresh interpreter (the loading mode is read at context creation)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

CHILD = r"""
import json, os, time
import pynvml, torch
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
def used():
    torch.cuda.synchronize() if torch.cuda.is_initialized() else None
    time.sleep(0.3)
    return pynvml.nvmlDeviceGetMemoryInfo(h).used
steps = []
base = used()
def mark(name):
    steps.append({"step": name, "nvml_delta": used() - base,
                  "allocated": torch.cuda.memory_allocated() if torch.cuda.is_initialized() else 0,
                  "reserved": torch.cuda.memory_reserved() if torch.cuda.is_initialized() else 0})
torch.cuda.init(); torch.zeros(1, device="cuda"); mark("context+first tensor")
a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
_ = a @ a; del _; mark("bf16 gemm")
b = torch.nn.functional.linear(a, a, a[0]); del b; mark("bf16 linear with bias (cuBLASLt)")
f = torch.randn(1024, 1024, device="cuda"); _ = f @ f; del _; mark("fp32 gemm")
q = torch.randn(4, 16, 1024, 128, device="cuda", dtype=torch.bfloat16)
with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
    o = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
del o; mark("flash sdpa")
x = torch.randn(8, 64, 56, 56, device="cuda", dtype=torch.bfloat16)
w = torch.randn(64, 64, 3, 3, device="cuda", dtype=torch.bfloat16)
y = torch.nn.functional.conv2d(x, w, padding=1); del y; mark("cudnn conv2d bf16")
print(json.dumps({"mode": os.environ.get("CUDA_MODULE_LOADING"), "base": base, "steps": steps,
                  "torch": torch.__version__, "cuda": torch.version.cuda,
                  "cudnn": torch.backends.cudnn.version(), "gpu": torch.cuda.get_device_name(0),
                  "driver": pynvml.nvmlSystemGetDriverVersion()}))
"""


def main() -> int:
    out = (
        sys.argv[1]
        if len(sys.argv) > 1
        else os.path.join(os.environ.get("OUT", "."), "stack_overheads.json")
    )
    runs = []
    for mode in ("LAZY", "EAGER"):
        env = dict(os.environ, CUDA_MODULE_LOADING=mode)
        p = subprocess.run(
            [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120
        )
        if p.returncode != 0:
            runs.append({"mode": mode, "error": p.stderr[-2000:]})
        else:
            runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
        print(json.dumps(runs[-1]))
    with open(out, "w") as fh:
        json.dump({"schema": "vrambudget.stack_overheads/1", "runs": runs}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
