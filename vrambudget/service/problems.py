"""The service's own errors as problem+json: the trace tier's time limit, busy pool, dead worker
and missing installation; everything else maps as in :mod:`vrambudget.http.problems`."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response

from vrambudget.core.fit import FitRequest
from vrambudget.core.spec import BudgetRequest
from vrambudget.http.problems import ProblemError, internal, problem
from vrambudget.http.problems import exception_handlers as _handlers

from .models import HubUnreachable
from .tracing import (
    TIME_LIMIT_ENV,
    TraceBusy,
    TraceError,
    TraceTimeLimit,
    TraceUnavailable,
    TraceWorkerDied,
)

__all__ = ["exception_handlers"]

_TRACE = "https://vrambudget.dev/problems/"


def _trace_error(request: Request[Any, Any, Any], exc: TraceError) -> Response[Any]:
    match exc:
        case TraceTimeLimit():
            return problem(
                request,
                422,
                "Trace time limit exceeded",
                f"the trace did not finish within the {exc.limit_s:g} s limit, so its worker "
                f'was stopped. Ask with "method": "analytic" (closed-form, microseconds), '
                f"trace a smaller workload, or raise the limit with {TIME_LIMIT_ENV}.",
                type_=_TRACE + "trace-time-limit",
            )
        case TraceBusy() if exc.resolving:
            return problem(
                request,
                503,
                "Model resolution busy",
                f"this model's inventory is built by the framework in the trace workers, and "
                f"they are full: {exc.max_pending} traces and model resolutions running or "
                f"waiting, the most VRAMBUDGET_TRACE_MAX_PENDING allows. Retry after "
                f"{exc.retry_after_s} s.",
                type_=_TRACE + "trace-busy",
                headers={"Retry-After": str(exc.retry_after_s)},
            )
        case TraceBusy():
            return problem(
                request,
                503,
                "Trace workers busy",
                f"the trace pool is full: {exc.max_pending} running or waiting, the most "
                f"VRAMBUDGET_TRACE_MAX_PENDING allows. Retry after {exc.retry_after_s} s, or ask "
                f'with "method": "analytic".',
                type_=_TRACE + "trace-busy",
                headers={"Retry-After": str(exc.retry_after_s)},
            )
        case TraceWorkerDied():
            cause = exc.reason or (
                f"killed by signal {-exc.exitcode}"
                if exc.exitcode is not None and exc.exitcode < 0
                else f"exit code {exc.exitcode}"
            )
            return problem(
                request,
                503,
                "Trace worker died",
                f"the trace worker died while tracing this workload ({cause}; a worker killed "
                f"for memory looks like this). A new worker has taken its place; if this workload "
                f"itself exhausted the memory, a retry fails the same way: ask with "
                f'"method": "analytic" or trace a smaller workload.',
                type_=_TRACE + "trace-worker-died",
            )
        case TraceUnavailable(temporary=True):
            return problem(
                request,
                503,
                "Trace tier unavailable",
                exc.reason,
                type_=_TRACE + "trace-unavailable",
                headers={"Retry-After": "1"},
            )
        case TraceUnavailable():
            return problem(
                request,
                501,
                "Trace tier not available",
                exc.reason,
                type_=_TRACE + "trace-unavailable",
            )
    return internal(request, exc)


def _hub_unreachable(request: Request[Any, Any, Any], exc: HubUnreachable) -> Response[Any]:
    return problem(
        request,
        503,
        "Hub unreachable",
        f"{exc.field}: {exc.message.rstrip('.')}. Retry later, or give the model's "
        'config.json inline ({"source": "hf_config", "config": {...}}).',
        (ProblemError(field=f"$.{exc.field}", message=exc.message),),
        type_=_TRACE + "hub-unreachable",
        headers={"Retry-After": "30"},
    )


exception_handlers = _handlers(
    {"/v1/budgets": BudgetRequest, "/v1/fits": FitRequest},
    {TraceError: _trace_error, HubUnreachable: _hub_unreachable},
)
