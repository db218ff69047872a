#!/usr/bin/env python3
"""llama.cpp's per-GPU compute buffers, measured on the CPU through its RPC backend made to act
like CUDA.

llama.cpp's scheduler decides what a GPU's compute buffer holds: which ops run there (with
partial offload, matmuls of host-resident weights are copied to the GPU, ``offload_op``), which
inputs are copied to it (the KQ mask), and how its graph allocator packs them. None of that
runs on a CPU-only build. The RPC backend (``-DGGML_RPC=ON``) is a device whose buffers are not
host memory, served here by ``ggml-rpc-server`` on 127.0.0.1, so llama.cpp's own scheduler and
allocator place and size everything as they do for a GPU. ``bench/llamacpp_rpc.patch`` makes
that device follow the CUDA backend's rules where they differ (each cited in the patch):

- ``offload_op``: ops with a batch of 32 or more (``GGML_OP_OFFLOAD_MIN_BATCH``) are offloaded
  (ggml-cuda.cu:5636-5655);
- the CUDA buffer type's sizes: 128-byte alignment, quantized rows padded to 512 elements, flash
  attention's f16 copies of a quantized K/V (ggml-cuda.cu:897-920, fattn.cu:722-756);
- 256-byte aligned buffers (``cudaMalloc``);
- ``VB_F32_MASK=1``: the f32 KQ mask plus its cast to f16 of builds before b9410
  (ggml-org/llama.cpp#23764 made the mask f16 where flash attention is on);
- ``VB_N_OUTPUTS_MAX=N``: the logits' rows llama-server reserves from b9460 (``n_outputs_max``
  = its slots), which ``llama-completion`` leaves at the micro-batch (the grid's
  ``n_outputs`` runs).

The grid also loads with ``--no-kv-offload`` (``kv_offload: false``: the KV cache in host
memory), with ``--no-op-offload`` (``op_offload: false``), on the CPU alone (``devices: 0``,
no RPC device), and two MoE models with ``--n-cpu-moe`` (their expert weights in host
memory).

The patch applies to the llama.cpp vendored in llama-cpp-python 0.3.36 (commit 0c1e570):

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36
    tar xzf llama_cpp_python-0.3.36.tar.gz
    cd llama_cpp_python-0.3.36/vendor/llama.cpp && patch -p1 < bench/llamacpp_rpc.patch
    cmake -S . -B build -G Ninja -DGGML_RPC=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Release
    ninja -C build ggml-rpc-server llama-completion          # about 8 minutes on 2 cores

Then, from the repository root (writes bench/results/llamacpp_rpc.json, about 4 minutes):

    .venv/bin/python bench/llamacpp_rpc.py --bin <that build>/build/bin

Synthetic llama-architecture GGUF files (random weights, ``bench/llamacpp_cpu.py``) are loaded
with ``llama-completion`` under a grid of contexts, micro-batches, flash attention, KV types,
GPU layers and one or two devices; every buffer line llama.cpp prints is parsed. Does not
import vrambudget.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from llamacpp_cpu import parse_log, write_gguf  # noqa: E402

DEFAULT_OUT = HERE / "results" / "llamacpp_rpc.json"
PORTS = (50152, 50153)

MODELS = [
    dict(
        name="l8_e1024_h16_kv4_ff3584_v32000_q8",
        n_layer=8,
        n_embd=1024,
        n_head=16,
        n_head_kv=4,
        n_ff=3584,
        vocab=32000,
        tied=False,
        types=dict(
            embd="Q8_0", attn="Q8_0", attn_o="Q8_0", ffn="Q8_0", ffn_down="Q8_0", output="Q8_0"
        ),
    ),
    dict(
        name="l6_e2048_h16_kv8_ff5632_v8000_q8",
        n_layer=6,
        n_embd=2048,
        n_head=16,
        n_head_kv=8,
        n_ff=5632,
        vocab=8000,
        tied=False,
        types=dict(
            embd="Q8_0", attn="Q8_0", attn_o="Q8_0", ffn="Q8_0", ffn_down="Q8_0", output="F16"
        ),
    ),
    dict(
        name="l4_e768_h12_kv4_ff2048_v50000_tied_q8",
        n_layer=4,
        n_embd=768,
        n_head=12,
        n_head_kv=4,
        n_ff=2048,
        vocab=50000,
        tied=True,
        types=dict(
            embd="Q8_0", attn="Q8_0", attn_o="Q8_0", ffn="Q8_0", ffn_down="Q8_0", output="Q8_0"
        ),
    ),
]


_Q8 = dict(embd="Q8_0", attn="Q8_0", attn_o="Q8_0", ffn="Q8_0", ffn_down="Q8_0", output="Q8_0")
MOE_MODELS = [  # Mixtral's layout (llama architecture, merged expert tensors)
    dict(
        name="moe_l6_e1024_h16_kv4_ff1408_x16k4_v32000_q8",
        n_layer=6,
        n_embd=1024,
        n_head=16,
        n_head_kv=4,
        n_ff=1408,
        n_expert=16,
        n_expert_used=4,
        vocab=32000,
        tied=False,
        types=_Q8,
    ),
    dict(
        name="moe_l4_e2048_h16_kv4_ff768_x32k8_v8000_q8",
        n_layer=4,
        n_embd=2048,
        n_head=16,
        n_head_kv=4,
        n_ff=768,
        n_expert=32,
        n_expert_used=8,
        vocab=8000,
        tied=False,
        types=_Q8,
    ),
]


def _load(
    n_ctx: int,
    flash_attn: bool,
    n_ubatch: int,
    ngl: int | str,
    devices: int,
    *,
    n_batch: int = 512,
    f32_mask: bool = False,
    kv: str = "f16",
    **extra: object,
) -> dict:
    """One load's settings (``extra``: ``kv_offload``, ``n_outputs``, ``n_cpu_moe``)."""
    return dict(
        n_ctx=n_ctx,
        flash_attn=flash_attn,
        n_ubatch=n_ubatch,
        n_batch=n_batch,
        f32_mask=f32_mask,
        ngl=ngl,
        devices=devices,
        type_k=kv,
        type_v=kv,
        **extra,
    )


def moe_grid(quick: bool) -> list[dict]:
    """The MoE models: ``--n-cpu-moe`` none / 2 layers / every layer (99), micro-batches on
    both sides of the op-offload threshold, one and two devices; and half the layers on the
    host without it."""
    runs = []
    for n_cpu_moe, ub, n_ctx, fa, devices in itertools.product(
        (0, 2, 99), (512, 128, 32, 16), (4096, 16384), (True, False), (1, 2)
    ):
        if quick and (ub not in (512, 16) or devices == 2 or n_ctx > 4096):
            continue
        runs.append(_load(n_ctx, fa, ub, "all", devices, n_cpu_moe=n_cpu_moe))
    for ub, fa in itertools.product((512, 128), (True, False)):
        runs.append(_load(4096, fa, ub, "half", 1))
    # --no-op-offload: the expert matmuls stay on the host
    for n_cpu_moe, ub, n_ctx, fa, devices in itertools.product(
        (2, 99), (512, 128), (4096, 16384), (True, False), (1, 2)
    ):
        if quick and (ub != 512 or devices == 2 or n_ctx > 4096):
            continue
        runs.append(_load(n_ctx, fa, ub, "all", devices, n_cpu_moe=n_cpu_moe, op_offload=False))
    return runs


def grid(quick: bool) -> list[dict]:
    runs = []
    ctxs = (4096, 16384, 65536) if not quick else (4096, 32768)
    for n_ctx, fa, ub, f32_mask, ngl, devices in itertools.product(
        ctxs, (True, False), (512, 256), (False, True), ("all", "half", 0), (1, 2)
    ):
        if quick and (ub != 512 or devices == 2):
            continue
        if not fa and f32_mask:
            continue  # without flash attention the mask is f32 in every build
        if ngl == 0 and devices == 2:
            continue
        if not fa and n_ctx > 16384:
            continue  # f32 scores of every head at 64K cells: gigabytes, the rule is linear
        caches = ("f16", "q8_0") if fa and ub == 512 and ngl == "all" else ("f16",)
        for kv in caches:
            runs.append(
                _load(n_ctx, fa, ub, ngl, devices, n_batch=max(ub, 512), f32_mask=f32_mask, kv=kv)
            )
    # --no-kv-offload: the KV cache in host memory; with flash attention the attention still
    # runs on the GPU, copying each layer's K and V; without it, on the host
    for n_ctx, fa, ub, f32_mask, ngl, devices in itertools.product(
        ctxs, (True, False), (512, 256), (False, True), ("all", "half"), (1, 2)
    ):
        if quick and (ub != 512 or devices == 2):
            continue
        if not fa and (f32_mask or n_ctx > 16384):
            continue
        caches = ("f16", "q8_0") if fa and not f32_mask and ngl == "all" else ("f16",)
        for kv in caches:
            runs.append(
                _load(
                    n_ctx,
                    fa,
                    ub,
                    ngl,
                    devices,
                    n_batch=max(ub, 512),
                    f32_mask=f32_mask,
                    kv=kv,
                    kv_offload=False,
                )
            )
    # the CPU alone (no RPC device): the f32 mask of builds before b9410 in the CPU's buffer
    for n_ctx, ub, f32_mask in itertools.product((8192, 32768), (512, 256), (False, True)):
        if quick and ub != 512:
            continue
        runs.append(_load(n_ctx, True, ub, 0, 0, f32_mask=f32_mask))
    # --no-op-offload: the matmuls of host-resident weights stay on the host
    for n_ctx, fa, ub, ngl in itertools.product(
        (4096, 16384), (True, False), (512, 256), ("half", 0)
    ):
        if quick and ub != 512:
            continue
        runs.append(_load(n_ctx, fa, ub, ngl, 1, op_offload=False))
    # llama-server from b9460: the logits of its four slots' outputs (VB_N_OUTPUTS_MAX)
    for n_ctx, fa, ngl in itertools.product(ctxs[:2], (True, False), ("all", "half", 0)):
        runs.append(_load(n_ctx, fa, 512, ngl, 1, n_outputs=4))
    return runs


def _ngl(value: int | str, n_layer: int) -> int:
    if value == "all":
        return n_layer + 1
    if value == "half":
        return n_layer // 2
    return int(value)


OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
SPLITS = re.compile(r"graph: nodes = (\d+), splits = (\d+)")
COPIES = re.compile(r"sched copies = (\d+)")


def run_one(binary: Path, model: Path, m: dict, s: dict) -> dict:
    ports = PORTS[: s["devices"]]
    rpc = ["--rpc", ",".join(f"127.0.0.1:{p}" for p in ports)] if ports else []
    cmd = [
        str(binary / "llama-completion"),
        "-m",
        str(model),
        *rpc,
        "-n",
        "1",
        "-p",
        "hi",
        "-no-cnv",
        "-v",
        "--fit",
        "off",
        "-c",
        str(s["n_ctx"]),
        "-ub",
        str(s["n_ubatch"]),
        "-b",
        str(s["n_batch"]),
        "-fa",
        "on" if s["flash_attn"] else "off",
        "-ngl",
        str(_ngl(s["ngl"], m["n_layer"])),
        "-ctk",
        s["type_k"],
        "-ctv",
        s["type_v"],
        "-t",
        "2",
    ]
    if s["devices"] > 1:
        cmd += ["--tensor-split", "1,1"]
    if not s.get("kv_offload", True):
        cmd.append("-nkvo")
    if s.get("n_cpu_moe"):
        cmd += ["--n-cpu-moe", str(s["n_cpu_moe"])]
    if s.get("op_offload") is False:
        cmd.append("--no-op-offload")
    env = dict(os.environ, VB_CUDA_ALLOC="1", VB_CUDA_OFFLOAD="1")
    if s["f32_mask"]:
        env["VB_F32_MASK"] = "1"
    if s.get("n_outputs"):
        env["VB_N_OUTPUTS_MAX"] = str(s["n_outputs"])
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, errors="replace", timeout=300)
    log = p.stdout + p.stderr
    out = dict(settings=s, returncode=p.returncode, seconds=round(time.perf_counter() - t0, 2))
    out.update(parse_log(log))
    if mo := OFFLOADED.search(log):
        out["offloaded"] = [int(mo.group(1)), int(mo.group(2))]
    if mo := SPLITS.search(log):
        out["graph"] = dict(nodes=int(mo.group(1)), splits=int(mo.group(2)))
    if mo := COPIES.search(log):
        out["sched_copies"] = int(mo.group(1))
    if p.returncode != 0:
        out["log_tail"] = log[-2000:]
    return out


def start_servers(binary: Path) -> list[subprocess.Popen]:
    env = dict(os.environ, VB_CUDA_ALLOC="1", VB_CUDA_OFFLOAD="1")
    procs = [
        subprocess.Popen(
            [str(binary / "ggml-rpc-server"), "-H", "127.0.0.1", "-p", str(port), "-t", "2"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for port in PORTS
    ]
    time.sleep(1.5)
    return procs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", type=Path, required=True, help="the patched build's bin directory")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    procs = start_servers(args.bin)
    t0 = time.perf_counter()
    results: dict = dict(
        generated_by="bench/llamacpp_rpc.py",
        quick=args.quick,
        generated_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        llama_cpp="llama-cpp-python 0.3.36 vendored llama.cpp 0c1e570 + bench/llamacpp_rpc.patch",
        models={},
        runs=[],
    )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for m in MODELS + MOE_MODELS:
                path = Path(tmp) / f"{m['name']}.gguf"
                facts = write_gguf(m, path)
                facts.pop("tensors")
                results["models"][m["name"]] = facts
                for s in grid(args.quick) if m in MODELS else moe_grid(args.quick):
                    r = run_one(args.bin, path, m, s)
                    r["model"] = m["name"]
                    results["runs"].append(r)
                    print(
                        m["name"],
                        json.dumps(s, sort_keys=True),
                        r.get("compute_buffers"),
                        "rc",
                        r["returncode"],
                        flush=True,
                    )
    finally:
        for p in procs:
            p.terminate()
    results["seconds"] = round(time.perf_counter() - t0, 1)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"{len(results['runs'])} runs in {results['seconds']} s -> {args.out}")


if __name__ == "__main__":
    main()
