"""The calculation service: a Litestar app built in a factory. Handlers are thin: decode (by
Litestar, into the core's msgspec types) -> pure call -> encode."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from litestar import Litestar, Request, Response, get, post
from litestar.exceptions import ValidationException
from litestar.openapi import OpenAPIConfig, ResponseSpec
from litestar.openapi.spec import Contact, Server
from litestar.params import FromPath, QueryParameter
from litestar.plugins.prometheus import PrometheusConfig, PrometheusController

from vrambudget.core.calibration import PROFILES_ENV, profiles_from
from vrambudget.core.catalog import (
    gpu,
    gpus,
    preset,
    presets,
)
from vrambudget.core.catalog_view import CatalogGPU, gpu_entries, model_entry
from vrambudget.core.cluster import ClusterAnswer
from vrambudget.core.compare import (
    DEFAULT_TOLERANCE_BYTES,
    DEFAULT_TOLERANCE_PERCENT,
    estimate_input,
)
from vrambudget.core.comparison import Comparison
from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.fit import FitRequest, FitResponse
from vrambudget.core.probe_report import ProbeResource
from vrambudget.core.result import Budget
from vrambudget.core.spec import BudgetRequest, CatalogDevice, Headroom
from vrambudget.core.spec.cluster import ClusterRequest
from vrambudget.http.body import decode_body
from vrambudget.http.cache import AnswerCache
from vrambudget.http.cors import CorsPolicy, with_cors
from vrambudget.http.docs_ui import SwaggerUI
from vrambudget.http.logs import RequestContext, logging_config
from vrambudget.http.problems import Problem
from vrambudget.http.representation import (
    Freshness,
    Representation,
    cacheable,
    no_store_errors,
)

from .cluster_yaml import Manifests, manifests_yaml
from .compute import ComputeError, ComputePool, compute_error
from .compute_worker import software_of
from .freshness import answer_headers
from .models import ModelResolver, pending
from .openapi import patch_openapi
from .pictures import (
    FORMAT_PARAMETER,
    PictureFormat,
    budget_picture,
    comparison_picture,
    wants_svg,
)
from .problems import exception_handlers
from .resolutions import Resolutions, resolution_digest
from .settings import CORS_ORIGINS_ENV, Settings, SettingsError
from .tracing import TracePool
from .ui import ui_routes
from .wire import Health, ModelDetail, ModelSummary, Ready, model_summary

__all__ = ["Settings", "SettingsError", "create_app"]

VERSION = "0.1.0"


_PROBLEMS = {
    status: ResponseSpec(
        data_container=Problem, description=text, media_type="application/problem+json"
    )
    for status, text in {
        400: "Malformed JSON",
        404: "A named preset or GPU does not exist",
        413: "Request body larger than the configured limit",
        422: "Invalid request: the field path and the allowed range are named; or a "
        "computation past `VRAMBUDGET_COMPUTE_TIME_LIMIT_S` (`.../problems/compute-time-limit`) "
        "or an answer larger than `VRAMBUDGET_MAX_ANSWER_BYTES` (`.../problems/answer-too-large`)",
        503: "The compute workers are busy (`.../problems/compute-busy`, with `Retry-After`), "
        "a worker died (`.../problems/compute-worker-died`), or the server is shutting down",
    }.items()
}
_BUDGET_PROBLEMS = {
    **_PROBLEMS,
    422: ResponseSpec(
        data_container=Problem,
        media_type="application/problem+json",
        description="Invalid request: the field path and the allowed range are named "
        "(`.../problems/validation`); a workload that cannot be realised "
        "(`.../problems/invalid-workload`, also a workload the trace tier does not "
        "run); or, with `method: trace`, a trace that ran past the time limit "
        "(`.../problems/trace-time-limit`); a computation past "
        "`VRAMBUDGET_COMPUTE_TIME_LIMIT_S` (`.../problems/compute-time-limit`); an answer "
        "larger than `VRAMBUDGET_MAX_ANSWER_BYTES` (`.../problems/answer-too-large`)",
    ),
    501: ResponseSpec(
        data_container=Problem,
        media_type="application/problem+json",
        description="`method: trace` on a server without the trace tier "
        "(`.../problems/trace-unavailable`)",
    ),
    503: ResponseSpec(
        data_container=Problem,
        media_type="application/problem+json",
        description="`method: trace` only: as many traces as allowed are running or waiting "
        "(`.../problems/trace-busy`, with `Retry-After`), or the worker died while "
        "tracing, e.g. killed for memory (`.../problems/trace-worker-died`); any method: "
        "the compute workers are busy (`.../problems/compute-busy`, with `Retry-After`) or "
        "one died (`.../problems/compute-worker-died`)",
    ),
}


_ENCODER = msgspec.json.Encoder()


def _encoded(body: bytes) -> Response[Any]:
    """An answer msgspec has already encoded (the handler's annotation names its schema)."""
    return Response(content=body, media_type="application/json")


def _answered(response: Response[Any], workloads: Any) -> Response[Any]:
    """``response`` with ``Cache-Control: no-cache`` when one of ``workloads`` read something
    that can move (:func:`~vrambudget.service.freshness.answer_headers`, docs/HTTP.md)."""
    response.headers.update(answer_headers(workloads))
    return response


def _canonical(
    kind: str, data: msgspec.Struct, resolutions: Resolutions = ()
) -> tuple[bytes, tuple[str, bytes]]:
    """(the decoded request re-encoded, its answer-cache key): defaults filled, key order and
    whitespace irrelevant, and a 32-byte key whatever the body's size. The key covers what
    the request's models resolved to (a moved Hub branch is a new answer)."""
    payload = _ENCODER.encode(data)
    return payload, (kind, resolution_digest(payload, resolutions))


async def _resolve(
    request: Request[Any, Any, Any], workloads: Any, field: str = "workloads"
) -> Resolutions:
    """The request's models resolved (:mod:`~vrambudget.service.models`). Awaited only when
    :func:`~vrambudget.service.models.pending` says a model needs it: a request of presets,
    closed-form configs or dimensions has ``()`` at once."""
    models: ModelResolver = request.app.state.models
    return await models.resolve(workloads, field)


@post(
    "/v1/budgets",
    status_code=200,
    tags=["budgets"],
    summary="Budget a workload",
    responses=_BUDGET_PROBLEMS,
    opt=cacheable(Freshness.REQUEST, "Accept"),
)
async def create_budget(
    request: Request[Any, Any, Any],
    format: Annotated[PictureFormat | None, FORMAT_PARAMETER] = None,
) -> Response[Budget]:
    """Component-wise memory budget per device (one line per component at the peak phase),
    plus host RAM and disk, for co-located workloads on one device type.

    `method: analytic` (default) answers in about a millisecond, computed in a worker process
    (bounded by the server's compute time limit). `method: trace` runs the workload's
    PyTorch code on fake tensors in a worker process (seconds, bounded by the server's time
    limit); its answers are cached by the canonical request, and identical requests in flight
    share one trace.

    `format=svg` (or `Accept: image/svg+xml`) draws the answer: a stacked bar per device."""
    data = decode_body(await request.body(), BudgetRequest)
    resolutions = await _resolve(request, data.workloads) if pending(data.workloads) else ()
    if data.method == "trace":
        pool: TracePool = request.app.state.trace_pool
        answer = await pool.answer(data, resolutions)
    else:
        payload, key = _canonical("budgets", data, resolutions)
        answers: AnswerCache = request.app.state.answers
        cached = answers.get(key)
        if cached is None:
            compute: ComputePool = request.app.state.compute
            cached = answers.put(key, await compute.run("budget", payload, resolutions))
        answer = cached
    return _answered(
        budget_picture(answer) if wants_svg(request, format) else _encoded(answer), data.workloads
    )


@post(
    "/v1/fits",
    status_code=200,
    tags=["fits"],
    summary="Check fits against GPUs",
    responses=_PROBLEMS,
    opt=cacheable(Freshness.REQUEST),
)
async def create_fit(request: Request[Any, Any, Any]) -> Response[FitResponse]:
    """Fit checks of a workload against catalog (or custom) GPUs and device counts, with the
    largest batch, context and concurrency that fit and the smallest device count per GPU."""
    data = decode_body(await request.body(), FitRequest)
    resolutions = await _resolve(request, data.workloads) if pending(data.workloads) else ()
    payload, key = _canonical("fits", data, resolutions)
    answers: AnswerCache = request.app.state.answers
    cached = answers.get(key)
    if cached is None:
        compute: ComputePool = request.app.state.compute
        cached = answers.put(key, await compute.run("fit", payload, resolutions))
    return _answered(_encoded(cached), data.workloads)


_YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml")


@post(
    "/v1/cluster-requests",
    status_code=200,
    tags=["cluster"],
    summary="Render a budget's layout as Kubernetes requests",
    responses=_PROBLEMS,
    opt=cacheable(Freshness.REQUEST, "Accept"),
)
async def create_cluster_requests(
    request: Request[Any, Any, Any],
    format: Annotated[
        Literal["json", "yaml"] | None,
        QueryParameter(
            description="`yaml`: the manifests as a YAML stream for `kubectl apply -f -` "
            "(also chosen by `Accept: application/yaml`). Default: JSON, everything."
        ),
    ] = None,
    manifests: Annotated[
        Manifests,
        QueryParameter(
            description="With YAML: `device-plugin` (the Pod requesting the GPU resource) or "
            "`dra` (the ResourceClaimTemplate and the Pod that uses it; NVIDIA only)."
        ),
    ] = "device-plugin",
) -> Response[ClusterAnswer]:
    """The chosen layout of a budget (or of one row of a fit) as Kubernetes requests: the GPU
    or MIG resource, CPU, memory (host RAM with its headroom and `/dev/shm`, requests =
    limits), ephemeral storage, `/dev/shm` as a memory-backed emptyDir, node affinity and
    tolerations, and a `resource.k8s.io/v1` ResourceClaim with a CEL selector over the
    device's memory and compute capability. How each number is derived: docs/KUBERNETES.md."""
    data = decode_body(await request.body(), ClusterRequest)
    workloads = data.source.request.workloads
    resolutions = (
        await _resolve(request, workloads, "source.request.workloads") if pending(workloads) else ()
    )
    payload, key = _canonical("cluster", data, resolutions)
    answers: AnswerCache = request.app.state.answers
    cached = answers.get(key)
    if cached is None:
        compute: ComputePool = request.app.state.compute
        cached = answers.put(key, await compute.run("cluster", payload, resolutions))
    accept = request.headers.get("accept", "")
    if format == "yaml" or (format is None and any(t in accept for t in _YAML_TYPES)):
        answer = msgspec.json.decode(cached)
        if manifests == "dra" and answer.get("resource_claim_template") is None:
            raise InvalidWorkload(
                "manifests",
                f"no DRA claim for {answer['gpu']} ({answer['vendor']}); allowed: device-plugin",
            )
        text: Response[Any] = Response(
            content=manifests_yaml(answer, manifests), media_type="application/yaml"
        )
        return _answered(text, workloads)
    return _answered(_encoded(cached), workloads)


_COMPARISON_PROBLEMS = {
    **_PROBLEMS,
    422: ResponseSpec(
        data_container=Problem,
        media_type="application/problem+json",
        description="Invalid report or options (the field path and the allowed range are "
        "named); a report with no measurement (status failed, cancelled, "
        "queued...), or of a custom entry point; with `methods=trace`, a workload "
        "the trace tier does not run",
    ),
    501: _BUDGET_PROBLEMS[501],
    503: _BUDGET_PROBLEMS[503],
}


@post(
    "/v1/comparisons",
    status_code=200,
    tags=["comparisons"],
    summary="Compare a probe report with the estimate",
    responses=_COMPARISON_PROBLEMS,
    opt=cacheable(Freshness.REQUEST, "Accept"),
)
async def create_comparison(
    request: Request[Any, Any, Any],
    methods: Annotated[
        list[Literal["analytic", "trace"]] | None,
        QueryParameter(
            description="Tiers to compare (repeat the parameter); the analytic "
            "tier is always included."
        ),
    ] = None,
    tolerance_percent: Annotated[
        float,
        QueryParameter(
            ge=0.0,
            le=100.0,
            description="A difference within this percent of the measurement is `within` "
            "(0 .. 100).",
        ),
    ] = DEFAULT_TOLERANCE_PERCENT,
    tolerance_bytes: Annotated[
        int,
        QueryParameter(
            ge=0,
            le=1 << 40,
            description="A difference of at most this many bytes is `within` (0 .. 2^40).",
        ),
    ] = DEFAULT_TOLERANCE_BYTES,
    gpu: Annotated[
        str | None,
        QueryParameter(
            description="Catalog GPU id to estimate for, instead of the one matched "
            "from the report's device name and memory."
        ),
    ] = None,
    format: Annotated[PictureFormat | None, FORMAT_PARAMETER] = None,
) -> Response[Comparison]:
    """The probe report exactly as the agent returns it (`GET /v1/probes/{id}` on the agent,
    or the `data` of its callback) in, the estimate-vs-measured comparison out: per measured
    quantity and per component, the estimate, the measurement, the difference and a verdict,
    plus the headroom this workload needs on this device. Stateless: the estimate is
    recomputed from the workload in the report.

    `format=svg` (or `Accept: image/svg+xml`) draws the comparison."""
    report = decode_body(await request.body(), ProbeResource)
    if gpu is not None:
        gpu_ref = CatalogDevice(id=gpu) if gpu in gpus() else None
        if gpu_ref is None:
            raise ValidationException(
                detail="invalid request",
                extra=[{"message": f"unknown GPU {gpu!r}; see GET /v1/gpus - at `$.gpu`"}],
            )
    inp = estimate_input(report, gpu)
    one = (inp.workload,)
    resolutions = await _resolve(request, one, "workload") if pending(one) else ()
    traced: bytes | None = None
    if methods and "trace" in methods:
        pool: TracePool = request.app.state.trace_pool
        traced = await pool.answer(
            BudgetRequest(
                method="trace",
                workloads=(inp.workload,),
                device=inp.device,
                headroom=Headroom(fraction=0.0),
                software=software_of(report),
            ),
            resolutions,
        )
    compute: ComputePool = request.app.state.compute
    answer = await compute.run(
        "comparison",
        _ENCODER.encode(report),
        gpu,
        tolerance_percent,
        tolerance_bytes,
        traced,
        resolutions,
    )
    return _answered(
        comparison_picture(answer) if wants_svg(request, format) else _encoded(answer), one
    )


@get("/v1/gpus", tags=["catalog"], summary="List the GPU catalog", opt=cacheable(Freshness.FIXED))
async def list_gpus() -> list[CatalogGPU]:
    return list(gpu_entries().values())


@get(
    "/v1/gpus/{gpu_id:str}",
    tags=["catalog"],
    summary="One GPU",
    responses={404: _PROBLEMS[404]},
    opt=cacheable(Freshness.FIXED),
)
async def get_gpu(gpu_id: FromPath[str]) -> CatalogGPU:
    return gpu_entries()[gpu(gpu_id).id]


@get(
    "/v1/models",
    tags=["catalog"],
    summary="List the model presets",
    opt=cacheable(Freshness.FIXED),
)
async def list_models() -> list[ModelSummary]:
    return [model_summary(i) for i in presets()]


@get(
    "/v1/models/{model_id:str}",
    tags=["catalog"],
    summary="One model preset",
    responses={404: _PROBLEMS[404]},
    opt=cacheable(Freshness.FIXED),
)
async def get_model(model_id: FromPath[str]) -> ModelDetail:
    return ModelDetail(summary=model_summary(model_id), preset=model_entry(preset(model_id)))


@get("/healthz", tags=["ops"], summary="Liveness")
async def healthz() -> Health:
    return Health(status="ok")


@get("/readyz", tags=["ops"], summary="Readiness: catalogs loaded")
async def readyz() -> Response[Ready]:
    n_gpus, n_models = len(gpus()), len(presets())
    ok = n_gpus > 0 and n_models > 0
    return Response(
        Ready(status="ready" if ok else "not ready", num_gpus=n_gpus, num_models=n_models),
        status_code=200 if ok else 503,
    )


def create_app(settings: Settings | None = None) -> Litestar:
    settings = settings or Settings()
    prometheus = PrometheusConfig(
        app_name="vrambudget", prefix="vrambudget", group_path=True, exclude=["/metrics"]
    )
    app = Litestar(
        route_handlers=[
            create_budget,
            create_fit,
            create_cluster_requests,
            create_comparison,
            list_gpus,
            get_gpu,
            list_models,
            get_model,
            healthz,
            readyz,
            PrometheusController,
            *ui_routes(),
        ],
        # Representation wraps the request context: it tags and compresses the answer as the
        # handler and the context wrote it (docs/HTTP.md).
        middleware=[
            Representation(settings.cache_max_age_s, fixed_prefixes=("/schema",)),
            RequestContext(),
            prometheus.middleware,
        ],
        before_send=[no_store_errors],
        logging_config=logging_config(),
        exception_handlers={**exception_handlers, ComputeError: compute_error},
        request_max_body_size=settings.max_body_bytes,
        openapi_config=OpenAPIConfig(
            title="vrambudget calculation service",
            version=VERSION,
            description="Will this GPU workload fit, and where does every byte go? "
            "All quantities are integer bytes.",
            contact=Contact(name="vrambudget"),
            servers=[Server(url="/")],
            path="/schema",
            render_plugins=[SwaggerUI()],
        ),
        on_startup=[patch_openapi, _open_trace_pool, _open_compute_pool],
        on_shutdown=[_close_compute_pool, _close_trace_pool],
        debug=False,
    )
    app.state.profiles = profiles_from(settings.profiles_dir)
    app.state.answers = AnswerCache(settings.answer_cache_entries, settings.answer_cache_bytes)
    # Analytic budgets, fits and comparisons: worker processes, started on the first request.
    app.state.compute = ComputePool(
        workers=settings.compute_workers,
        time_limit_s=settings.compute_time_limit_s,
        max_pending=settings.compute_max_pending,
        max_answer_bytes=settings.max_answer_bytes,
        profiles_dir=settings.profiles_dir,
    )
    # Workers start on the first trace request, not here (see service/api/tracing.py); they
    # load the same calibration profiles.
    app.state.trace_pool = trace_pool = TracePool(
        entry=settings.trace_entry,
        workers=settings.trace_workers,
        time_limit_s=settings.trace_time_limit_s,
        max_pending=settings.trace_max_pending,
        cache=AnswerCache(settings.trace_cache_entries),
        env={PROFILES_ENV: settings.profiles_dir} if settings.profiles_dir else {},
    )
    # Hub repositories and families without a closed form, resolved before computing.
    app.state.models = ModelResolver(trace_pool, settings.hub)
    return with_cors(app, _cors(settings))


def _cors(settings: Settings) -> CorsPolicy | None:
    """Who may call the service from a page (``VRAMBUDGET_CORS_ORIGINS``; docs/HTTP.md)."""
    if not settings.cors_origins:
        return None
    return CorsPolicy(
        origins=settings.cors_origins,
        methods=("GET", "POST"),
        request_headers=("accept", "content-type", "if-none-match", "x-request-id"),
        expose_headers=("ETag", "Retry-After", "X-Request-ID", "X-Unsafe-Integers"),
        setting=CORS_ORIGINS_ENV,
    )


def _open_compute_pool(app: Litestar) -> None:
    app.state.compute.open()


async def _close_compute_pool(app: Litestar) -> None:
    await app.state.compute.close()


def _open_trace_pool(app: Litestar) -> None:
    app.state.trace_pool.open()


async def _close_trace_pool(app: Litestar) -> None:
    await app.state.trace_pool.close()
