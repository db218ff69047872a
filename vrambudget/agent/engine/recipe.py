"""What an engine probe will start, decided from the request and the host's settings alone: the
catalog GPU whose recipe applies, the core's serving estimate for it (its ``serving.launch`` is
the recipe, its summary the expected figures), what the engine loads, and the load's lengths.

The same function runs at submission (in the agent, to refuse with a 422 naming the field) and
in the probe's child (to run it). It imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from vrambudget.core.catalog import gpus, match_gpu, preset
from vrambudget.core.components import Component
from vrambudget.core.errors import BudgetError, InvalidWorkload, UnknownModel
from vrambudget.core.estimate import estimate
from vrambudget.core.probe_engine import EngineExpected, EngineLoad
from vrambudget.core.probe_report import ProbeRequest
from vrambudget.core.resolve import resolve_model
from vrambudget.core.result import Budget
from vrambudget.core.spec import (
    CatalogDevice,
    HFConfigModel,
    HubModel,
    LLMServingWorkload,
    PresetModel,
    Software,
)

from ..roundtrip import nvml_driver
from .command import CommandError, engine_command
from .launchers import ENGINES, UNSUPPORTED

__all__ = ["EngineRefused", "Recipe", "engine_gpus", "expected", "plan", "recipe_gpu"]


class EngineRefused(ValueError):
    """An engine probe the agent will not run; ``field`` is a JSON path into the request."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class Recipe:
    engine: str
    gpu_id: str
    budget: Budget
    launch: str
    """The recipe: ``serving.launch`` of the estimate."""
    model: str
    """What the engine loads (vLLM / SGLang): the preset's repository or its local directory."""
    load: EngineLoad
    prompt_tokens: int
    vocab_size: int


def recipe_gpu(request: ProbeRequest, inventory: Any | None) -> str:
    """The catalog GPU whose recipe fills the command: ``recipe_gpu`` when the request names
    one, else the GPU NVML's name (and memory) matches."""
    if request.recipe_gpu is not None:
        if request.recipe_gpu not in gpus():
            raise EngineRefused("$.recipe_gpu", f"unknown catalog GPU {request.recipe_gpu!r}")
        return request.recipe_gpu
    if inventory is not None and getattr(inventory, "available", False):
        for g in inventory.gpus:
            if request.device in (g.index, g.uuid):
                cc = getattr(g, "compute_capability", None)
                found = match_gpu(str(g.name), int(g.memory_total_bytes), cc) or match_gpu(
                    str(g.name), None, cc
                )
                if found is not None:
                    return str(found.id)
                raise EngineRefused(
                    "$.recipe_gpu",
                    f"the device ({g.name}) matches no catalog GPU: name the GPU whose recipe "
                    "to run",
                )
    raise EngineRefused(
        "$.recipe_gpu", "this host's GPU is not identified (no NVML): name the recipe's GPU"
    )


def engine_gpus(inventory: Any | None, index: int | None, count: int) -> list[Any]:
    """The GPUs an engine of ``count`` (tensor x pipeline x data) GPUs is given: the probe's
    device first, then the host's others in NVML index order; empty without NVML (a CPU host:
    the engine sees what the host's environment shows it)."""
    if inventory is None or not getattr(inventory, "available", False) or index is None:
        return []
    ordered = sorted(inventory.gpus, key=lambda g: (g.index != index, g.index))
    return ordered[:count]


def _check_gpus(w: LLMServingWorkload, inventory: Any | None) -> None:
    need = w.parallelism.devices
    if need == 1:
        return
    have = len(inventory.gpus) if inventory is not None and inventory.available else 0
    if have < need:
        p = w.parallelism
        raise EngineRefused(
            "$.workload.parallelism",
            f"tensor x pipeline x data = {p.tensor} x {p.pipeline} x {p.data} = {need} GPUs; "
            f"this host has {have}",
        )


def _model(w: LLMServingWorkload, model_dirs: tuple[str, ...]) -> tuple[str, LLMServingWorkload]:
    """What the engine loads, and the workload to estimate: the model's checkpoint when the host
    has it (``<dir>/<owner>/<name>`` / ``<dir>/<name>`` in a model directory, or a complete
    snapshot in the Hugging Face cache: the engine loads that directory, and its own
    ``config.json`` defines the estimate); else, for a preset, its
    source repository (the engine finds or fetches it as it does). A `hub` model must be on
    the host: no probe downloads weights."""
    from vrambudget.trace.checkpoints import Found, find_checkpoint
    from vrambudget.trace.models import local_checkpoint_model

    if not isinstance(w.model, PresetModel | HubModel):
        raise EngineRefused(
            "$.workload.model",
            "an engine probe runs a checkpoint (a preset or a `hub` model); a model given by "
            "its config or dimensions has no weights to load",
        )
    found = find_checkpoint(w.model, model_dirs)
    if isinstance(found, Found):
        if isinstance(w.model, PresetModel):  # the preset's own architecture, as estimated
            return str(found.path), w
        # Its config.json (the safetensors headers would need the framework's inventory to
        # apply, which the torch-free agent does not build).
        config = local_checkpoint_model(str(found.path))["config"]
        local = HFConfigModel(config=config, name=w.model.id)
        return str(found.path), msgspec.structs.replace(w, model=local)
    if isinstance(w.model, HubModel):
        raise EngineRefused("$.workload.model", f"no checkpoint on this host: {found.reason}")
    return preset(w.model.id).hf_repo, w


def plan(
    request: ProbeRequest,
    engines: dict[str, tuple[str, ...]],
    inventory: Any | None,
    *,
    model_dirs: tuple[str, ...] = (),
    gguf_dir: str | None = None,
) -> Recipe:
    """The engine probe ``request`` asks for on this host, or :class:`EngineRefused`."""
    w = request.workload
    assert isinstance(w, LLMServingWorkload)
    if w.engine in UNSUPPORTED:
        raise EngineRefused("$.workload.engine", UNSUPPORTED[w.engine])
    if w.engine not in engines:
        configured = ", ".join(sorted(engines)) or "none (VRAMBUDGET_AGENT_ENGINES)"
        raise EngineRefused(
            "$.workload.engine",
            f"{w.engine} is not configured on this host; configured: {configured}",
        )
    assert w.engine in ENGINES
    _check_gpus(w, inventory)
    gpu_id = recipe_gpu(request, inventory)
    model, w = _model(w, model_dirs)
    try:
        # the host's driver: before R550 vLLM's CUDA graphs take 3.35x (core/serving/driver.py)
        driver = nvml_driver(inventory)
        software = Software(driver_version=driver) if driver else None
        budget = estimate((w,), CatalogDevice(id=gpu_id), software=software)
    except InvalidWorkload as exc:
        field = exc.field.removeprefix("$.").replace("workloads[0]", "workload", 1)
        if not field.startswith("workload"):
            field = f"workload.{field}"
        raise EngineRefused(f"$.{field}", exc.message) from None
    except UnknownModel as exc:
        raise EngineRefused("$.workload.model", str(exc)) from None
    except (BudgetError, ValueError, ArithmeticError) as exc:
        raise EngineRefused("$.workload", f"{type(exc).__name__}: {exc}"[:500]) from None
    serving = budget.serving
    assert serving is not None
    load = request.engine if request.engine is not None else EngineLoad()
    room = serving.max_model_len - load.output_tokens
    if load.prompt_tokens is None and room < 1:
        raise EngineRefused(
            "$.engine.output_tokens",
            f"must be below the workload's max_model_len ({serving.max_model_len})",
        )
    prompt = load.prompt_tokens if load.prompt_tokens is not None else room
    if prompt + load.output_tokens > serving.max_model_len:
        raise EngineRefused(
            "$.engine.prompt_tokens",
            f"prompt_tokens + output_tokens ({prompt + load.output_tokens}) is over the "
            f"workload's max_model_len ({serving.max_model_len})",
        )
    try:  # the recipe must make a command (a port is chosen when it starts)
        engine_command(w.engine, serving.launch, engines[w.engine], model, 1, gguf_dir)
    except CommandError as exc:
        raise EngineRefused("$.workload", str(exc)) from None
    if w.engine == "llama_cpp":
        if gguf_dir is None:
            raise EngineRefused(
                "$.workload.engine",
                "llama_cpp probes need the host's GGUF directory (VRAMBUDGET_AGENT_GGUF_DIR)",
            )
        gguf = engine_command(w.engine, serving.launch, ("x",), model, 1, gguf_dir)
        path = gguf[gguf.index("-m") + 1]
        if not Path(path).is_file():
            raise EngineRefused("$.workload.model", f"no GGUF file {path} on this host")
    return Recipe(
        engine=w.engine,
        gpu_id=gpu_id,
        budget=budget,
        launch=serving.launch,
        model=model,
        load=load,
        prompt_tokens=prompt,
        vocab_size=resolve_model(w.model).vocab_size,
    )


def expected(recipe: Recipe, logged_tokens: int | None) -> EngineExpected:
    """The estimate's figures beside what the engine logged: the most loaded GPU's weights (with
    their quantization metadata), the pool's tokens, the concurrency, whether it starts."""
    b = recipe.budget
    s = b.serving
    assert s is not None
    lines = b.devices[b.most_loaded].lines
    weights = sum(
        ln.bytes
        for ln in lines
        if ln.component in (Component.WEIGHTS, Component.QUANTIZATION_METADATA)
    )
    return EngineExpected(
        weights_bytes=weights,
        kv_cache_tokens=s.kv_cache_tokens,
        max_concurrency=s.max_concurrency,
        would_start=s.would_start,
        kv_cache_tokens_error=(
            (logged_tokens - s.kv_cache_tokens) / logged_tokens if logged_tokens else None
        ),
    )
