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
a workload whose
estimate alone is over the cap is refused at submission (422).
"""

from __future__ import annotations

import os

from vrambudget.core.errors import BudgetError, InvalidWorkload, UnknownModel
from vrambudget.core.estimate import estimate
from vrambudget.core.resolve import needs_resolution
from vrambudget.core.spec import LLMServingWorkload

from .quality import quality_refusal
from .settings import AgentSettings
from .spec import CustomWorkload, ProbeRequest

__all__ = ["WorkloadRefused", "cpu_memory_cap", "cpu_memory_limit", "validate_workload"]

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
    """Refuse (:class:`WorkloadRefused`) what the service would refuse, and on a CPU host a
    workload whose estimate alone is over the CPU memory cap."""
    if isinstance(request.workload, LLMServingWorkload):  # an engine probe: its own checks
        _validate_engine(settings, request, cpu=cpu)
        return
    refused = quality_refusal(settings.eval_dir, request)
    if refused is not None:
        raise WorkloadRefused(*refused)
    need = estimated_bytes(request)
    if not cpu or need is None:
        return
    cap = cpu_memory_cap(settings)
    if cap is not None and need > cap:
        raise WorkloadRefused(
            "$.workload",
            f"estimated {need} bytes; over this agent's CPU memory cap of {cap} bytes "
            "(VRAMBUDGET_AGENT_CPU_MEMORY_LIMIT_BYTES)",
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


def quality_bytes(request: ProbeRequest) -> int:
    """What a quality check holds beside the measured program (which is freed first): float32
    master weights, one candidate model (at most float32 too) and the reference's float32
    logits of every compared position."""
    q, w = request.quality, request.workload
    if q is None or isinstance(w, CustomWorkload | LLMServingWorkload):
        return 0
    if needs_resolution(w.model):
        return 0  # the child resolves it; the cap alone bounds it
    from vrambudget.core.resolve import resolve_model

    arch = resolve_model(w.model)
    logits = q.max_sequences * q.sequence_tokens * arch.vocab_size * 4
    return 2 * 4 * arch.num_params + logits
