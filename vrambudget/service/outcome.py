"""What a pool worker (compute or trace) sends back across the process boundary for one call:
only bytes, strings and numbers, the domain errors mapped to tags the pool turns into problems."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import Any

from vrambudget.core.errors import BudgetError, InvalidWorkload, UnknownGPU, UnknownModel

__all__ = ["outcome"]


def outcome(call: Callable[[], bytes]) -> tuple[Any, ...]:
    """``("ok", answer, seconds)`` | ``("invalid", field, message, seconds)`` |
    ``("unknown-model", id, seconds)`` | ``("unknown-gpu", id, seconds)`` |
    ``("budget-error", message, seconds)`` | ``("memory", message, seconds)`` |
    ``("error", summary, traceback, seconds)``"""
    start = time.perf_counter()
    try:
        answer = call()
    except InvalidWorkload as exc:
        return ("invalid", exc.field, exc.message, time.perf_counter() - start)
    except UnknownModel as exc:
        return ("unknown-model", exc.model_id, time.perf_counter() - start)
    except UnknownGPU as exc:
        return ("unknown-gpu", exc.gpu_id, time.perf_counter() - start)
    except BudgetError as exc:
        return ("budget-error", str(exc), time.perf_counter() - start)
    except MemoryError as exc:
        return ("memory", str(exc), time.perf_counter() - start)
    except Exception as exc:  # noqa: BLE001 -- reported (500), never raised across the pipe
        return (
            "error",
            f"{type(exc).__name__}: {exc}",
            traceback.format_exc(),
            time.perf_counter() - start,
        )
    return ("ok", answer, time.perf_counter() - start)
