"""What the agent checks before it accepts a probe, and the host-memory cap of a CPU probe.

Validation uses the pure core (no torch): a workload the calculation service would refuse
(an unknown preset, a parallel layout that does not divide the model, ...) is refused at
submission with a 422 naming the field, instead of failing later in the child.

The CPU cap: a probe on a host without CUDA allocates the model in host RAM, so without a cap
any token holder could ask for a 70B model and invoke the host's OOM killer. The child sets
``RLIMIT_DATA`` (private writable memory: the heap and anonymous mappings, which is where
tensors live) to :func:`cpu_memory_limit` before it imports torch. The default is
``max(4 GiB, 2 x the analytic estimate + 2 GiB + what a quality check holds)``, never above
the cap, which is ``VRAMBUDGET_AGENT_CPU_MEMORY_LIMIT_BYTES`` or, unset, half the host's RAM;
a workload whose estimate alone is over the cap is refused at submission (422).

Jobs that run together (a probe's ``overlap``) share the cap: their estimates together must fit
it (else 422 on ``$.overlap``), and each child's limit is its share of it
(:func:`cpu_memory_limits`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from vrambudget.core.errors import BudgetError, InvalidWorkload, UnknownModel
from vrambudget.core.estimate import estimate
from vrambudget.core.resolve import needs_resolution
from vrambudget.core.spec import LLMServingWorkload

from .quality import quality_refusal
from .settings import AgentSettings
from .spec import CustomWorkload, ProbeRequest

__all__ = [
    "WorkloadRefused",
    "cpu_memory_cap",
    "cpu_memory_limit",
    "cpu_memory_limits",
    "validate_overlap",
    "validate_workload",
]

_GIB = 1 << 30
_FLOOR_BYTES = 4 * _GIB
_OVERHEAD_BYTES = 2 * _GIB


class WorkloadRefused(ValueError):
    """A workload the agent will not run; ``field`` is a JSON path into the request."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def host_ram_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def cpu_memory_cap(settings: AgentSettings) -> int | None:
    """The most a CPU probe may use: the configured cap (0: no cap), else half the host's RAM."""
    if settings.cpu_memory_limit_bytes is not None:
        return settings.cpu_memory_limit_bytes or None
    ram = host_ram_bytes()
    return ram // 2 if ram else None


def estimated_bytes(request: ProbeRequest) -> int | None:
    """The analytic estimate of the workload's memory (its most loaded device plus host RAM),
    or None for a custom entry point. Raises :class:`WorkloadRefused` for a workload the
    service would refuse."""
    workload = request.workload
    if isinstance(workload, CustomWorkload):
        return None
    if needs_resolution(workload.model):  # the child fetches and builds it (the framework)
        return None
    try:
        budget = estimate((workload,))
    except InvalidWorkload as exc:
        field = exc.field.removeprefix("$.").replace("workloads[0]", "workload", 1)
        if not field.startswith("workload"):
            field = f"workload.{field}"
        raise WorkloadRefused(f"$.{field}", exc.message) from None
    except UnknownModel as exc:
        raise WorkloadRefused("$.workload.model", str(exc)) from None
    except (BudgetError, ValueError, ArithmeticError, RecursionError) as exc:
        raise WorkloadRefused("$.workload", f"{type(exc).__name__}: {exc}"[:500]) from None
    return int(budget.total_bytes)


def validate_workload(settings: AgentSettings, request: ProbeRequest, *, cpu: bool) -> None:
    """Refuse (:class:`WorkloadRefused`) what the service would refuse; ``weights:
    checkpoint`` without the checkpoint on this host; a quality check whose host memory is over
    the cap (every host); and on a CPU host a workload whose estimate alone is over the cap."""
    if isinstance(request.workload, LLMServingWorkload):  # an engine probe: its own checks
        _validate_engine(settings, request, cpu=cpu)
        return
    refused = quality_refusal(settings.eval_dir, request)
    if refused is not None:
        raise WorkloadRefused(*refused)
    need = estimated_bytes(request)
    _check_weights(settings, request)
    cap = cpu_memory_cap(settings)
    if cap is None:
        return
    model_dirs = tuple(str(d) for d in settings.model_dirs)
    _check_quality_memory(request, cap, model_dirs)  # every host: the logits are in host RAM
    if cpu and need is not None and need > cap:
        raise WorkloadRefused(
            "$.workload",
            f"estimated {need} bytes; over this agent's CPU memory cap of {cap} bytes "
            "(VRAMBUDGET_AGENT_CPU_MEMORY_LIMIT_BYTES)",
        )


def validate_overlap(settings: AgentSettings, jobs: Sequence[ProbeRequest], *, cpu: bool) -> None:
    """On a CPU host, refuse (:class:`WorkloadRefused` on ``$.overlap``) jobs that run
    together (the probe's own first, then its overlap's) whose estimates add up to more than
    the CPU memory cap: each fits alone, together they would wake the OOM killer. A job without
    an estimate (a custom entry point, a model the child resolves) counts 0 here."""
    if not cpu or len(jobs) < 2:
        return
    cap = cpu_memory_cap(settings)
    if cap is None:
        return
    needs = [estimated_bytes(job) or 0 for job in jobs]
    total = sum(needs)
    if total > cap:
        raise WorkloadRefused(
            "$.overlap",
            f"the {len(jobs)} jobs run together; their estimates add up to {total} bytes "
            f"({' + '.join(str(n) for n in needs)}), over this agent's CPU memory cap of "
            f"{cap} bytes (VRAMBUDGET_AGENT_CPU_MEMORY_LIMIT_BYTES), which they share",
        )


def _validate_engine(settings: AgentSettings, request: ProbeRequest, *, cpu: bool) -> None:
    """The engine is configured here, the recipe's GPU is known, the estimate and the command
    can be made (``engine.recipe.plan``, which the child runs again)."""
    from .engine.recipe import EngineRefused, plan

    inventory = None
    if not cpu:  # the recipe's GPU, and enough GPUs for the engine's parallelism
        from . import nvml

        inventory = nvml.inventory()
    try:
        plan(
            request,
            settings.engines,
            inventory,
            model_dirs=tuple(str(d) for d in settings.model_dirs),
            gguf_dir=str(settings.gguf_dir) if settings.gguf_dir is not None else None,
        )
    except EngineRefused as exc:
        raise WorkloadRefused(exc.field, exc.message) from None


def cpu_memory_limit(settings: AgentSettings, request: ProbeRequest) -> int | None:
    """The ``RLIMIT_DATA`` a CPU probe's child runs under (None: no limit)."""
    cap = cpu_memory_cap(settings)
    if cap is None:
        return None
    try:
        need = estimated_bytes(request)
    except WorkloadRefused:
        need = None
    if need is None:  # custom entry points: the cap itself
        return cap
    return min(cap, max(_FLOOR_BYTES, 2 * need + _OVERHEAD_BYTES + quality_bytes(request)))


def cpu_memory_limits(settings: AgentSettings, jobs: Sequence[ProbeRequest]) -> list[int | None]:
    """The ``RLIMIT_DATA`` of each of a probe's jobs, which run together (the probe's own
    first, then its overlap's): each job's own :func:`cpu_memory_limit` when these add up to
    no more than the cap; else each gets its share of the cap, ``cap x own / sum(own)``
    (rounded down), so that together they never pass it."""
    own = [cpu_memory_limit(settings, job) for job in jobs]
    cap = cpu_memory_cap(settings)
    if cap is None:
        return own
    limits = [cap if o is None else o for o in own]
    total = sum(limits)
    if total <= cap:
        return list(limits)
    return [cap * o // total for o in limits]


def quality_bytes(request: ProbeRequest, model_dirs: tuple[str, ...] = ()) -> int:
    """What a quality check holds beside the measured program (which is freed first): float32
    master weights, one candidate model (at most float32 too) and the reference's float32
    logits of every compared position. On a GPU host the candidate is on the device, so this
    overstates the host's share by one model: a bound, not an estimate. 0 where it is not
    known at submission (see :func:`_quality_parts`)."""
    parts, q = _quality_parts(request, model_dirs), request.quality
    if parts is None or q is None:
        return 0
    models, per_sequence = parts
    return models + q.max_sequences * per_sequence


def _quality_parts(
    request: ProbeRequest, model_dirs: tuple[str, ...] = ()
) -> tuple[int, int] | None:
    """(the two models' bytes, the reference logits' bytes per sequence), or None without a
    check. A model the child resolves (a Hub repository, a config the framework inventories) is
    counted from the host's checkpoint of it when there is one (:func:`_local_size`); else None
    (the child fetches the config: on a CPU host the cap alone bounds it then)."""
    q, w = request.quality, request.workload
    if q is None or isinstance(w, CustomWorkload | LLMServingWorkload):
        return None
    if needs_resolution(w.model):
        size = _local_size(w.model, model_dirs)
        if size is None:
            return None
        params, vocab = size
    else:
        from vrambudget.core.resolve import resolve_model

        arch = resolve_model(w.model)
        params, vocab = arch.num_params, arch.vocab_size
    return 2 * 4 * params, q.sequence_tokens * vocab * 4


def _local_size(model: Any, model_dirs: tuple[str, ...]) -> tuple[int, int] | None:
    """(parameters, vocabulary) of the host's checkpoint of ``model``: the elements of every
    stored tensor (safetensors headers) and ``config.json``'s ``vocab_size`` (a multimodal
    model's ``text_config``'s), read locally without torch; None when there is none."""
    from vrambudget.hub import HubError, read_local
    from vrambudget.trace.checkpoints import Found, find_checkpoint

    found = find_checkpoint(model, model_dirs)
    if not isinstance(found, Found):
        return None
    try:
        local = read_local(found.path)
    except HubError:
        return None
    text = local.config.get("text_config")
    vocab = local.config.get("vocab_size")
    if vocab is None and isinstance(text, dict):
        vocab = text.get("vocab_size")
    if local.checkpoint is None or not isinstance(vocab, int) or vocab <= 0:
        return None
    return sum(t.numel for t in local.checkpoint.tensors), vocab


def _check_quality_memory(request: ProbeRequest, cap: int, model_dirs: tuple[str, ...]) -> None:
    """A quality check keeps its reference logits in host RAM on every host: refuse one whose
    :func:`quality_bytes` is over the host-memory cap, naming how many sequences would fit."""
    parts = _quality_parts(request, model_dirs)
    if parts is None or request.quality is None:
        return
    models, per_sequence = parts
    q = request.quality
    need = models + q.max_sequences * per_sequence
    if need <= cap:
        return
    held = (
        f"the quality check would hold {need} bytes of host memory ({models} for the float32 "
        f"master weights and one candidate, {q.max_sequences} x {per_sequence} for the "
        f"reference's float32 logits of {q.sequence_tokens} tokens per sequence), over this "
        f"agent's host-memory cap of {cap} bytes (VRAMBUDGET_AGENT_CPU_MEMORY_LIMIT_BYTES)"
    )
    fit = (cap - models) // per_sequence
    if fit >= 1:
        raise WorkloadRefused("$.quality.max_sequences", f"{held}: must be <= {fit}")
    raise WorkloadRefused("$.quality", f"{held}; the model's weights alone do not fit")


def _check_weights(settings: AgentSettings, request: ProbeRequest) -> None:
    """``weights: checkpoint`` needs the model's checkpoint on this host (a local lookup: the
    model directories and the Hugging Face cache, nothing downloaded, no torch)."""
    if request.weights != "checkpoint" or isinstance(request.workload, CustomWorkload):
        return
    from vrambudget.trace.checkpoints import Found, find_checkpoint

    found = find_checkpoint(request.workload.model, tuple(str(d) for d in settings.model_dirs))
    if not isinstance(found, Found):
        raise WorkloadRefused("$.weights", f"no usable checkpoint: {found.reason}")
