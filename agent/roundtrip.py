"""The round trip with the calculation service (a probe's ``service_url``): the estimate
before the run, the comparison after it.

The estimate is fetched synchronously before the child starts (a short timeout; a service
that is down only costs the probe its estimate, recorded as ``estimate_error``). The
comparison is not fetched here: the finished report goes into the outbox as a ``comparison``
row in the same transaction as the result, and the deliverer posts it with retries, so a
measurement never waits on, or is lost to, the service (``webhooks.Deliverer``).
"""

from __future__ import annotations

from typing import Any

import httpx
import msgspec

from service.budget.compare import match_gpu
from service.budget.probe_report import ProbeRequest, ProbeResource
from service.budget.result import Budget
from service.budget.spec import CatalogDevice, CustomDevice, DeviceRef

__all__ = ["ESTIMATE_TIMEOUT_S", "comparison_entry", "device_ref", "fetch_estimate"]

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


def fetch_estimate(request: ProbeRequest, device: DeviceRef | None,
                   transport: httpx.BaseTransport | None = None) -> tuple[str | None, str | None]:
    """POST the probe's workload to ``{service_url}/v1/budgets`` (headroom 0: a measurement
    has none). Returns (the budget JSON, None) or (None, why not)."""
    assert request.service_url is not None
    body: dict[str, Any] = {"workloads": [request.workload], "headroom": {"fraction": 0.0}}
    if device is not None:
        body["device"] = device
    try:
        with httpx.Client(transport=transport, timeout=ESTIMATE_TIMEOUT_S, trust_env=False,
                          follow_redirects=False) as client:
            r = client.post(_endpoint(request.service_url, "/v1/budgets"),
                            content=msgspec.json.encode(body),
                            headers={"content-type": "application/json",
                                     "user-agent": "vrambudget-agent"})
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
    return (_endpoint(resource.request.service_url, "/v1/comparisons"),
            msgspec.json.encode(report).decode(), f"cmp_{resource.id}")
