"""The probe agent's wire types. They live in the pure core (``service.budget.probe_report``)
because the service compares the same reports; this module re-exports them for the agent."""

from service.budget.probe_report import (
    Callback,
    CustomWorkload,
    DeviceView,
    Iteration,
    ProbeRequest,
    ProbeResource,
    ProbeResult,
    ProbeStatus,
    ProbeWorkload,
    TorchView,
)

__all__ = [
    "Callback",
    "CustomWorkload",
    "DeviceView",
    "Iteration",
    "ProbeRequest",
    "ProbeResource",
    "ProbeResult",
    "ProbeStatus",
    "ProbeWorkload",
    "TorchView",
]
