"""The compatibility rules of the service (:mod:`vrambudget.core.compat`) checked against the
live device before a probe is accepted: the GPU's compute capability, the driver and the newest
CUDA it supports from NVML, and the host's torch build and libraries from their installed
metadata (never an import of torch: the agent process creates no CUDA context). A rule that
fails refuses the probe at submission (422 naming the rule, the reason, the remedy); without
NVML the check is skipped and the reason logged."""

from __future__ import annotations

import importlib.metadata
import logging
from dataclasses import dataclass
from typing import Any

from vrambudget.core.catalog import match_gpu
from vrambudget.core.compat import DeviceFacts, evaluate, needs_of, parse_cuda
from vrambudget.core.deployed import deploy_all
from vrambudget.core.errors import BudgetError
from vrambudget.core.result import Compatibility
from vrambudget.core.spec import Libraries, LLMServingWorkload, Software, analytic_workloads

from .nvml import NVMLInventory
from .roundtrip import local_software, workload_software
from .spec import CustomWorkload, ProbeRequest

__all__ = ["LiveCheck", "live_check"]

log = logging.getLogger("vrambudget.agent.compat")


@dataclass(frozen=True, slots=True)
class LiveCheck:
    """The verdict on the live device (None: not checked, ``note`` says why)."""

    compatibility: Compatibility | None
    note: str | None = None

    def refusal(self) -> tuple[str, str] | None:
        """(field, message) of the first rule that fails, or None."""
        c = self.compatibility
        if c is None or c.verdict != "unsupported":
            return None
        o = next(o for o in c.checks if o.verdict == "unsupported")
        remedy = f"; {o.remedy}" if o.remedy else ""
        return "$.workload", f"refused by rule {o.rule}: {o.reason}{remedy} (source: {o.source})"


def _library(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)[:64]
    except importlib.metadata.PackageNotFoundError:
        return None


def live_software(inventory: NVMLInventory) -> Software | None:
    """The host's software: torch and its CUDA build, the NVML driver, the installed
    flash-attn and bitsandbytes (from their metadata)."""
    base = local_software(inventory)
    if base is None:
        return None
    return Software(
        torch_version=base.torch_version,
        cuda_version=base.cuda_version,
        driver_version=base.driver_version,
        libraries=Libraries(
            flash_attn=_library("flash_attn") or _library("flash-attn"),
            bitsandbytes=_library("bitsandbytes"),
        ),
    )


def _facts(inventory: NVMLInventory, selector: int | str) -> DeviceFacts | None:
    for g in inventory.gpus:
        if selector not in (g.index, g.uuid):
            continue
        cc = parse_cuda(g.compute_capability) if g.compute_capability else None
        found = match_gpu(g.name, None, g.compute_capability)
        cuda = inventory.cuda_driver_version
        return DeviceFacts(
            name=str(g.name),
            vendor="nvidia",
            cc=cc,
            gfx=None,
            native_dtypes=frozenset(found.native_dtypes) if found is not None else frozenset(),
            custom=False,
            driver_cuda=parse_cuda(cuda) if cuda else None,
        )
    return None


def live_check(request: ProbeRequest, inventory: Any) -> LiveCheck:
    """The rules on the probe's GPU as NVML reports it; never raises."""
    if not getattr(inventory, "available", False):
        reason = getattr(inventory, "error", None) or "no NVML"
        return LiveCheck(None, f"compatibility not checked: NVML is unavailable ({reason})")
    facts = _facts(inventory, request.device)
    if facts is None:
        return LiveCheck(None, f"compatibility not checked: no GPU {request.device!r} in NVML")
    jobs = (request.workload, *request.overlap)
    workloads = tuple(w for w in jobs if not isinstance(w, CustomWorkload))
    if not workloads:
        return LiveCheck(None, "compatibility not checked: configured entry points only")
    analytic = analytic_workloads(workloads)
    if analytic is not None:
        try:
            workloads = deploy_all(analytic)[0]
        except (
            BudgetError,
            ValueError,
            LookupError,
        ) as exc:  # the dtypes stay `auto`: rules skip them
            log.info("compatibility: deploying the workload failed: %s", exc)
    elif not all(isinstance(w, LLMServingWorkload) for w in workloads):
        workloads = tuple(w for w in workloads if isinstance(w, LLMServingWorkload))
    # a serving engine brings its own torch and CUDA build: only the driver is the host's
    software = (
        live_software(inventory)
        if analytic is not None
        else workload_software(workloads[0], inventory)
    )
    return LiveCheck(evaluate(needs_of(workloads, software), facts))
