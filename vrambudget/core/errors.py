"""Domain errors. They never mention HTTP; ``service/api/problems.py`` maps them to
problem+json responses."""

from __future__ import annotations

__all__ = ["BudgetError", "InvalidWorkload", "UnknownGPU", "UnknownModel"]


class BudgetError(Exception):
    """Base of every error the core raises on purpose."""


class InvalidWorkload(BudgetError, ValueError):
    """A workload that is well-formed but cannot be realised (e.g. a tensor-parallel degree that
    does not divide the attention heads). ``field`` is a JSON path into the request."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class UnknownModel(BudgetError, LookupError):
    def __init__(self, model_id: str) -> None:
        super().__init__(f"no model preset {model_id!r}")
        self.model_id = model_id


class UnknownGPU(BudgetError, LookupError):
    def __init__(self, gpu_id: str) -> None:
        super().__init__(f"no GPU {gpu_id!r} in the catalog")
        self.gpu_id = gpu_id
