"""The GPU campaign: a fixed matrix of workloads run for real on one CUDA device, each measured
by the probe agent's own code and estimated by both tiers, written to ONE JSON file.

Run on the GPU machine through ``bench/gpu/campaign.sh`` (it installs the carried wheels first;
``bench/gpu/prepare.sh`` fills them here beforehand); or, where the project's dependencies are
installed, from the repository root:

    python -m bench.gpu.campaign [OUT.json]            # the GPU run: < 7 minutes on an H100/H200
    python -m bench.gpu.campaign --dry-run [OUT.json]  # the whole matrix on the CPU, tiny sizes

OUT.json defaults to ``$OUT/gpu_campaign.json`` where ``$OUT`` is set, else
``bench/results/gpu_campaign.json``. ``research/gpu_campaign.py`` turns the file into corpus
records.

Each run is one probe (:class:`vrambudget.agent.runner.ProbeProcess`: a fresh child process,
the agent's time limit, NVML sampled by :class:`vrambudget.agent.sampler.NVMLSampler` in a
thread of this process during the measured iterations), so it records what the agent records:
``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` after a warm-up, the weights, the
KV cache, the cuBLAS workspace, the CUDA context. The device's idle memory is read here before
each child starts, so the NVML peak minus it is the run's whole footprint, context included. One
more child measures the bare CUDA context (NVML after ``torch.cuda.init()``, no tensor) and the
conditions (GPU, compute capability, driver, torch, CUDA). The analytic and the trace estimate of
each run (the same ``estimate_input`` / ``compare`` as ``POST /v1/comparisons`` and
``bench/gpu_probe_check.py``) are computed in a pool of worker processes (CUDA hidden from them)
while the next workload runs on the device.

After the first three framework probes come the agent's acceptance-test checks (issue 17): an
output-quality check (fp8 and nf4 against bf16 on the shipped passages), a private memory
snapshot (``torch.cuda.memory._snapshot``, written next to the JSON when it is at most 32 MiB),
and an engine probe of vLLM where ``vllm`` is on the PATH and the preset's checkpoint is in the
machine's Hugging Face cache (else recorded as skipped with the reason; the dry run uses the
fake engine of tests/support/fake_engine.py). Their results carry ``agent``: the weights that
ran, the quality report, the snapshot's size, the engine's report and the observed headroom.

The time budget: the matrix is ordered by value (the framework's generate / Trainer steps first,
then the built-in builders, then the variants); each run gets the rest of the budget at most
(``--budget-s``, default 380 s) and a workload that would start with too little left is recorded
as skipped; the file is rewritten (atomically) after every run and every estimate, so a killed
campaign leaves every finished result.

The JSON keeps one result per line (``results``: the measured numbers, both estimates and the
conditions of one workload) so that a corpus record can quote its line verbatim; the full probe
reports with their comparisons follow (``reports``, one per line).

``--dry-run``: CUDA is hidden, the probes take the CPU path (the trace tier's tracker on real
tensors; the numbers it cannot give are null), the model is a two-layer Qwen2 and every size is
cut down; the children start from a fork server that has torch and transformers imported (a
fresh interpreter per run, as the agent spawns them, costs seconds of imports each). Well under
a minute.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any, Literal

import msgspec

from vrambudget.agent import nvml
from vrambudget.agent.child import ChildSettings
from vrambudget.agent.probe import child_main
from vrambudget.agent.runner import ProbeProcess
from vrambudget.agent.sampler import NVMLSampler, SamplerResult
from vrambudget.agent.spec import ProbeRequest, ProbeResource, ProbeResult
from vrambudget.core.calibration import PROFILES_ENV
from vrambudget.core.catalog import match_gpu, preset
from vrambudget.core.compare import compare, estimate_input
from vrambudget.core.compare.inputs import COMPARABLE_STATUSES
from vrambudget.core.compare.observed import observed_headroom
from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.result import Budget
from vrambudget.core.spec import DeviceRef, PresetModel, Workload

__all__ = ["SCHEMA", "Case", "main", "matrix", "run"]

SCHEMA = "vrambudget.gpu_campaign/1"
ROOT = Path(__file__).resolve().parents[2]

TRAINING_LOOP = "masters and optimizer kept across iterations"
"""The training programs' loop semantics (``vrambudget.workloads.step.TrainingState``),
written into every campaign file. Campaigns before it rebuilt the optimizer on every probe
iteration, so their training peaks lack the optimizer's moments."""
DEFAULT_BUDGET_S = 380.0
"""The Python driver's share of the 8 minutes (campaign.sh installs the wheels before it and
runs ``stack_overheads.py`` and ``generate_ratchet.py``, about 65 s, after it)."""
MIN_START_S = 40.0
"""A workload is not started with less than this left of the budget (it would be killed)."""
ESTIMATE_RESERVE_S = 15.0
"""Kept back from the last runs for the estimates still in the pool."""
DRY_RUN_BUDGET_S = 90.0
DRY_RUN_MIN_START_S = 5.0
FACTS_TIMEOUT_S = 120.0
SNAPSHOT_MAX_BYTES = 32 << 20
"""A memory snapshot larger than this is not kept (it comes back with the JSON)."""

PACKAGES = (
    "torch",
    "transformers",
    "peft",
    "accelerate",
    "huggingface_hub",
    "tokenizers",
    "safetensors",
    "numpy",
    "msgspec",
    "nvidia-ml-py",
)
ENV_KEYS = (
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "CUDA_MODULE_LOADING",
    "CUDA_VISIBLE_DEVICES",
    "CUBLAS_WORKSPACE_CONFIG",
    "NVIDIA_TF32_OVERRIDE",
    "OMP_NUM_THREADS",
    PROFILES_ENV,
)

# ----------------------------------------------------------------------------- the matrix --

Code = Literal["framework", "builtin"]

_QWEN: dict[str, Any] = {"source": "preset", "id": "qwen2.5-0.5b"}
_TINY_DIMS = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_window_layers": 2,
}
_FUSED = {"name": "adamw", "implementation": "fused"}
_ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True, slots=True)
class Case:
    """One workload of the matrix: the probe request's fields and what the run shows."""

    name: str
    code: Code
    workload: dict[str, Any]
    why: str
    iterations: int = 2
    warmup: int = 1
    concurrency: int = 1
    time_limit_s: float = 120.0
    extra: dict[str, Any] = field(default_factory=dict)
    """More of the probe request (a quality check, a memory snapshot, an engine load)."""
    engines: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """The engine launchers an engine probe runs with (the agent's VRAMBUDGET_AGENT_ENGINES)."""
    skip: str | None = None
    """Why this machine cannot run the case (it is recorded as skipped, with the reason)."""

    def request(self, time_limit_s: float) -> ProbeRequest:
        body: dict[str, Any] = {
            "workload": self.workload,
            "time_limit_s": max(1.0, time_limit_s),
            **self.extra,
        }
        if self.workload["kind"] != "llm_serving":
            body |= {
                "code": self.code,
                "iterations": self.iterations,
                "warmup_iterations": self.warmup,
                "concurrency": self.concurrency,
            }
        return msgspec.convert(body, ProbeRequest)


def _tiny_qwen() -> dict[str, Any]:
    """A two-layer Qwen2 (the 0.5B preset's config.json with small dimensions)."""
    config = dict(preset("qwen2.5-0.5b").config or {})
    config.update(_TINY_DIMS)
    return {"source": "hf_config", "name": "qwen2-tiny", "config": config}


def matrix(dry_run: bool = False) -> list[Case]:
    """The workloads, most valuable first. The GPU sizes fit an 80 GB H100 with room to spare;
    ``dry_run`` keeps every field but cuts the model to two tiny layers and the tokens by 32."""
    model = _tiny_qwen() if dry_run else _QWEN

    def tok(n: int) -> int:
        return max(8, n // 32) if dry_run else n

    def gen(n: int) -> int:
        return min(n, 4) if dry_run else n

    def infer(batch: int, prompt: int, generated: int, **kw: Any) -> dict[str, Any]:
        return {
            "kind": "inference",
            "model": model,
            "batch_size": batch,
            "prompt_tokens": tok(prompt),
            "generated_tokens": gen(generated),
            **kw,
        }

    def train(micro_batch: int, seq: int, **kw: Any) -> dict[str, Any]:
        # sdpa: the framework's flash_attention_2 needs the flash_attn package, absent there
        kw.setdefault("attention", "sdpa")
        return {
            "kind": "training",
            "model": model,
            "micro_batch_size": micro_batch,
            "sequence_length": tok(seq),
            **kw,
        }

    lora = {"kind": "lora"}
    limit = 60.0 if dry_run else 120.0
    cases = [
        Case(
            "framework-generate",
            "framework",
            infer(8, 1024, 128),
            "transformers generate (DynamicCache grown per step), the trace tier's default code",
        ),
        Case(
            "framework-lora",
            "framework",
            train(4, 1024, method=lora),
            "a Trainer step with PEFT LoRA (fp32 adapters on q/k/v/o), the most common fine-tune",
        ),
        Case(
            "framework-full",
            "framework",
            train(2, 1024),
            "a Trainer step of a full fine-tune: bf16 weights, fp32 masters, AdamW (foreach)",
        ),
        Case(
            "builtin-generate",
            "builtin",
            infer(8, 1024, 128),
            "the built-in builders' inference (preallocated KV cache) of the same workload",
        ),
        Case("builtin-lora", "builtin", train(4, 1024, method=lora), "built-in LoRA step"),
        Case("builtin-full", "builtin", train(2, 1024), "built-in full fine-tune step"),
        Case(
            "framework-full-checkpointing",
            "framework",
            train(2, 2048, checkpointing="full", optimizer=_FUSED),
            "full activation checkpointing (transformers' own), fused AdamW, longer sequences",
        ),
        Case(
            "framework-generate-long-prompt",
            "framework",
            infer(1, 8192, 32),
            "one long prompt: the prefill's activations and the cache dominate",
        ),
        Case(
            "framework-generate-eager",
            "framework",
            infer(4, 2048, 16, attention="eager"),
            "eager attention: the s x s scores are materialized",
        ),
        Case(
            "framework-lora-all-linear-r64",
            "framework",
            train(4, 1024, method={"kind": "lora", "rank": 64, "target_modules": _ALL_LINEAR}),
            "LoRA rank 64 on every linear layer",
        ),
        Case(
            "framework-generate-16-streams",
            "framework",
            infer(1, 512, 32),
            "16 concurrent generate streams (estimated as 16 concurrent requests)",
            concurrency=4 if dry_run else 16,
        ),
        Case(
            "builtin-full-checkpointing",
            "builtin",
            train(2, 2048, checkpointing="full", optimizer=_FUSED),
            "built-in full checkpointing",
        ),
        Case(
            "builtin-selective-eager",
            "builtin",
            train(2, 1024, checkpointing="selective", attention="eager"),
            "selective recomputation (built-in only: no transformers option) with eager attention",
        ),
        Case(
            "framework-full-checkpointing-1.5b",
            "framework",
            {
                **train(4, 2048, checkpointing="full"),
                **({} if dry_run else {"model": {"source": "preset", "id": "qwen2.5-1.5b"}}),
            },
            "the fragmentation grid's most fragmented step (research/fragmentation_grids.py: "
            "the replay reserves 0.76 of the transient bytes beyond allocated, the analytic "
            "fraction is 0.26)",
        ),
        # The A/B no run of this project has measured: the same two steps with
        # expandable_segments:True (axolotl's default), whose fractions rest on the replay
        # and published runs of other workloads (vrambudget/core/formulas/allocator_overhead.py).
        Case(
            "framework-lora-expandable",
            "framework",
            train(4, 1024, method=lora),
            "framework-lora with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            extra={"expandable_segments": True},
        ),
        Case(
            "framework-full-checkpointing-1.5b-expandable",
            "framework",
            {
                **train(4, 2048, checkpointing="full"),
                **({} if dry_run else {"model": {"source": "preset", "id": "qwen2.5-1.5b"}}),
            },
            "framework-full-checkpointing-1.5b with PYTORCH_CUDA_ALLOC_CONF="
            "expandable_segments:True",
            extra={"expandable_segments": True},
        ),
    ]
    cases[3:3] = _agent_cases(model, infer, dry_run)
    return [dataclasses.replace(c, time_limit_s=limit) for c in cases]


def _agent_cases(
    model: dict[str, Any], infer: Callable[..., dict[str, Any]], dry_run: bool
) -> list[Case]:
    """What the agent's acceptance test adds to a framework probe: an output-quality check, a
    private memory snapshot, and an engine probe where an engine is installed (the dry run uses
    the project's fake engine, tests/support/fake_engine.py)."""
    reference = {"weights": "fp32" if dry_run else "bf16", "compute": "fp32" if dry_run else "bf16"}
    candidates = [
        {
            "label": "bf16" if dry_run else "fp8",
            "precision": {"weights": "bf16" if dry_run else "fp8"},
        },
        {
            "label": "nf4",
            "precision": {
                "weights": reference["weights"],
                "compute": reference["compute"],
                "quantization": {"scheme": "bnb_4bit"},
            },
        },
    ]
    quality = {
        "reference": reference,
        "candidates": candidates,
        "max_sequences": 4 if dry_run else 16,
        "sequence_tokens": 32 if dry_run else 256,
        # synthetic weights unless the checkpoint is cached: a loose bar, the numbers are the point
        "max_mean_kl": 10.0,
        "min_token_agreement": 0.0,
    }
    cases = [
        Case(
            "agent-quality",
            "framework",
            infer(1, 512, 8),
            "the output-quality check: fp8 and nf4 (emulated) against bf16 on the shipped passages",
            extra={"quality": quality},
        ),
        Case(
            "agent-snapshot",
            "framework",
            infer(2, 512, 8),
            "a private memory snapshot (torch.cuda.memory._snapshot) around the measured phase",
            extra={"memory_snapshot": True},
        ),
    ]
    fake = ROOT / "tests" / "support" / "fake_engine.py"
    if dry_run:
        engines: dict[str, tuple[str, ...]] = {"vllm": (sys.executable, str(fake))}
        skip = None
    else:
        engines, skip = _installed_vllm()
    serve: dict[str, Any] = {
        "kind": "llm_serving",
        "engine": "vllm",
        "model": _QWEN,
        "max_model_len": 2048,
    }
    load = {"concurrency": 8, "requests": 32, "warmup_requests": 2, "output_tokens": 32}
    cases.append(
        Case(
            "agent-engine-vllm",
            "framework",
            serve,
            "an engine probe: vLLM started from the recipe, 8 concurrent streamed requests",
            extra={"engine": load, **({"recipe_gpu": "l4-24gb"} if dry_run else {})},
            engines=engines,
            skip=skip,
        )
    )
    return cases


def _installed_vllm() -> tuple[dict[str, tuple[str, ...]], str | None]:
    """vLLM's launcher on this machine and the preset's checkpoint in its cache, or why not."""
    import shutil

    from vrambudget.trace.checkpoints import Found, find_checkpoint

    exe = shutil.which("vllm")
    if exe is None:
        return {}, "skipped: no vLLM installed on this machine (no `vllm` on PATH)"
    found = find_checkpoint(msgspec.convert(_QWEN, type=PresetModel), ())
    if not isinstance(found, Found):
        return {}, f"skipped: {found.reason} (no network here to fetch it)"
    return {"vllm": (exe,)}, None


# ------------------------------------------------------------------- the device's facts --


def _facts_child(conn: Connection) -> None:
    """A fresh process: the versions, the GPU, and the bare CUDA context -- NVML's device used
    before CUDA, after ``torch.cuda.init()`` (no tensor), after a first tensor (the allocator's
    first 2 MiB segment) and after a first bf16 GEMM (cuBLAS handle, workspace, kernels)."""
    facts: dict[str, Any] = {}
    try:
        import torch

        facts["torch_version"] = str(torch.__version__)
        facts["cuda_version"] = torch.version.cuda
        facts["cudnn_version"] = torch.backends.cudnn.version()  # type: ignore[no-untyped-call]
        handle = None
        inv = nvml.inventory()
        if inv.available and inv.gpus:
            handle, _ = nvml.resolve_device(0)
        used: dict[str, int | None] = {"before_cuda": None}
        if handle is not None:
            used["before_cuda"] = nvml.device_used_bytes(handle)
        if torch.cuda.is_available():
            torch.cuda.init()
            torch.cuda.synchronize()
            used["after_init"] = nvml.device_used_bytes(handle) if handle is not None else None
            free, total = torch.cuda.mem_get_info()
            x = torch.empty(1, device="cuda")
            torch.cuda.synchronize()
            used["after_first_tensor"] = (
                nvml.device_used_bytes(handle) if handle is not None else None
            )
            a = torch.ones(256, 256, device="cuda", dtype=torch.bfloat16)
            b = a @ a
            torch.cuda.synchronize()
            used["after_first_gemm"] = (
                nvml.device_used_bytes(handle) if handle is not None else None
            )
            del x, a, b
            props = torch.cuda.get_device_properties(0)
            base = used["before_cuda"]

            def above(key: str) -> int | None:
                v = used.get(key)
                return None if v is None or base is None else v - base

            facts.update(
                device="cuda",
                gpu_name=torch.cuda.get_device_name(0),
                compute_capability=f"{props.major}.{props.minor}",
                memory_total_bytes=props.total_memory,
                multi_processor_count=props.multi_processor_count,
                mem_get_info_after_init={"free": free, "total": total},
                nvml_used_bytes=used,
                cuda_context_bytes=above("after_init"),
                first_tensor_bytes=above("after_first_tensor"),
                first_gemm_bytes=above("after_first_gemm"),
                allocator_backend=torch.cuda.get_allocator_backend(),
            )
        else:
            facts.update(device="cpu", gpu_name="cpu", nvml_used_bytes=used)
    except BaseException as exc:  # noqa: BLE001 -- reported in the file, never lost
        facts["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    conn.send(facts)
    conn.close()


def _device_facts(ctx: BaseContext, timeout_s: float) -> dict[str, Any]:
    recv, send = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_facts_child, args=(send,), daemon=True)  # type: ignore[attr-defined]
    p.start()
    send.close()
    facts: dict[str, Any]
    if recv.poll(timeout_s):
        try:
            facts = recv.recv()
        except EOFError:
            facts = {"error": f"the facts process exited with code {p.exitcode}"}
    else:
        facts = {"error": f"the facts process did not answer within {timeout_s:g} s"}
    p.join(5)
    if p.is_alive():
        p.kill()
        p.join()
    return facts


def _host() -> dict[str, Any]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "python": platform.python_version(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "packages": versions,
        "env": {k: os.environ[k] for k in ENV_KEYS if k in os.environ},
        "vrambudget_commit": _commit(),
    }


def _commit() -> str | None:
    if os.environ.get("VRAMBUDGET_COMMIT"):
        return os.environ["VRAMBUDGET_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


# --------------------------------------------------------------------------- the probes --


class _Probe(ProbeProcess):
    """The agent's probe process -- its child (``child_main``), time limit and NVML merge --
    started from ``ctx`` when one is given: the dry run's fork server, which has torch and
    transformers imported already. (ProbeProcess always spawns a fresh interpreter, the right
    thing for a GPU measurement; on a CPU dry run the imports would cost most of its minute.)"""

    def __init__(
        self,
        request_json: bytes,
        time_limit_s: float,
        sampler_factory: Callable[[frozenset[int], tuple[int, ...]], Any] | None,
        ctx: BaseContext | None,
        child: ChildSettings | None = None,
    ) -> None:
        child = child or ChildSettings()
        super().__init__(request_json, child, time_limit_s, sampler_factory)
        if ctx is not None:
            self._recv.close()
            self._send.close()
            self._recv, self._send = ctx.Pipe(duplex=False)
            self._process = ctx.Process(  # type: ignore[attr-defined]
                target=child_main,
                args=(request_json, child, self._send, None),
                daemon=True,
                name="vrambudget-probe",
            )


@dataclass
class _Nvml:
    """NVML in this process (never a CUDA context here): the device's used memory before each
    child, and a sampler per child's measured iterations."""

    handle: Any
    inventory: dict[str, Any]
    host: dict[str, Any]

    @classmethod
    def open(cls) -> _Nvml | None:
        """GPU 0 through NVML; None where NVML cannot read it (the torch numbers still come)."""
        try:
            inv = nvml.inventory()
            if not inv.available or not inv.gpus:
                return None
            handle, _ = nvml.resolve_device(0)
            host = msgspec.to_builtins(nvml.host_info())
        except Exception as exc:  # noqa: BLE001 -- no NVML is an answer, not a crash
            _say(f"NVML: {type(exc).__name__}: {exc}")
            return None
        return cls(handle, msgspec.to_builtins(inv), host)

    def idle(self, settle_s: float = 3.0) -> int:
        """The device's used memory before a child starts, once the last child's memory is
        back: read every 0.1 s until two readings agree (at most ``settle_s``)."""
        last = nvml.device_used_bytes(self.handle)
        end = time.monotonic() + settle_s
        while time.monotonic() < end:
            time.sleep(0.1)
            now = nvml.device_used_bytes(self.handle)
            if now == last:
                break
            last = now
        return last


@dataclass
class _Entry:
    """One workload's record as it fills in: the result line and the full report."""

    case: Case
    result: dict[str, Any]
    report: ProbeResource | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _agent(res: ProbeResult) -> dict[str, Any]:
    """What the acceptance test adds: the weights that ran, the quality check, the snapshot,
    the engine's report and the observed headroom (each null where the probe had none)."""
    out = {
        key: msgspec.to_builtins(getattr(res, key))
        for key in ("weights", "quality", "snapshot", "snapshot_error", "engine")
    }
    # The agent's worker adds it to a finished probe; here, from this run alone.
    out["headroom"] = msgspec.to_builtins(res.headroom or observed_headroom(res, []))
    return out


def _measured(
    res: ProbeResult, idle: int | None, samples: SamplerResult | None
) -> dict[str, Any] | None:
    t, nv = res.torch, res.nvml
    if t is None:  # an engine probe: its numbers are in "agent"
        return None
    peak = samples.peak_used_bytes if samples is not None else None
    return {
        "device": res.device,
        "torch_max_memory_allocated": t.allocated_peak_bytes,
        "torch_max_memory_reserved": t.reserved_peak_bytes,
        "torch_weights": t.weights_bytes,
        "torch_kv_cache": t.kv_cache_bytes,
        "torch_cublas_workspace": t.workspace_bytes,
        "torch_inactive_split_peak": t.inactive_split_peak_bytes,
        "torch_alloc_retries": t.num_alloc_retries,
        "torch_iteration_peaks": list(t.iteration_peak_bytes),
        "nvml_idle_used": idle,
        "nvml_peak_used": peak,
        "nvml_device_peak": None if peak is None or idle is None else peak - idle,
        "nvml_process_peak": samples.process_peak_bytes if samples is not None else None,
        "nvml_cuda_context": nv.cuda_context_bytes if nv is not None else None,
        "nvml_samples": samples.samples if samples is not None else None,
        "nvml_interval_mean_s": round(samples.mean_interval_s, 6) if samples else None,
        "nvml_interval_max_s": round(samples.max_interval_s, 6) if samples else None,
        "nvml_others_visible": samples.others_visible if samples is not None else None,
        "nvml_others_changed": samples.others_changed_bytes if samples is not None else None,
        "host_peak_rss": res.host_peak_rss_bytes,
        "iteration_p50_s": round(res.iterations.p50_s, 6),
        "iterations": res.iterations.count,
        "outputs_finite": res.outputs_finite,
    }


def _probe(
    case: Case,
    limit_s: float,
    meter: _Nvml | None,
    ctx: BaseContext | None,
    snapshot_dir: Path = Path("."),
) -> tuple[_Entry, ProbeResource | None]:
    req = case.request(limit_s)
    samplers: list[NVMLSampler] = []

    def sampler(pids: frozenset[int], devices: tuple[int, ...]) -> NVMLSampler:
        """The agent's factory signature: the workload's pids on GPU 0 (the campaign runs no
        multi-GPU engine, so ``devices`` is empty or GPU 0)."""
        assert meter is not None
        s = NVMLSampler(meter.handle, pids=pids)
        samplers.append(s)
        return s

    idle = meter.idle() if meter is not None else None
    started = time.monotonic()
    child = ChildSettings(
        engines=dict(case.engines),
        snapshot_path=str(snapshot_dir / f"{case.name}.pickle") if req.memory_snapshot else None,
        snapshot_max_bytes=SNAPSHOT_MAX_BYTES,
    )
    probe = _Probe(
        msgspec.json.encode(req), limit_s, sampler if meter is not None else None, ctx, child
    )
    probe.start()
    done = probe.wait()
    seconds = time.monotonic() - started
    samples = samplers[0].result if samplers else None
    result: ProbeResult | None = (
        msgspec.json.decode(done.result_json, type=ProbeResult) if done.result_json else None
    )
    entry = _Entry(
        case,
        {
            "name": case.name,
            "code": case.code,
            "status": done.status,
            "error": done.error,
            "workload": case.workload,
            "iterations": case.iterations,
            "warmup_iterations": case.warmup,
            "concurrency": case.concurrency,
            "measured": _measured(result, idle, samples) if result is not None else None,
            "agent": _agent(result) if result is not None else None,
            "analytic": None,
            "trace": None,
            "seconds": {"probe": round(seconds, 2)},
        },
    )
    if samples is not None:
        entry.extra["nvml_sampler"] = msgspec.to_builtins(samples)
    if result is None:
        return entry, None
    now = time.time()
    report = ProbeResource(
        id=case.name,
        status=done.status,  # type: ignore[arg-type]
        created_at=now - seconds,
        updated_at=now,
        request=req,
        result=result,
        error=done.error,
    )
    entry.report = report
    return entry, report


# ------------------------------------------------------------------------ the estimates --


def _builtin_rms_norm() -> str:
    from vrambudget.core.stack import resolve_stack

    return resolve_stack(None).rms_norm


def _estimate_init() -> None:
    """Estimate workers never touch the GPU (the trace tier runs on fake CPU tensors): CUDA is
    hidden before torch is imported, so no context can disturb the device's numbers."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    if not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(min(4, os.cpu_count() or 1))


def _estimate(
    workload_json: bytes, device_json: bytes, code: str, expandable: bool = False
) -> dict[str, Any]:
    """Both tiers for one workload (run in a pool worker): each Budget as JSON, or its error;
    ``expandable``: the probe's allocator ran with expandable segments."""
    from vrambudget.core.estimate import estimate
    from vrambudget.core.spec import BudgetRequest, Headroom, Software, TraceOptions
    from vrambudget.trace.engine import trace_budget

    w = msgspec.json.decode(workload_json, type=Workload)
    device = msgspec.json.decode(device_json, type=DeviceRef | None)
    software = Software(expandable_segments=True) if expandable else None
    out: dict[str, Any] = {}
    t = time.monotonic()
    try:
        out["analytic"] = msgspec.json.encode(
            estimate((w,), device, Headroom(fraction=0.0), software=software)
        )
    except Exception as exc:  # noqa: BLE001 -- an estimate's failure is a result
        out["analytic_error"] = f"{type(exc).__name__}: {exc}"[:2000]
    out["analytic_s"] = round(time.monotonic() - t, 3)
    t = time.monotonic()
    try:
        request = BudgetRequest(
            method="trace",
            workloads=(w,),
            device=device,
            headroom=Headroom(fraction=0.0),
            trace=TraceOptions(code=code),  # type: ignore[arg-type]
            software=software,
        )
        out["trace"] = msgspec.json.encode(trace_budget(request))
    except Exception as exc:  # noqa: BLE001 -- an estimate's failure is a result
        out["trace_error"] = f"{type(exc).__name__}: {exc}"[:2000]
    out["trace_s"] = round(time.monotonic() - t, 3)
    return out


def _summary(b: Budget) -> dict[str, Any]:
    d = b.devices[b.most_loaded]
    s: dict[str, Any] = {
        "total": d.total_bytes,
        "components": {str(line.component): line.bytes for line in d.lines if line.bytes},
    }
    if b.trace is not None:
        s["peak_allocated"] = b.trace.peak_allocated_bytes
        s["peak_reserved"] = b.trace.peak_reserved_bytes
        s["code"] = b.trace.code
    if b.warnings:
        s["warnings"] = list(b.warnings)
    return s


def _settle(entry: _Entry, inp: Any, out: dict[str, Any]) -> None:
    """Put one workload's estimates into its line, and the comparison into its report."""
    budgets: dict[str, Budget] = {}
    r = entry.result
    r["seconds"].update(analytic=out.get("analytic_s"), trace=out.get("trace_s"))
    for tier in ("analytic", "trace"):
        if tier in out:
            budgets[tier] = msgspec.json.decode(out[tier], type=Budget)
            r[tier] = _summary(budgets[tier])
        else:
            r[tier] = {"error": out.get(f"{tier}_error")}
    if entry.report is not None and "analytic" in budgets:
        c = compare(entry.report, budgets, inp)
        entry.report = msgspec.structs.replace(entry.report, comparison=c)


# ----------------------------------------------------------------------------- the file --


def _line(value: Any) -> str:
    return json.dumps(value)  # ASCII: no character of a value can break its line


def dumps(doc: dict[str, Any]) -> str:
    """JSON with one top-level key per line and one item per line in ``results`` and
    ``reports`` (a record quotes its result's line)."""
    keys = list(doc)
    lines = ["{"]
    for i, key in enumerate(keys):
        comma = "," if i < len(keys) - 1 else ""
        value = doc[key]
        if key in ("results", "reports") and value:
            lines.append(f"{_line(key)}: [")
            lines += [_line(v) + ("," if j < len(value) - 1 else "") for j, v in enumerate(value)]
            lines.append("]" + comma)
        else:
            lines.append(f"{_line(key)}: {_line(value)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _write(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(dumps(doc), encoding="utf-8")
    os.replace(tmp, path)


# ------------------------------------------------------------------------------ the run --


def _context(dry_run: bool) -> BaseContext:
    if not dry_run:
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(
        [
            "torch",
            "transformers",
            "peft",
            "transformers.models.qwen2.modeling_qwen2",
            "vrambudget.workloads.hf.program",
            "vrambudget.workloads.run",
            "vrambudget.trace.engine",
            "vrambudget.trace.models",
            "vrambudget.agent.probe",
            "peft.tuners.lora",
            "transformers.generation.utils",
            "transformers.integrations.sdpa_attention",
        ]
    )
    return ctx


def _say(message: str) -> None:
    print(message, flush=True)


def run(
    out: Path,
    *,
    dry_run: bool = False,
    budget_s: float = DEFAULT_BUDGET_S,
    only: list[str] | None = None,
    estimate_workers: int | None = None,
) -> dict[str, Any]:
    """Run the matrix (or the cases named in ``only``), writing ``out`` after every step;
    returns the final document."""
    t0 = time.monotonic()
    deadline = t0 + budget_s
    if dry_run:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # every child (and the fork server) sees none
        # tiny tensors: one intra-op thread per process (the probe and the estimates overlap)
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    min_start = DRY_RUN_MIN_START_S if dry_run else MIN_START_S
    reserve = DRY_RUN_MIN_START_S if dry_run else ESTIMATE_RESERVE_S
    ctx = _context(dry_run)
    cases = [c for c in matrix(dry_run) if only is None or c.name in only]
    meter = None if dry_run else _Nvml.open()
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "dry_run": dry_run,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "finished_at": None,
        "complete": False,
        "budget_s": budget_s,
        "elapsed_s": 0.0,
        # What the training programs keep across the probe's run(1) calls (research/
        # gpu_campaign.py excludes training peaks of campaigns without this field).
        "training_loop": TRAINING_LOOP,
        # The framework RMSNorm the built-in builders imitate (the probe's default stack;
        # research/gpu_campaign.py reads campaigns without this field as the fused norm).
        "builtin_rms_norm": _builtin_rms_norm(),
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
        "host": _host(),
        "nvml": meter.inventory if meter is not None else None,
        "nvml_host": meter.host if meter is not None else None,
        "device": None,
        "matrix": [{"name": c.name, "code": c.code, "why": c.why} for c in cases],
        "results": [],
        "reports": [],
    }
    entries: list[_Entry] = []

    def save() -> None:
        doc["elapsed_s"] = round(time.monotonic() - t0, 1)
        doc["results"] = [e.result for e in entries]
        doc["reports"] = [
            {"name": e.case.name, **e.extra, "report": msgspec.to_builtins(e.report)}
            for e in entries
            if e.report is not None or e.extra
        ]
        _write(out, doc)

    out.parent.mkdir(parents=True, exist_ok=True)
    save()
    if estimate_workers is None:  # a 2-core host runs the probe and one estimate at a time
        estimate_workers = 2 if not dry_run else max(1, min(2, (os.cpu_count() or 2) - 1))
    # started first: its workers import the trace tier while the facts child measures
    pool = ctx.Pool(estimate_workers, initializer=_estimate_init)
    pending: list[tuple[_Entry, Any, Any]] = []

    def collect(block_until: float | None) -> None:
        for item in list(pending):
            entry, inp, async_result = item
            wait = 0.0 if block_until is None else max(0.0, block_until - time.monotonic())
            try:
                result = async_result.get(wait)
            except mp.TimeoutError:
                continue
            except Exception as exc:  # noqa: BLE001 -- a broken worker is a result
                result = {"analytic_error": repr(exc), "trace_error": repr(exc)}
            pending.remove(item)
            try:
                _settle(entry, inp, result)
            except Exception as exc:  # noqa: BLE001 -- one bad estimate must not end the run
                entry.result["estimate_error"] = f"{type(exc).__name__}: {exc}"[:2000]
            _say(f"  estimates of {entry.case.name}: {_brief_estimates(entry.result)}")
            save()

    try:
        facts = _device_facts(ctx, min(FACTS_TIMEOUT_S, budget_s / 4))
        if facts.get("device") == "cuda":
            g = match_gpu(
                facts["gpu_name"], facts.get("memory_total_bytes"), facts.get("compute_capability")
            )
            facts["gpu_id"] = g.id if g is not None else None
        doc["device"] = facts
        _say(f"device: {json.dumps(facts)}")
        save()
        if not dry_run and facts.get("device") != "cuda":
            raise SystemExit(
                f"no CUDA device here ({facts.get('error') or facts.get('device')}): "
                "run with --dry-run for the CPU path"
            )
        if not dry_run and meter is None:
            _say("NVML is not available: the NVML numbers stay null")
        for case in cases:
            left = deadline - time.monotonic()
            if left < min_start:
                entries.append(_skipped(case, f"skipped: {left:.0f} s left of the budget"))
                save()
                continue
            if case.skip is not None:
                entries.append(_skipped(case, case.skip))
                _say(f"{case.name}: {case.skip}")
                save()
                continue
            limit = min(case.time_limit_s, left - reserve)
            _say(f"{case.name} ({case.code}): {case.why}")
            entry, report = _probe(case, limit, meter, ctx if dry_run else None, out.parent)
            entries.append(entry)
            _say(f"  {entry.result['status']}: {_brief(entry.result)}")
            if (
                report is not None
                and report.status in COMPARABLE_STATUSES
                and report.result is not None
                and report.result.torch is not None  # an engine probe carries its own figures
            ):
                try:
                    inp = estimate_input(report)
                except InvalidWorkload as exc:
                    entry.result["analytic"] = entry.result["trace"] = {"error": exc.message}
                else:
                    if inp.workload != report.request.workload:
                        entry.result["estimated_workload"] = msgspec.to_builtins(inp.workload)
                    if inp.notes:
                        entry.result["estimate_notes"] = list(inp.notes)
                    expandable = bool(report.result.expandable_segments)
                    entry.result["expandable_segments"] = report.result.expandable_segments
                    args = (
                        msgspec.json.encode(inp.workload),
                        msgspec.json.encode(inp.device),
                        case.code,
                        expandable,
                    )
                    pending.append((entry, inp, pool.apply_async(_estimate, args)))
            save()
            collect(None)
        collect(deadline)
        for entry, _, _ in pending:
            entry.result["analytic"] = entry.result["trace"] = {
                "error": "not finished within the budget"
            }
    finally:
        pool.terminate()
        pool.join()
        doc["complete"] = (
            len(entries) == len(cases)
            and all(e.result["status"] == "succeeded" or e.case.skip for e in entries)
            and not pending
        )
        doc["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        save()
    return doc


def _skipped(case: Case, why: str) -> _Entry:
    return _Entry(
        case,
        {
            "name": case.name,
            "code": case.code,
            "status": "skipped",
            "error": why,
            "workload": case.workload,
            "iterations": case.iterations,
            "warmup_iterations": case.warmup,
            "concurrency": case.concurrency,
            "measured": None,
            "analytic": None,
            "trace": None,
            "seconds": {},
        },
    )


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.1f} MiB"


def _brief(r: dict[str, Any]) -> str:
    m = r["measured"]
    engine = (r.get("agent") or {}).get("engine")
    if engine is not None:
        s = engine["startup"]
        return (
            f"engine started: {engine['started']}, KV tokens {s['kv_cache_tokens']} (estimated "
            f"{(engine['expected'] or {}).get('kv_cache_tokens')}), TTFT p50 "
            f"{engine['ttft']['p50_s']} s, {engine['errors']} errors"
        )
    if m is None:
        return str(r["error"])
    return (
        f"allocated {_mib(m['torch_max_memory_allocated'])}, reserved "
        f"{_mib(m['torch_max_memory_reserved'])}, NVML peak - idle {_mib(m['nvml_device_peak'])}"
        f", context {_mib(m['nvml_cuda_context'])} ({r['seconds']['probe']} s)"
    )


def _brief_estimates(r: dict[str, Any]) -> str:
    parts = []
    for tier in ("analytic", "trace"):
        s = r.get(tier) or {}
        if "total" in s:
            parts.append(f"{tier} {_mib(s['total'])} ({r['seconds'].get(tier)} s)")
        else:
            parts.append(f"{tier} failed: {s.get('error')}")
    return "; ".join(parts)


def _default_out() -> Path:
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"]) / "gpu_campaign.json"
    return ROOT / "bench" / "results" / "gpu_campaign.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("out", nargs="?", type=Path, help="the JSON file to write")
    ap.add_argument("--out", dest="out_opt", type=Path, help="the JSON file (same as OUT)")
    ap.add_argument("--dry-run", action="store_true", help="the CPU path, tiny sizes")
    ap.add_argument("--budget-s", type=float, default=None, help="the time budget (380 s)")
    ap.add_argument("--only", action="append", help="run only this case (repeatable)")
    ap.add_argument("--estimate-workers", type=int, help="estimate processes (2)")
    ap.add_argument("--list", action="store_true", help="print the matrix and exit")
    a = ap.parse_args(argv)
    if a.list:
        for c in matrix(a.dry_run):
            print(f"{c.name:32} {c.code:9} {json.dumps(c.workload)[:160]}")
        return 0
    out: Path = a.out_opt or a.out or _default_out()
    budget = (
        a.budget_s
        if a.budget_s is not None
        else (DRY_RUN_BUDGET_S if a.dry_run else DEFAULT_BUDGET_S)
    )
    unknown = set(a.only or ()) - {c.name for c in matrix(a.dry_run)}
    if unknown:
        ap.error(f"unknown case(s): {', '.join(sorted(unknown))}")
    t = time.monotonic()
    doc = run(
        out, dry_run=a.dry_run, budget_s=budget, only=a.only, estimate_workers=a.estimate_workers
    )
    statuses = [r["status"] for r in doc["results"]]
    _say(
        f"wrote {out}: {len(statuses)} results "
        f"({', '.join(f'{s} {statuses.count(s)}' for s in sorted(set(statuses)))}) "
        f"in {time.monotonic() - t:.1f} s"
    )
    return 0 if doc["complete"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
