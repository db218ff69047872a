"""The trace tier: run each workload's PyTorch program on fake tensors, record every allocation,
replay the stream through the caching-allocator model, and answer with the same components as
the analytic tier plus the allocator's peaks and a timeline.

What a CPU trace cannot see is added explicitly and listed in ``MODELLED``; what only real
hardware fixes (CUDA context, NCCL buffers) keeps the analytic tier's cited defaults.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec
import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)

from vrambudget.core.bands import band_of, band_rule, resolve_headroom, workload_class
from vrambudget.core.budget.encoders import proxy
from vrambudget.core.budget.stage import counted_bytes
from vrambudget.core.calibration import PROFILES_ENV, ProfileSet, profiles_from
from vrambudget.core.components import Component
from vrambudget.core.deployed import deploy, with_adapters
from vrambudget.core.device import resolve_device
from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.estimate import estimate
from vrambudget.core.formulas.gemm_workspaces import gemm_workspaces
from vrambudget.core.formulas.headroom import headroom_bytes
from vrambudget.core.formulas.runtime_workspace import separate_cublaslt
from vrambudget.core.formulas.sdpa import mem_efficient_gqa as gqa_kernel
from vrambudget.core.hf_config import CLOSED_FORM_FAMILIES
from vrambudget.core.overheads import DEFAULT_OVERHEADS, Overheads, with_software
from vrambudget.core.resolve import resolve_model
from vrambudget.core.resolved import ResolvedModel
from vrambudget.core.result import (
    Budget,
    CalibrationUse,
    DeviceBudget,
    Line,
    OverheadOrigin,
    Part,
    Phase,
    TracePoint,
    TraceSummary,
)
from vrambudget.core.spec import (
    BudgetRequest,
    EncoderWorkload,
    GenericWorkload,
    Headroom,
    InferenceWorkload,
    LLMServingWorkload,
    ModelWorkload,
    Seq2SeqWorkload,
    SpeechToTextWorkload,
    TrainingWorkload,
    VisionWorkload,
)
from vrambudget.core.spec.diffusion import ImageGenerationWorkload
from vrambudget.core.stack import Stack, resolve_stack, version_tuple
from vrambudget.core.statics import statics_for
from vrambudget.core.verdict import with_fit
from vrambudget.workloads import kernels
from vrambudget.workloads.hf.config import LIBRARY
from vrambudget.workloads.hf.program import framework_unsupported, prepare_framework
from vrambudget.workloads.run import check_traceable, prepare

from .diffusion import trace_image_generation_code
from .events import Trace
from .recorder import Recorder
from .replay import Replay, replay

__all__ = [
    "MODELLED",
    "MODELLED_FRAMEWORK",
    "record_workload_code",
    "request_workspaces",
    "trace_budget",
    "trace_budget_with_replays",
    "trace_workload",
    "trace_workload_code",
    "traced_code",
]

C = Component

MODELLED = (
    "FlashAttention-2 (SDPA flash backend): output + fp32 log-sum-exp saved; backward "
    "dq_accum fp32 (s rounded to 128, head dim to 32/64), softmax_d, GQA-expanded dk/dv "
    "(flash_api.cpp mha_bwd); fp32 inputs: the SDPA backend sdp_utils.cpp selects "
    "(memory-efficient, or math with GQA)",
    "LayerNorm, and RMSNorm in inference: fused kernels (input and fp32 rstd, and mean, "
    "saved); RMSNorm in training as the stack's framework writes it (an fp32 copy of the "
    "input saved) or fused (Liger, Unsloth, software.norm)",
    "cuBLAS + cuBLASLt workspaces allocated through the caching allocator at the first GEMM",
    "bitsandbytes 4-bit: dequantized weight scratch per projection in forward and backward",
    "non-fused torch optimizers keep their step counters on the host",
    "MoE routing balanced over experts (fake tensors carry no values)",
    "decode: the first and the last step are traced (steps between differ only in length)",
)
"""What the built-in builders' trace adds to the CPU trace."""

MODELLED_FRAMEWORK = (
    "the model is transformers' own modelling code (norms, rotary, masks, repeat_kv, cache "
    "classes, loss) run on fake tensors; only kernels absent on the CPU are stand-ins:",
    "SDPA: the CUDA backend sdp_utils.cpp selects -- flash (no mask, fp16/bf16, head dim "
    "<= 256): output + fp32 log-sum-exp, backward dq_accum / softmax_d / GQA-expanded dk, dv "
    "(flash_api.cpp); memory-efficient (a mask, or fp32): output + fp32 log-sum-exp padded "
    "to 32 rows, backward an fp32 delta (attention_backward.cu); else the math path as is",
    "flash_attention_2: the same FlashAttention-2 allocations (flash_attn is not installed)",
    "quantized linear layers: the scheme's stored bytes; bitsandbytes 4-bit dequantizes into "
    "a compute-dtype scratch (gemv_4bit for one token), AWQ GEMM from 8 tokens, the other "
    "schemes' fused GEMMs write only the output",
    "cuBLAS + cuBLASLt workspaces allocated through the caching allocator at the first GEMM",
    "non-fused torch optimizers keep their step counters on the host",
    "MoE routing balanced over experts (fake tensors carry no values)",
    "generate: the prefill and the last decode step, the DynamicCache resized to the length "
    "it has then (the steps between differ only in length)",
    "Mamba / linear attention: transformers' reference PyTorch path (as without mamba_ssm "
    "or flash-linear-attention installed)",
)
"""What the framework trace adds to the CPU trace."""

_TRACED = (
    C.WEIGHTS,
    C.QUANTIZATION_METADATA,
    C.ADAPTERS,
    C.KV_CACHE,
    C.ACTIVATIONS,
    C.LOGITS,
    C.GRADIENTS,
    C.OPTIMIZER_STATE,
    C.MASTER_WEIGHTS,
    C.RUNTIME_WORKSPACE,
)
_SOURCE = (
    "trace tier: torch {version} on fake tensors, every storage recorded by a dispatch "
    "mode, replayed through a model of c10/cuda/CUDACachingAllocator.cpp"
)


def _check_matrices(arch: Any, model_field: str) -> None:
    """The traced model stores a ``cols == 1`` tensor as a vector (norms, biases), so a
    projection or table one column wide (``hidden_size`` or ``intermediate_size`` 1) cannot be
    built: refused here, naming the dimension, instead of failing inside torch."""
    from vrambudget.core.arch import Role

    vectors = (Role.NORM, Role.BIAS)
    groups = [g for layer, _ in arch.layer_runs for g in layer.tensors]
    groups += [*arch.embeddings, *arch.head]
    for g in groups:
        if g.cols == 1 and g.role not in vectors:
            dim = "hidden_size" if arch.hidden_size == 1 else "intermediate_size"
            raise InvalidWorkload(
                f"{model_field}.{dim}",
                f"a {g.name} projection one column wide is not traced with method 'trace' "
                f"(use 'analytic', or a dimension of at least 2)",
            )


def trace_workload(
    w: InferenceWorkload | TrainingWorkload,
    *,
    iterations: int = 2,
    expandable_segments: bool = False,
    workspaces: tuple[tuple[str, int], ...] = (),
    field: str = "workloads[0]",
    code: str = "framework",
) -> Replay:
    """Trace one process of ``w`` and replay it (:func:`traced_code` says which code ran)."""
    return trace_workload_code(
        w,
        iterations=iterations,
        expandable_segments=expandable_segments,
        workspaces=workspaces,
        field=field,
        code=code,
    )[0]


def traced_code(w: ModelWorkload | EncoderWorkload, code: str) -> tuple[str, str | None]:
    """(``framework`` | ``builtin``, why the built-in builders run when the framework was
    asked for)."""
    if code != "framework":
        return "builtin", None
    reason = framework_unsupported(deploy(w))
    return ("builtin", reason) if reason else ("framework", None)


def trace_workload_code(
    w: ModelWorkload | EncoderWorkload,
    *,
    iterations: int = 2,
    expandable_segments: bool = False,
    workspaces: tuple[tuple[str, int], ...] = (),
    field: str = "workloads[0]",
    code: str = "framework",
    stack: Stack | None = None,
    flash_hw: bool = True,
    mem_efficient_gqa: bool | None = None,
) -> tuple[Replay, str]:
    """The replay, and the code that ran in words; ``stack``: the request's (None: the default
    stack), for the layout checks and what the built-in builders imitate (its norm, how its
    modelling code builds routed experts; the framework's own code has its own); ``flash_hw``:
    the device runs FlashAttention (:attr:`vrambudget.core.overheads.Overheads.flash_hw`) and
    ``mem_efficient_gqa``: its memory-efficient kernel takes grouped heads
    (:attr:`vrambudget.core.overheads.Overheads.mem_efficient_gqa`; None: the stack's torch
    decides), which decide the backends SDPA's emulation picks."""
    trace, words = record_workload_code(
        w,
        iterations=iterations,
        workspaces=workspaces,
        field=field,
        code=code,
        stack=stack,
        flash_hw=flash_hw,
        mem_efficient_gqa=mem_efficient_gqa,
    )
    return replay(trace, expandable_segments=expandable_segments), words


def record_workload_code(
    w: ModelWorkload | EncoderWorkload,
    *,
    iterations: int = 2,
    workspaces: tuple[tuple[str, int], ...] = (),
    field: str = "workloads[0]",
    code: str = "framework",
    stack: Stack | None = None,
    flash_hw: bool = True,
    mem_efficient_gqa: bool | None = None,
) -> tuple[Trace, str]:
    """The recorded trace of ``w`` (before any replay) and the code that ran in words (the
    arguments are :func:`trace_workload_code`'s)."""
    # the adapters' dtype as the analytic tier resolves it for the same stack
    w = with_adapters(deploy(w), stack or resolve_stack(None))
    if mem_efficient_gqa is None:  # no device given: an NVIDIA GPU on the stack's torch
        torch_version = (stack or resolve_stack(None)).torch_version
        mem_efficient_gqa = gqa_kernel(version_tuple(torch_version), "nvidia")
    which, reason = traced_code(w, code)
    encoder = isinstance(w, VisionWorkload | Seq2SeqWorkload | SpeechToTextWorkload)
    if which == "builtin" and _framework_only(w):
        raise InvalidWorkload(
            f"{field}.model",
            "the built-in builders know the closed-form families only, and the framework "
            f"program cannot run this workload ({reason or 'trace.code builtin'})",
        )
    if which == "builtin":
        if isinstance(w, VisionWorkload | Seq2SeqWorkload | SpeechToTextWorkload):
            raise InvalidWorkload(
                f"{field}.model",
                f"a {w.__struct_config__.tag} workload is traced with the "
                f"framework's code only, which cannot run this: {reason}",
            )
        check_traceable(w, field)
    try:
        arch = resolve_model(w.model)
        # the layout checks of the analytic tier
        statics = statics_for(proxy(w) if encoder else w, arch, stack)  # type: ignore[arg-type]
    except InvalidWorkload as exc:
        raise InvalidWorkload(f"{field}.{exc.field}", exc.message) from None
    if which == "builtin":
        _check_matrices(
            arch, f"{field}.model.config" if hasattr(w.model, "config") else f"{field}.model"
        )
    if isinstance(w, TrainingWorkload) and not any(st.trainable_params for st in statics):
        # The analytic tier budgets it (with a warning); a real step has nothing to optimize.
        raise InvalidWorkload(
            f"{field}.method.target_modules",
            "no LoRA target module matches this model's projections: there "
            "is nothing to train, so there is no training step to trace",
        )
    if not isinstance(w, VisionWorkload | Seq2SeqWorkload | SpeechToTextWorkload):
        _check_positions(w, arch, field)
    recorder = Recorder(gemm_workspaces=workspaces)
    try:
        words = _run(
            w,
            arch,
            recorder,
            which,
            reason,
            iterations,
            field,
            stack,
            (flash_hw, mem_efficient_gqa),
        )
    except (DataDependentOutputException, DynamicOutputShapeException) as exc:
        # The framework's code branches on tensor values somewhere (an MoE block that loops
        # over the experts tokens were routed to): fake tensors have none. The built-in
        # builders model balanced routing instead, where they can run the workload.
        encoder = isinstance(w, VisionWorkload | Seq2SeqWorkload | SpeechToTextWorkload)
        if which != "framework" or encoder or _framework_only(w):
            raise InvalidWorkload(
                f"{field}.model",
                f"its code depends on tensor values ({type(exc).__name__}), which a trace on "
                "fake tensors does not have: use method 'analytic'",
            ) from None
        check_traceable(w, field)  # type: ignore[arg-type]
        recorder = Recorder(gemm_workspaces=workspaces)
        words = _run(
            w,
            arch,
            recorder,
            "builtin",
            None,
            iterations,
            field,
            stack,
            (flash_hw, mem_efficient_gqa),
        )
        words += (
            " (the framework's code depends on tensor values here -- "
            f"{type(exc).__name__} -- which fake tensors do not have)"
        )
    return recorder.trace, words


def _framework_only(w: Any) -> bool:
    """A model only the framework builds: its architecture came from its inventory."""
    m = w.model
    return (
        isinstance(m, ResolvedModel)
        and m.inventory is not None
        and m.config.get("model_type") not in CLOSED_FORM_FAMILIES
    )


def _run(
    w: Any,
    arch: Any,
    recorder: Recorder,
    which: str,
    reason: str | None,
    iterations: int,
    field: str,
    stack: Stack | None = None,
    sdpa_device: tuple[bool, bool] = (True, False),
) -> str:
    """Build and run the program (``framework`` or ``builtin``) under the recorder; the code
    that ran, in words."""
    with FakeTensorMode(), kernels.emulation(*sdpa_device), recorder.recording():
        if which == "framework":
            try:
                program: Any = prepare_framework(
                    w, arch, recorder, torch.device("cpu"), emulate=True
                )
            except InvalidWorkload as exc:
                raise InvalidWorkload(f"{field}.{exc.field}", exc.message) from None
            words = f"framework: {LIBRARY} {type(program.model).__name__}"
            if program.notes:
                words += " (" + "; ".join(program.notes) + ")"
        else:
            assert isinstance(w, InferenceWorkload | TrainingWorkload)  # encoders raised above
            program = prepare(w, arch, recorder, torch.device("cpu"), stack)
            words = "built-in builders" + (f" ({reason})" if reason else "")
        program.run(iterations)
        del program
    return words


def _check_positions(w: InferenceWorkload | TrainingWorkload, arch: Any, field: str) -> None:
    """Learned position embeddings (GPT-2, BERT) have a row per position: a longer sequence
    cannot run at all."""
    table = next((g for g in arch.embeddings if g.name in ("wpe", "position_embeddings")), None)
    if table is None:
        return
    if isinstance(w, TrainingWorkload):
        name, tokens = "sequence_length", w.sequence_length
    else:
        name, tokens = "prompt_tokens", w.context_tokens
    if tokens > table.rows:
        raise InvalidWorkload(
            f"{field}.{name}",
            f"needs {tokens} positions; the model's learned "
            f"position embeddings have {table.rows} (prompt + generated "
            "tokens must fit)",
        )


def _line(
    c: Component, value: int, formula: str, source: str, parts: tuple[tuple[str, int], ...] = ()
) -> Line:
    return Line(c, value, formula, (), source, tuple(Part(name=n, bytes=b) for n, b in parts))


def request_workspaces(
    request: BudgetRequest, profiles: ProfileSet | None = None
) -> tuple[tuple[str, int], ...]:
    """The GEMM workspaces a process of ``request``'s device and stack allocates through the
    caching allocator at its first GEMM (``profiles``: the calibrated device profiles)."""
    return _workspaces(*_device_overheads(request, profiles))


def _device_overheads(request: BudgetRequest, profiles: ProfileSet | None) -> tuple[Overheads, str]:
    """The overheads of the request's device and stack, and the device's vendor."""
    ctx = resolve_device(request.device, profiles, request.software)
    if ctx is None:
        return with_software(DEFAULT_OVERHEADS, request.software), "nvidia"
    return ctx.overheads, ctx.vendor


def _workspaces(ov: Overheads, vendor: str) -> tuple[tuple[str, int], ...]:
    return gemm_workspaces(
        ov.workspace_bytes, vendor, separate_cublaslt(version_tuple(ov.stack.torch_version))
    )


def trace_budget(request: BudgetRequest) -> Budget:
    """The answer to a ``method: trace`` request."""
    return trace_budget_with_replays(request)[0]


def trace_budget_with_replays(request: BudgetRequest) -> tuple[Budget, tuple[Replay, ...]]:
    """The answer and each workload's replay (the oracle tests read the component peaks)."""
    replays: list[Replay] = []
    profiles = profiles_from(os.environ.get(PROFILES_ENV))
    analytic = estimate(
        request.workloads,
        request.device,
        request.headroom,
        profiles,
        request.software,
        request.disk,
    )
    ov, vendor = _device_overheads(request, profiles)
    workspaces = _workspaces(ov, vendor)
    source = _SOURCE.format(version=str(torch.__version__))
    values = {c: 0 for c in Component}
    parts: dict[Component, list[tuple[str, int]]] = {}
    summary: TraceSummary | None = None
    summary_instances = 1  # instances of the workload whose timeline the summary holds
    peaks: list[str] = []
    analytic_device = analytic.devices[analytic.most_loaded]
    analytic_lines = {line.component: line for line in analytic_device.lines}
    # The trace's own switch, or the stack's allocator setting (the request's software, axolotl).
    expandable = request.trace.expandable_segments or ov.stack.expandable_segments
    for i, w in enumerate(request.workloads):
        if isinstance(w, GenericWorkload):
            raise InvalidWorkload(
                f"workloads[{i}]", "a generic workload has no code to trace: use method 'analytic'"
            )
        if isinstance(w, LLMServingWorkload):  # BudgetRequest refuses it; never traced
            raise InvalidWorkload(
                f"workloads[{i}]", "an llm_serving workload is budgeted by method 'analytic' only"
            )
        if isinstance(w, ImageGenerationWorkload):
            r, code_words = trace_image_generation_code(
                w,
                iterations=request.trace.iterations,
                expandable_segments=expandable,
                workspaces=workspaces,
                field=f"workloads[{i}]",
                flash_hw=ov.flash_hw,
            )
        else:
            r, code_words = trace_workload_code(
                w,
                iterations=request.trace.iterations,
                expandable_segments=expandable,
                workspaces=workspaces,
                field=f"workloads[{i}]",
                code=request.trace.code,
                stack=ov.stack,
                flash_hw=ov.flash_hw,
                mem_efficient_gqa=ov.mem_efficient_gqa,
            )
        replays.append(r)
        k = w.instances
        traced_total = 0
        for c in _TRACED:
            v = r.components.get(c.value, 0) * k
            values[c] += v
            traced_total += v
            for name, b in r.parts.get(c.value, ()):
                parts.setdefault(c, []).append((name, b * k))
        values[C.ALLOCATOR_OVERHEAD] += r.peak_reserved_bytes * k - traced_total
        peaks.append(f"{r.peak_phase} (iteration {r.peak_iteration})")
        if summary is None:
            summary_instances = k
            summary = TraceSummary(
                peak_allocated_bytes=r.peak_allocated_bytes,
                peak_reserved_bytes=r.peak_reserved_bytes,
                peak_phase=r.peak_phase,
                peak_iteration=r.peak_iteration,
                iterations=request.trace.iterations,
                expandable_segments=expandable,
                num_events=r.num_events,
                timeline=tuple(
                    TracePoint(iteration=it, phase=ph, allocated_bytes=a, reserved_bytes=rs)
                    for it, ph, a, rs in r.timeline
                ),
                modelled=MODELLED_FRAMEWORK if code_words.startswith("framework") else MODELLED,
                torch_version=str(torch.__version__),
                code=code_words,
            )
    # Non-torch overheads keep the analytic tier's cited defaults (context per process, NCCL).
    values[C.CUDA_CONTEXT] = analytic_lines[C.CUDA_CONTEXT].bytes
    values[C.COMMUNICATION_BUFFERS] = analytic_lines[C.COMMUNICATION_BUFFERS].bytes
    outside_torch = values[C.CUDA_CONTEXT] + values[C.COMMUNICATION_BUFFERS]
    subtotal = sum(values.values())
    band = band_rule(tuple(workload_class(w) for w in request.workloads), ov.stack)
    headroom = resolve_headroom(request.headroom, band)
    room = headroom_bytes(subtotal, headroom)
    values[C.HEADROOM] = room
    lines = []
    for c in Component:
        if c in _TRACED:
            lines.append(
                _line(
                    c,
                    values[c],
                    "live bytes of the component's storages at the allocated peak",
                    source,
                    tuple(parts.get(c, ())),
                )
            )
        elif c is C.ALLOCATOR_OVERHEAD:
            lines.append(
                _line(
                    c,
                    values[c],
                    "peak reserved - live bytes at the allocated peak "
                    "(512-byte rounding, segment caching, fragmentation)",
                    source,
                )
            )
        else:
            a = analytic_lines[c]
            lines.append(Line(c, values[c], a.formula, (), a.source, a.parts))
    total = subtotal + room
    device = DeviceBudget(
        label=analytic_device.label,
        pipeline_stage=analytic_device.pipeline_stage,
        num_devices=analytic_device.num_devices,
        peak_phase="; ".join(peaks),
        lines=tuple(lines),
        total_bytes=total,
        inputs=analytic_device.inputs,
        phases=tuple(
            _phase(p, outside_torch, summary_instances, headroom)
            for p in (summary.timeline if summary and len(request.workloads) == 1 else ())
        ),
        band=band_of(band, subtotal, counted_bytes(values)),
    )
    budget = msgspec.structs.replace(
        analytic,
        method="trace",
        devices=(device,),
        most_loaded=0,
        total_bytes=total,
        trace=summary,
        calibration=_traced_calibration(analytic.calibration),
    )
    return with_fit(budget, request.workloads), tuple(replays)


def _traced_calibration(use: CalibrationUse | None) -> CalibrationUse | None:
    """The trace measures allocator overhead by replay: that line is neither a profile's nor
    a built-in fraction."""
    if use is None:
        return None
    overheads = tuple(
        OverheadOrigin(
            component=o.component,
            origin="builtin",
            profile=None,
            source="trace tier: replay of c10/cuda/CUDACachingAllocator.cpp",
        )
        if o.component is Component.ALLOCATOR_OVERHEAD
        else o
        for o in use.overheads
    )
    return msgspec.structs.replace(use, overheads=overheads)


def _phase(p: TracePoint, outside_torch: int, instances: int, headroom: Headroom) -> Phase:
    """A timeline point as a device total: reserved bytes x instances + context and NCCL +
    headroom."""
    subtotal = p.reserved_bytes * instances + outside_torch
    return Phase(
        name=f"iteration {p.iteration}: {p.phase}",
        total_bytes=subtotal + headroom_bytes(subtotal, headroom),
    )
