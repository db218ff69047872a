"""The calculation service: a Litestar app built in a factory. Handlers are thin: decode (by
Litestar, into the core's msgspec types) -> pure call -> encode."""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from litestar import Litestar, Request, Response, get, post
from litestar.exceptions import ClientException, ValidationException
from litestar.openapi import OpenAPIConfig, ResponseSpec
from litestar.openapi.plugins import ScalarRenderPlugin
from litestar.openapi.spec import Contact, Server
from litestar.params import FromPath, QueryParameter
from litestar.plugins.prometheus import PrometheusConfig, PrometheusController

from vrambudget.core.calibration import PROFILES_ENV, profiles_from
from vrambudget.core.catalog import (
    GPU,
    ModelPreset,
    gpu,
    gpus,
    preset,
    preset_arch,
    presets,
)
from vrambudget.core.compare import (
    DEFAULT_TOLERANCE_BYTES,
    DEFAULT_TOLERANCE_PERCENT,
    compare,
    estimate_input,
)
from vrambudget.core.comparison import Comparison
from vrambudget.core.estimate import estimate
from vrambudget.core.fit import FitRequest, FitResponse, fit
from vrambudget.core.probe_report import ProbeResource
from vrambudget.core.result import Budget
from vrambudget.core.spec import BudgetRequest, CatalogDevice, Headroom, Software

from .openapi import patch_openapi
from .problems import Problem, exception_handlers
from .tracing import DEFAULT_ENTRY, ENTRY_PATTERN, TracePool

__all__ = ["Settings", "SettingsError", "create_app"]

VERSION = "0.1.0"


class SettingsError(ValueError):
    """A setting (usually an environment variable) with a value the service cannot run with."""


# field -> (environment variable, smallest, largest) of the numeric settings
_LIMITS: dict[str, tuple[str, float, float]] = {
    "port": ("VRAMBUDGET_PORT", 0, 65535),
    "max_body_bytes": ("VRAMBUDGET_MAX_BODY_BYTES", 1, 1 << 40),
    "trace_workers": ("VRAMBUDGET_TRACE_WORKERS", 1, 256),
    "trace_time_limit_s": ("VRAMBUDGET_TRACE_TIME_LIMIT_S", 0.1, 86400),
    "trace_max_pending": ("VRAMBUDGET_TRACE_MAX_PENDING", 1, 1 << 16),
    "trace_cache_entries": ("VRAMBUDGET_TRACE_CACHE_ENTRIES", 0, 1 << 24),
}


@dataclass(frozen=True, slots=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    max_body_bytes: int = 1 << 20
    trace_workers: int = 1
    """Worker processes running traces (each imports torch: ~1 s to start, some 100s of MiB)."""
    trace_time_limit_s: float = 60.0
    """A trace running longer is stopped (its worker killed) and answered 422."""
    trace_max_pending: int = 4
    """Distinct traces running or waiting; beyond, 503 + Retry-After."""
    trace_cache_entries: int = 256
    """Trace answers kept (LRU by the canonical request hash); 0 disables the cache."""
    trace_entry: str = DEFAULT_ENTRY
    """The engine, as ``module:function`` taking a BudgetRequest and returning a Budget."""
    profiles_dir: str | None = None
    """Directory of calibration profiles (``vrambudget calibrate``); none: built-in defaults."""

    def __post_init__(self) -> None:
        for name, (env, lo, hi) in _LIMITS.items():
            value = getattr(self, name)
            if not lo <= value <= hi:  # NaN fails too
                raise SettingsError(f"{env} (setting {name}) must be in {lo:g} .. {hi:g}, "
                                    f"got {value!r}")
        if self.profiles_dir is not None:
            try:
                profiles_from(self.profiles_dir)
            except ValueError as exc:
                raise SettingsError(f"VRAMBUDGET_PROFILES_DIR (setting profiles_dir): {exc}"
                                    ) from None
        if not ENTRY_PATTERN.match(self.trace_entry):
            raise SettingsError(f"VRAMBUDGET_TRACE_ENTRY (setting trace_entry) must be "
                                f"'module:function', e.g. {DEFAULT_ENTRY!r}; "
                                f"got {self.trace_entry!r}")

    @classmethod
    def from_env(cls) -> Settings:
        """Settings from ``VRAMBUDGET_*`` environment variables; a bad value raises
        :class:`SettingsError` naming the variable, so the service refuses to start."""
        default = cls()
        values: dict[str, Any] = {}
        for name in ("host", "port", "max_body_bytes", "trace_workers", "trace_time_limit_s",
                     "trace_max_pending", "trace_cache_entries", "trace_entry", "profiles_dir"):
            env = _LIMITS[name][0] if name in _LIMITS else f"VRAMBUDGET_{name.upper()}"
            raw = os.environ.get(env)
            if raw is None:
                continue
            kind = type(getattr(default, name)) if getattr(default, name) is not None else str
            try:
                values[name] = kind(raw.strip()) if kind is not str else raw.strip()
            except ValueError:
                article = "a number" if kind is float else "an integer"
                raise SettingsError(f"{env} must be {article}, got {raw!r}") from None
        return cls(**values)


class ModelSummary(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    display_name: str
    hf_repo: str
    model_type: str
    num_params: int
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    kv_cache_bytes_per_token_bf16: int
    """K+V bytes per token over all layers in bf16 (full-attention layers; sliding layers cap at
    their window)."""


class ModelDetail(msgspec.Struct, frozen=True, kw_only=True):
    summary: ModelSummary
    preset: ModelPreset


class Health(msgspec.Struct, frozen=True, kw_only=True):
    status: str


class Ready(msgspec.Struct, frozen=True, kw_only=True):
    status: str
    num_gpus: int
    num_models: int


_PROBLEMS = {
    status: ResponseSpec(data_container=Problem, description=text,
                         media_type="application/problem+json")
    for status, text in {
        400: "Malformed JSON",
        404: "A named preset or GPU does not exist",
        413: "Request body larger than the configured limit",
        422: "Invalid request: the field path and the allowed range are named",
    }.items()
}
_BUDGET_PROBLEMS = {
    **_PROBLEMS,
    422: ResponseSpec(
        data_container=Problem, media_type="application/problem+json",
        description="Invalid request: the field path and the allowed range are named "
                    "(`.../problems/validation`); a workload that cannot be realised "
                    "(`.../problems/invalid-workload`, also a workload the trace tier does not "
                    "run); or, with `method: trace`, a trace that ran past the time limit "
                    "(`.../problems/trace-time-limit`)"),
    501: ResponseSpec(
        data_container=Problem, media_type="application/problem+json",
        description="`method: trace` on a server without the trace tier "
                    "(`.../problems/trace-unavailable`)"),
    503: ResponseSpec(
        data_container=Problem, media_type="application/problem+json",
        description="`method: trace` only: as many traces as allowed are running or waiting "
                    "(`.../problems/trace-busy`, with `Retry-After`), or the worker died while "
                    "tracing, e.g. killed for memory (`.../problems/trace-worker-died`)"),
}


T = TypeVar("T")
_ENCODER = msgspec.json.Encoder()


class AnswerCache:
    """Encoded answers by exact request body. The answer is a pure function of the body (the
    catalogs are fixed at start-up), so a repeated request -- a catalog page calling on every
    view -- is served without decoding or computing. Bounded LRU; errors are never cached.
    Each app also keeps one for trace answers, keyed by the canonical request hash
    (``("trace", sha256)``, see tracing.py) and sized by ``trace_cache_entries``."""

    def __init__(self, max_entries: int) -> None:
        self._entries: OrderedDict[tuple[str, bytes], bytes] = OrderedDict()
        self._max = max_entries

    def get(self, key: tuple[str, bytes]) -> bytes | None:
        hit = self._entries.get(key)
        if hit is not None:
            self._entries.move_to_end(key)
        return hit

    def put(self, key: tuple[str, bytes], value: bytes) -> bytes:
        if self._max:
            self._entries[key] = value
            if len(self._entries) > self._max:
                self._entries.popitem(last=False)
        return value


_ANSWER_ENTRIES = int(os.environ.get("VRAMBUDGET_ANSWER_CACHE_ENTRIES", "4096"))


def decode_body(body: bytes, type_: type[T]) -> T:
    """Strict msgspec decoding of a request body: exactly what the published schema says (no
    coercion of 0 to false or "1" to 1, unlike Litestar's lenient signature model)."""
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as exc:
        if "got `float`" in str(exc):
            # JSON Schema counts 2.0 as an integer; msgspec does not. Retry with integral
            # floats made ints (only on this error path, so valid requests pay nothing).
            try:
                return msgspec.convert(_integral(msgspec.json.decode(body)), type_)
            except msgspec.ValidationError as again:
                exc = again
        raise ValidationException(detail="invalid request", extra=[{"message": str(exc)}]
                                  ) from None
    except msgspec.DecodeError as exc:
        raise ClientException(detail=f"JSON is malformed: {exc}") from None


def _integral(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral(v) for v in value]
    return value


def _summary(model_id: str) -> ModelSummary:
    p = preset(model_id)
    a = preset_arch(model_id)
    if a.mla is not None:
        kv_per_layer = a.mla.kv_lora_rank + a.mla.qk_rope_head_dim
    else:
        kv_per_layer = 2 * a.num_kv_heads * a.head_dim
    return ModelSummary(
        id=p.id, display_name=p.display_name, hf_repo=p.hf_repo, model_type=a.model_type,
        num_params=a.num_params, num_layers=a.num_layers, hidden_size=a.hidden_size,
        num_attention_heads=a.num_heads, num_key_value_heads=a.num_kv_heads,
        max_position_embeddings=a.max_positions,
        kv_cache_bytes_per_token_bf16=kv_per_layer * a.num_layers * 2 if a.kind == "decoder"
        else 0,
    )


@post("/v1/budgets", status_code=200, tags=["budgets"], summary="Budget a workload",
      responses=_BUDGET_PROBLEMS)
async def create_budget(request: Request[Any, Any, Any]) -> Response[Budget]:
    """Component-wise memory budget per device (one line per component at the peak phase),
    plus host RAM and disk, for co-located workloads on one device type.

    `method: analytic` (default) answers in microseconds. `method: trace` runs the workload's
    PyTorch code on fake tensors in a worker process (seconds, bounded by the server's time
    limit); its answers are cached by the canonical request, and identical requests in flight
    share one trace."""
    body = await request.body()
    answers: AnswerCache = request.app.state.answers
    cached = answers.get(("budgets", body))
    if cached is None:
        data = decode_body(body, BudgetRequest)
        if data.method == "trace":
            pool: TracePool = request.app.state.trace_pool
            return Response(content=await pool.answer(data), media_type="application/json")
        cached = answers.put(("budgets", body), _ENCODER.encode(estimate(
            data.workloads, data.device, data.headroom, request.app.state.profiles,
            data.software)))
    return Response(content=cached, media_type="application/json")


@post("/v1/fits", status_code=200, tags=["fits"], summary="Check fits against GPUs",
      responses=_PROBLEMS)
async def create_fit(request: Request[Any, Any, Any]) -> Response[FitResponse]:
    """Fit checks of a workload against catalog (or custom) GPUs and device counts, with the
    largest batch, context and concurrency that fit and the smallest device count per GPU."""
    body = await request.body()
    answers: AnswerCache = request.app.state.answers
    cached = answers.get(("fits", body))
    if cached is None:
        cached = answers.put(("fits", body), _ENCODER.encode(fit(
            decode_body(body, FitRequest), request.app.state.profiles)))
    return Response(content=cached, media_type="application/json")


_COMPARISON_PROBLEMS = {
    **_PROBLEMS,
    422: ResponseSpec(
        data_container=Problem, media_type="application/problem+json",
        description="Invalid report or options (the field path and the allowed range are "
                    "named); a report with no measurement (status failed, cancelled, "
                    "queued...), or of a custom entry point; with `methods=trace`, a workload "
                    "the trace tier does not run"),
    501: _BUDGET_PROBLEMS[501],
    503: _BUDGET_PROBLEMS[503],
}


@post("/v1/comparisons", status_code=200, tags=["comparisons"],
      summary="Compare a probe report with the estimate", responses=_COMPARISON_PROBLEMS)
async def create_comparison(
    request: Request[Any, Any, Any],
    methods: Annotated[list[Literal["analytic", "trace"]] | None, QueryParameter(
        description="Tiers to compare (repeat the parameter); the analytic "
        "tier is always included.")] = None,
    tolerance_percent: Annotated[float, QueryParameter(
        ge=0.0, le=100.0,
        description="A difference within this percent of the measurement is `within` "
        "(0 .. 100).")] = DEFAULT_TOLERANCE_PERCENT,
    tolerance_bytes: Annotated[int, QueryParameter(
        ge=0, le=1 << 40,
        description="A difference of at most this many bytes is `within` (0 .. 2^40).")
    ] = DEFAULT_TOLERANCE_BYTES,
    gpu: Annotated[str | None, QueryParameter(
        description="Catalog GPU id to estimate for, instead of the one matched "
        "from the report's device name and memory.")] = None,
) -> Response[Comparison]:
    """The probe report exactly as the agent returns it (`GET /v1/probes/{id}` on the agent,
    or the `data` of its callback) in, the estimate-vs-measured comparison out: per measured
    quantity and per component, the estimate, the measurement, the difference and a verdict,
    plus the headroom this workload needs on this device. Stateless: the estimate is
    recomputed from the workload in the report."""
    report = decode_body(await request.body(), ProbeResource)
    if gpu is not None:
        gpu_ref = CatalogDevice(id=gpu) if gpu in gpus() else None
        if gpu_ref is None:
            raise ValidationException(detail="invalid request", extra=[{
                "message": f"unknown GPU {gpu!r}; see GET /v1/gpus - at `$.gpu`"}])
    inp = estimate_input(report, gpu)
    profiles = request.app.state.profiles
    estimates = {"analytic": estimate((inp.workload,), inp.device, Headroom(fraction=0.0),
                                      profiles, _software(report))}
    if methods and "trace" in methods:
        pool: TracePool = request.app.state.trace_pool
        traced = await pool.answer(BudgetRequest(
            method="trace", workloads=(inp.workload,), device=inp.device,
            headroom=Headroom(fraction=0.0), software=_software(report)))
        estimates["trace"] = msgspec.json.decode(traced, type=Budget)
    comparison = compare(report, estimates, inp, tolerance_percent=tolerance_percent,
                         tolerance_bytes=tolerance_bytes)
    return Response(content=_ENCODER.encode(comparison), media_type="application/json")


def _software(report: ProbeResource) -> Software | None:
    res = report.result
    if res is None or res.device != "cuda":
        return None
    return Software(torch_version=res.torch_version[:64], cuda_version=(
        res.cuda_version or "")[:32] or None, driver_version=(res.driver_version or "")[:32]
        or None)


@get("/v1/gpus", tags=["catalog"], summary="List the GPU catalog")
async def list_gpus() -> list[GPU]:
    return list(gpus().values())


@get("/v1/gpus/{gpu_id:str}", tags=["catalog"], summary="One GPU", responses={404: _PROBLEMS[404]})
async def get_gpu(gpu_id: FromPath[str]) -> GPU:
    return gpu(gpu_id)


@get("/v1/models", tags=["catalog"], summary="List the model presets")
async def list_models() -> list[ModelSummary]:
    return [_summary(i) for i in presets()]


@get("/v1/models/{model_id:str}", tags=["catalog"], summary="One model preset",
     responses={404: _PROBLEMS[404]})
async def get_model(model_id: FromPath[str]) -> ModelDetail:
    return ModelDetail(summary=_summary(model_id), preset=preset(model_id))


@get("/healthz", tags=["ops"], summary="Liveness")
async def healthz() -> Health:
    return Health(status="ok")


@get("/readyz", tags=["ops"], summary="Readiness: catalogs loaded")
async def readyz() -> Response[Ready]:
    n_gpus, n_models = len(gpus()), len(presets())
    ok = n_gpus > 0 and n_models > 0
    return Response(Ready(status="ready" if ok else "not ready", num_gpus=n_gpus,
                          num_models=n_models), status_code=200 if ok else 503)


def create_app(settings: Settings | None = None) -> Litestar:
    settings = settings or Settings()
    prometheus = PrometheusConfig(app_name="vrambudget", prefix="vrambudget",
                                  group_path=True, exclude=["/metrics"])
    app = Litestar(
        route_handlers=[create_budget, create_fit, create_comparison, list_gpus, get_gpu,
                        list_models, get_model, healthz, readyz, PrometheusController],
        middleware=[prometheus.middleware],
        exception_handlers=exception_handlers,
        request_max_body_size=settings.max_body_bytes,
        openapi_config=OpenAPIConfig(
            title="vrambudget calculation service",
            version=VERSION,
            description="Will this GPU workload fit, and where does every byte go? "
                        "All quantities are integer bytes.",
            contact=Contact(name="vrambudget"),
            servers=[Server(url="/")],
            path="/schema",
            render_plugins=[ScalarRenderPlugin()],
        ),
        on_startup=[patch_openapi, _open_trace_pool],
        on_shutdown=[_close_trace_pool],
        debug=False,
    )
    app.state.profiles = profiles_from(settings.profiles_dir)
    app.state.answers = AnswerCache(_ANSWER_ENTRIES)
    # Workers start on the first trace request, not here (see service/api/tracing.py); they
    # load the same calibration profiles.
    app.state.trace_pool = TracePool(
        entry=settings.trace_entry, workers=settings.trace_workers,
        time_limit_s=settings.trace_time_limit_s, max_pending=settings.trace_max_pending,
        cache=AnswerCache(settings.trace_cache_entries),
        env={PROFILES_ENV: settings.profiles_dir} if settings.profiles_dir else {})
    return app


def _open_trace_pool(app: Litestar) -> None:
    app.state.trace_pool.open()


async def _close_trace_pool(app: Litestar) -> None:
    await app.state.trace_pool.close()

