"""vrambudget's llama.cpp GPU compute buffers against llama.cpp's own scheduler and allocator run
with a CUDA-like device (bench/llamacpp_rpc.py's results), device by device.

    .venv/bin/python -m bench.llamacpp_rpc_compare [bench/results/llamacpp_rpc.json] [--rows]

Prints the median absolute error, the count under by more than 1%, 5% and 10%, the worst
under-estimates and the error by class (every layer / half / none on the GPU, one or two
devices, llama-server's outputs, ``--no-kv-offload``, the MoE models with and without
``--n-cpu-moe``), and the host's compute buffer of the ``--no-kv-offload`` loads and of those
on the CPU alone.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.llamacpp_compare import arch_of
from bench.llamacpp_cpu import tensor_plan
from bench.llamacpp_rpc import MODELS, MOE_MODELS, PORTS, _ngl
from vrambudget.core.serving.gguf.llamacpp import LlamaSettings, llama_account
from vrambudget.core.spec import GGUFTensorSpec

RESULTS = Path(__file__).parent / "results" / "llamacpp_rpc.json"
MiB = 1 << 20


@dataclass(frozen=True)
class Buffer:
    model: str
    settings: dict[str, Any]
    device: int
    layers: int
    output: bool
    measured_mib: float
    estimated_mib: float

    @property
    def error(self) -> float:
        return (self.estimated_mib - self.measured_mib) / self.measured_mib

    @property
    def klass(self) -> str:
        s = self.settings
        where = {"all": "every layer", "half": "half the layers", 0: "no layer"}[s["ngl"]]
        outputs = ", 4 outputs" if s.get("n_outputs") else ""
        nkvo = ", -nkvo" if s.get("kv_offload") is False else ""
        nkvo += ", --no-op-offload" if s.get("op_offload") is False else ""
        moe = ""
        if self.model.startswith("moe"):
            moe = ", MoE" + (f" --n-cpu-moe {s['n_cpu_moe']}" if "n_cpu_moe" in s else "")
        return f"{where} on the GPU, {s['devices']} device(s){outputs}{nkvo}{moe}"


def buffers(path: Path = RESULTS, host: bool = False) -> list[Buffer]:
    """Each GPU's compute buffer; with ``host``, the host's (``CPU``, device -1) instead, of
    the ``--no-kv-offload`` loads (where the attention's buffers move between the two) and of
    the loads on the CPU alone."""
    data = json.loads(path.read_text())
    plans = {m["name"]: m for m in MODELS + MOE_MODELS}
    out = []
    for run in data["runs"]:
        if run["returncode"] != 0:
            continue
        m = data["models"][run["model"]]
        s = run["settings"]
        if host and not (
            s["devices"] == 0 or s.get("kv_offload") is False or s.get("op_offload") is False
        ):
            continue  # the host's buffer is compared where its rules changed
        arch = arch_of(m)
        ctx = run["context"]
        settings = LlamaSettings(
            n_ctx=int(ctx["n_ctx"]),
            n_ctx_seq=int(ctx["n_ctx_seq"]),
            n_parallel=1,
            kv_unified=False,
            n_gpu_layers=_ngl(s["ngl"], m["n_layer"]),
            flash_attn=s["flash_attn"],
            n_ubatch=s["n_ubatch"],
            n_batch=s["n_batch"],
            type_k=s["type_k"],
            type_v=s["type_v"],
            devices=s["devices"],
            splits=(1.0,) * s["devices"],
            kv_offload=s.get("kv_offload", True),
            n_cpu_moe=min(s.get("n_cpu_moe", 0), m["n_layer"]),
            op_offload=s.get("op_offload", True),
            f16_mask=not s["f32_mask"],
            n_outputs=s.get("n_outputs"),
        )
        given = tuple(
            GGUFTensorSpec(name=n, type=t, shape=tuple(ne))  # type: ignore[arg-type]
            for n, ne, t in tensor_plan(plans[run["model"]])
        )
        account = llama_account(arch, "Q8_0", settings, given)
        if host:
            if "CPU" in run["compute_buffers"]:
                measured_host = run["compute_buffers"]["CPU"]
                estimated = account.host_compute_bytes / MiB
                out.append(Buffer(run["model"], s, -1, 0, False, measured_host, estimated))
            continue
        # both servers name their device RPC0: the port tells them apart
        measured = {
            PORTS.index(int(k.split(":")[-1].rstrip("]"))): v
            for k, v in run["compute_buffers"].items()
            if k.startswith("RPC")
        }
        for d in account.devices:
            if d.index in measured:
                out.append(
                    Buffer(
                        run["model"],
                        s,
                        d.index,
                        len(d.layers),
                        d.output,
                        measured[d.index],
                        d.compute_bytes / MiB,
                    )
                )
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    paths = [a for a in args if not a.startswith("--")]
    rows = buffers(Path(paths[0]) if paths else RESULTS)
    errs = [b.error for b in rows]
    print(
        f"{len(rows)} device buffers: median abs error {statistics.median(map(abs, errs)):.1%}; "
        f"under by > 1%: {sum(e < -0.01 for e in errs)}, > 5%: {sum(e < -0.05 for e in errs)}, "
        f"> 10%: {sum(e < -0.10 for e in errs)}; worst {min(errs):+.1%}, largest over "
        f"{max(errs):+.1%}"
    )
    print(f"{'class':<56}{'buffers':>8}{'median':>9}{'lowest':>9}{'highest':>9}")
    for klass in sorted({b.klass for b in rows}):
        e = [b.error for b in rows if b.klass == klass]
        print(f"{klass:<56}{len(e):>8}{statistics.median(e):>+9.1%}{min(e):>+9.1%}{max(e):>+9.1%}")
    host = buffers(Path(paths[0]) if paths else RESULTS, host=True)
    for label, rows_of in (
        ("under --no-kv-offload", [b for b in host if b.settings.get("kv_offload") is False]),
        ("under --no-op-offload", [b for b in host if b.settings.get("op_offload") is False]),
        ("on the CPU alone", [b for b in host if b.settings["devices"] == 0]),
    ):
        e = [b.error for b in rows_of]
        if e:
            print(
                f"the host's buffer {label}, {len(e)} loads: median abs error "
                f"{statistics.median(map(abs, e)):.1%}, worst {min(e):+.1%}, largest over "
                f"{max(e):+.1%}"
            )
    if "--rows" in args:
        for b in sorted(rows, key=lambda b: b.error):
            print(
                f"{b.model:<40} {json.dumps(b.settings, sort_keys=True)} GPU{b.device} "
                f"{b.measured_mib:9.2f} {b.estimated_mib:9.2f} MiB {b.error:+.1%}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
