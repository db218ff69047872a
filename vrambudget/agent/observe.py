"""What an operator sees of the probes: Prometheus metrics and one log line per state change.

Metrics live in a registry the app owns (several agent apps in one process -- the tests --
keep theirs apart), served at ``/metrics`` after the process-wide registry that Litestar's
request metrics use:

- ``vrambudget_agent_probe_queue_depth{device}`` -- probes waiting in the device's queue
  (``cpu``, ``cuda:0``, ...), read at scrape time;
- ``vrambudget_agent_probes_total{status}`` -- probes that reached a final status in this
  process (``interrupted``: found queued or running at start);
- ``vrambudget_agent_probe_duration_seconds{kind}`` -- running time (start of the run to its
  recorded outcome) of the probes that ran, by workload kind;
- ``vrambudget_agent_probe_last_peak_bytes{device,view}`` -- the peaks of the device's last
  result: ``torch_allocated``, ``torch_reserved`` (CUDA), ``nvml_device_used`` (CUDA with
  NVML), ``nvml_process_used`` (when NVML tells the process's own memory).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .spec import CustomWorkload, ProbeRequest, ProbeResult
from .store import TERMINAL_STATUSES

__all__ = ["ProbeMetrics", "describe", "log"]

log = logging.getLogger("vrambudget.agent.probes")

_KINDS = ("inference", "training", "llm_serving", "custom")
_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)


class _QueueDepth(Collector):
    def __init__(self, queues: Mapping[str, asyncio.Queue[str]]) -> None:
        self._queues = queues

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "vrambudget_agent_probe_queue_depth",
            "Probes waiting in the device's queue (the running one not counted)",
            labels=["device"],
        )
        for key, queue in sorted(self._queues.items()):
            family.add_metric([key], queue.qsize())
        yield family


class ProbeMetrics:
    """The app's probe metrics, in its own registry."""

    def __init__(self, queues: Mapping[str, asyncio.Queue[str]]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_QueueDepth(queues))
        self.finished = Counter(
            "vrambudget_agent_probes",
            "Probes that reached a final status in this agent process, by status",
            ["status"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "vrambudget_agent_probe_duration_seconds",
            "Running time of the probes that ran (run start to recorded outcome), by kind",
            ["kind"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.last_peak = Gauge(
            "vrambudget_agent_probe_last_peak_bytes",
            "Peaks of the device's last probe result, by view",
            ["device", "view"],
            registry=self.registry,
        )
        for status in sorted(TERMINAL_STATUSES):
            self.finished.labels(status)
        for kind in _KINDS:
            self.duration.labels(kind)

    def record(
        self,
        device: str,
        status: str,
        kind: str | None,
        duration_s: float | None,
        result: ProbeResult | None,
    ) -> None:
        self.finished.labels(status).inc()
        if kind is not None and duration_s is not None:
            self.duration.labels(kind).observe(duration_s)
        if result is None:
            return
        views: dict[str, int | None] = {}
        if result.torch is not None:
            views["torch_allocated"] = result.torch.allocated_peak_bytes
            views["torch_reserved"] = result.torch.reserved_peak_bytes
        if result.nvml is not None:
            views["nvml_device_used"] = result.nvml.peak_used_bytes
            views["nvml_process_used"] = result.nvml.process_peak_used_bytes
        for view, value in views.items():
            if value is not None:
                self.last_peak.labels(device, view).set(value)


def kind(request: ProbeRequest) -> str:
    """The workload's kind (its tag on the wire): inference, training, llm_serving, custom."""
    return str(type(request.workload).__struct_config__.tag)


def describe(request: ProbeRequest) -> str:
    """``inference, llama-3.1-8b``: the workload's kind and model, for the log."""
    w: Any = request.workload
    if isinstance(w, CustomWorkload):
        return f"custom, {w.entry_point}"
    model = getattr(w, "model", None)
    name = getattr(model, "id", None) or getattr(model, "name", None)
    if not name and isinstance(model, msgspec.Struct):  # its source: dimensions, hf_config, ...
        name = type(model).__struct_config__.tag
    return f"{kind(request)}, {name}"


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 27 else f"{n / (1 << 20):.1f} MiB"


def queued(probe_id: str, device: str, request: ProbeRequest) -> None:
    log.info("probe %s queued on %s (%s)", probe_id, device, describe(request))


def running(probe_id: str, device: str) -> None:
    log.info("probe %s running on %s", probe_id, device)


def finished(
    metrics: ProbeMetrics,
    probe_id: str,
    device: str,
    status: str,
    *,
    request: ProbeRequest | None = None,
    duration_s: float | None = None,
    result_json: str | None = None,
    error: str | None = None,
) -> None:
    """A probe reached ``status``: counted, timed, its peaks kept, and one log line."""
    result = msgspec.json.decode(result_json, type=ProbeResult) if result_json else None
    metrics.record(device, status, kind(request) if request else None, duration_s, result)
    took = f" in {duration_s:.1f} s" if duration_s is not None else ""
    detail = ""
    if result is not None and result.torch is not None:
        detail = f" (allocated peak {_gib(result.torch.allocated_peak_bytes)})"
    elif error:
        detail = f": {error.splitlines()[0][:200]}"
    log.info("probe %s %s%s%s", probe_id, status, took, detail)
