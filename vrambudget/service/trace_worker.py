"""The worker side of the trace tier (:mod:`vrambudget.service.tracing`): what a pool worker
process imports and runs -- the engine entry point loaded once, the request decoded, the answer
encoded -- returning only bytes, strings and numbers across the process boundary."""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable
from typing import Any

import msgspec

from vrambudget.core.spec import BudgetRequest

from .outcome import outcome
from .resolutions import Resolutions, with_resolutions

__all__ = [
    "DEFAULT_ENTRY",
    "ENTRY_PATTERN",
    "INSTALL_HINT",
    "encode_answer",
    "init_worker",
    "load_entry",
    "run_inventory",
    "run_trace",
]

DEFAULT_ENTRY = "vrambudget.trace.engine:trace_budget"
ENTRY_PATTERN = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
INSTALL_HINT = "trace tier not installed: pip install 'vrambudget[trace]'"


def load_entry(entry: str) -> Callable[[BudgetRequest], Any]:
    """The engine function named by ``"module:function"`` (imports the module)."""
    if not ENTRY_PATTERN.match(entry):
        raise ValueError(f"trace entry point {entry!r} is not 'module:function'")
    module, _, name = entry.partition(":")
    fn = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        # ImportError, not TypeError: to the service a missing engine function is a missing tier
        raise ImportError(  # noqa: TRY004
            f"trace entry point {entry!r}: {module} has no function {name!r}"
        )
    return fn  # type: ignore[no-any-return]


def _str_subclasses(value: Any) -> Any:
    """msgspec encodes ``str`` but not its subclasses, and an engine can easily hand one over
    (``torch.__version__`` is a ``TorchVersion``): encode those as the plain string they are."""
    if isinstance(value, str):
        return str(value)
    raise NotImplementedError(f"Encoding objects of type {type(value).__name__} is unsupported")


encode_answer = msgspec.json.Encoder(enc_hook=_str_subclasses).encode
"""The encoder of trace answers (in the workers, and in the CLI's in-process trace)."""


_worker_entries: dict[str, Callable[[BudgetRequest], Any] | str] = {}
"""In a worker: the loaded entry point, or why it could not be loaded."""


def _worker_entry(entry: str) -> Callable[[BudgetRequest], Any] | str:
    found = _worker_entries.get(entry)
    if found is None:
        try:
            found = load_entry(entry)
        except ImportError as exc:  # ModuleNotFoundError included: torch or the engine missing
            found = f"{INSTALL_HINT} (loading {entry}: {exc})"
        except Exception as exc:  # noqa: BLE001 -- an engine that fails to import is not installed
            found = f"the trace engine {entry} failed to load: {type(exc).__name__}: {exc}"
        _worker_entries[entry] = found
    return found


def init_worker(entry: str, env: dict[str, str] | None = None) -> None:
    """pebble initializer, once per worker process before its first task: set ``env``, import
    torch and the engine now, so no trace pays (or is timed for) the import. It must not raise:
    pebble turns an initializer failure into a dead worker and then a broken pool. A failure is
    remembered and reported by the first task instead."""
    os.environ.update(env or {})
    try:
        importlib.import_module("torch")  # not an `import` statement: torch stays out of the
    except ImportError:  # API layer's static imports (test_layering.py)
        pass
    _worker_entry(entry)


def run_trace(entry: str, payload: bytes, resolutions: Resolutions = ()) -> tuple[Any, ...]:
    """The task a worker runs: decode the request, call the engine, encode the answer. Returns
    only bytes, strings and numbers:

    ``("ok", answer, seconds)`` | ``("invalid", field, message, seconds)`` |
    ``("unknown-model", id, seconds)`` | ``("unknown-gpu", id, seconds)`` |
    ``("budget-error", message, seconds)`` | ``("memory", message, seconds)`` |
    ``("unavailable", reason)`` | ``("error", summary, traceback, seconds)``
    """
    fn = _worker_entry(entry)
    if isinstance(fn, str):
        return ("unavailable", fn)

    def call() -> bytes:
        request = msgspec.json.decode(payload, type=BudgetRequest)
        workloads = with_resolutions(request.workloads, resolutions)
        return encode_answer(fn(msgspec.structs.replace(request, workloads=workloads)))

    return outcome(call)


def run_inventory(config_json: bytes) -> tuple[Any, ...]:
    """The task of a model's framework inventory (``transformers`` on the meta device):
    ``("ok", encoded ModelInventory, seconds)`` or an error tag as :func:`run_trace`'s; errors
    name fields under ``model.config``."""
    try:
        from vrambudget.workloads.hf.resolve import cached_inventory
    except ImportError as exc:
        return ("unavailable", f"{INSTALL_HINT} (the framework inventory: {exc})")
    config = msgspec.json.decode(config_json)
    return outcome(lambda: msgspec.json.encode(cached_inventory(config)))
