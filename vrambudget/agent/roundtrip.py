"""The round trip with the calculation service (a probe's ``service_url``): the estimate
before the run, the comparison after it.

The estimate is fetched synchronously before the child starts (a short timeout; a service
that is down only costs the probe its estimate, recorded as ``estimate_error``). The
comparison is not fetched here: the finished report goes into the outbox as a ``comparison``
row in the same transaction as the result, and the deliverer posts it with retries, so a
measurement never waits on, or is lost to, the service (``webhooks.Deliverer``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import msgspec

from vrambudget.core.catalog import match_gpu
from vrambudget.core.probe_report import ProbeRequest, ProbeResource
from vrambudget.core.result import Budget
from vrambudget.core.spec import (
    CatalogDevice,
    CustomDevice,
    DeviceRef,
    LLMServingWorkload,
    Software,
    driver_version,
)

from .webhooks.addresses import AddressRefused, Resolver, pin

__all__ = [
    "ESTIMATE_TIMEOUT_S",
    "comparison_entry",
    "device_ref",
    "fetch_estimate",
    "local_software",
    "workload_software",
]

ESTIMATE_TIMEOUT_S = 10.0
_MAX_ESTIMATE_BYTES = 4 << 20


def _endpoint(service_url: str, path: str) -> str:
    return service_url.rstrip("/") + path


def device_ref(inventory: Any, device: int | str) -> DeviceRef | None:
    """The device to estimate for, from the agent's NVML inventory: the catalog GPU its name
    and memory match (else its name alone), else a custom device of its memory; None without
    NVML (CPU path)."""
    if not getattr(inventory, "available", False):
        return None
    for g in inventory.gpus:
        if device in (g.index, g.uuid):
            name = str(g.name)
            total = int(g.memory_total_bytes)
            cc = getattr(g, "compute_capability", None)
            # NVML's total includes what the driver reserves (the catalog holds the CUDA
            # runtime's smaller total: over 1% apart on L4, T4, A10G, A100 40GB): fall back to
            # the name and compute capability alone.
            found = match_gpu(name, total, cc) or match_gpu(name, None, cc)
            if found is not None:
                return CatalogDevice(id=found.id)
            return CustomDevice(name=name[:128] or "custom", memory_total_bytes=total)
    return None


_CUDA_LINE = re.compile(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", re.MULTILINE)


@cache
def _torch_build() -> tuple[str | None, str | None]:
    """The installed torch's version and CUDA runtime, read from its metadata and its generated
    ``torch/version.py`` -- without importing torch (the agent process never does)."""
    try:
        version = importlib.metadata.version("torch")
        spec = importlib.util.find_spec("torch")
    except (importlib.metadata.PackageNotFoundError, ImportError, ValueError):
        return None, None
    cuda = None
    for root in (spec.submodule_search_locations or []) if spec else []:
        try:
            m = _CUDA_LINE.search((Path(root) / "version.py").read_text())
        except OSError:
            continue
        cuda = m.group(1) if m else None
        break
    return version, cuda


def local_software(inventory: Any) -> Software | None:
    """What the probe will run on (the same fields the child reports): torch and its CUDA
    runtime, the NVML driver. Sent with the estimate so that the service picks the calibration
    profile the comparison will use; None without NVML (CPU path)."""
    if not getattr(inventory, "available", False):
        return None
    torch_version, cuda = _torch_build()
    return Software(
        torch_version=torch_version[:64] if torch_version else None,
        cuda_version=cuda[:32] if cuda else None,
        driver_version=nvml_driver(inventory),
    )


def workload_software(workload: Any, inventory: Any) -> Software | None:
    """What the estimate sent before a probe should assume: :func:`local_software` for a
    workload this agent's torch runs; for a serving engine, which brings its own torch and CUDA
    build, the NVML driver alone (the engine release's pins apply)."""
    if not isinstance(workload, LLMServingWorkload):
        return local_software(inventory)
    if not getattr(inventory, "available", False):
        return None
    driver = nvml_driver(inventory)
    return Software(driver_version=driver) if driver else None


def nvml_driver(inventory: Any) -> str | None:
    """The NVML driver version where it reads as one (``software.driver_version``'s pattern),
    else None: the service would refuse any other string."""
    return driver_version(getattr(inventory, "driver_version", None))


def fetch_estimate(
    request: ProbeRequest,
    device: DeviceRef | None,
    transport: httpx.BaseTransport | None = None,
    software: Software | None = None,
    *,
    allow_list: tuple[str, ...] | None = None,
    resolver: Resolver | None = None,
) -> tuple[str | None, str | None]:
    """POST the probe's workload to ``{service_url}/v1/budgets`` (headroom 0: a measurement
    has none; ``software`` selects the calibration profile). Returns (the budget JSON, None)
    or (None, why not). With ``allow_list`` (the agent passes its service allow-list) the host
    is resolved and must be a public address or one an entry names exactly
    (:func:`~vrambudget.agent.webhooks.pin`); the request goes to that checked address."""
    assert request.service_url is not None
    url: str | httpx.URL = _endpoint(request.service_url, "/v1/budgets")
    extra: dict[str, str] = {}
    extensions: dict[str, str] = {}
    if allow_list is not None:
        try:
            url, extra, extensions = pin(str(url), allow_list, resolver)
        except AddressRefused as exc:
            return None, f"estimate: service URL refused: {exc}"
    body: dict[str, Any] = {"workloads": [request.workload], "headroom": {"fraction": 0.0}}
    if device is not None:
        body["device"] = device
    if software is not None:
        body["software"] = software
    try:
        with httpx.Client(
            transport=transport, timeout=ESTIMATE_TIMEOUT_S, trust_env=False, follow_redirects=False
        ) as client:
            r = client.post(
                url,
                content=msgspec.json.encode(body),
                headers={
                    "content-type": "application/json",
                    "user-agent": "vrambudget-agent",
                    **extra,
                },
                extensions=extensions,
            )
    except httpx.HTTPError as exc:
        return None, f"estimate: {type(exc).__name__}: {exc}"
    if not r.is_success:
        return None, f"estimate: HTTP {r.status_code}: {r.text[:500]}"
    if len(r.content) > _MAX_ESTIMATE_BYTES:
        return None, f"estimate: answer larger than {_MAX_ESTIMATE_BYTES} bytes"
    try:  # store only what decodes as a budget: the probe resource decodes it on every read
        msgspec.json.decode(r.content, type=Budget)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return None, f"estimate: the service's answer is not a budget: {exc}"
    return r.text, None


def comparison_entry(resource: ProbeResource) -> tuple[str, str, str]:
    """The outbox row that posts this finished probe to the service: (url, payload, id)."""
    assert resource.request.service_url is not None
    report = msgspec.structs.replace(resource, estimate=None, comparison=None)
    return (
        _endpoint(resource.request.service_url, "/v1/comparisons"),
        msgspec.json.encode(report).decode(),
        f"cmp_{resource.id}",
    )
