"""The binding seam: NVIDIA's ``pynvml`` imported on first use (or the caller's fake), initialised
once per process, and the exception types its calls raise."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

__all__ = ["binding_errors", "load_binding"]

_init_lock = threading.Lock()
_initialized: dict[int, Any] = {}  # id -> binding; the value keeps the id from being reused


def load_binding() -> Any:
    """The official binding, imported on first use (raises ImportError without it)."""
    import pynvml

    return pynvml


def binding_errors(binding: Any) -> tuple[type[BaseException], ...]:
    """What a binding call can raise for an NVML failure. ``NVMLLibraryMismatchError`` is not
    an ``NVMLError``: the unversioned process-list wrappers turn FunctionNotFound into it."""
    errors: list[type[BaseException]] = [binding.NVMLError]
    mismatch = getattr(binding, "NVMLLibraryMismatchError", None)
    if isinstance(mismatch, type):
        errors.append(mismatch)
    return tuple(errors)


def _error_types(binding: Any, names: Iterable[str]) -> tuple[type[BaseException], ...]:
    return tuple(t for n in names if isinstance(t := getattr(binding, n, None), type))


def _resolve(binding: Any | None) -> Any:
    return load_binding() if binding is None else binding


def _init(binding: Any) -> None:
    with _init_lock:
        if id(binding) in _initialized:
            return
        binding.nvmlInit()
        _initialized[id(binding)] = binding


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
