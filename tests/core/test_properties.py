"""Properties of the analytic tier (hypothesis): monotonicity, parallelism never adds weights
per device, and solved maxima are tight."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.workloads import workload
from vrambudget.core.budget.analytic import device_totals
from vrambudget.core.components import Component
from vrambudget.core.deployed import deploy
from vrambudget.core.device import resolve_device
from vrambudget.core.estimate import estimate
from vrambudget.core.fit import FitRequest, fit
from vrambudget.core.search import max_fitting
from vrambudget.core.spec import CustomDevice, Headroom

MODELS = [
    "llama-3.1-8b",
    "mistral-7b-v0.1",
    "qwen2.5-0.5b",
    "gemma-2-2b",
    "mixtral-8x7b",
    "deepseek-v2-lite",
    "gpt2",
    "qwen3-30b-a3b",
    "phi-3-mini-4k",
]

PROFILE = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def total(w):
    return estimate((w,)).total_bytes


@PROFILE
@given(
    model=st.sampled_from(MODELS),
    batch=st.integers(1, 64),
    prompt=st.integers(1, 8192),
    gen=st.integers(0, 2048),
    conc=st.integers(1, 16),
    attention=st.sampled_from(["sdpa", "eager"]),
    logits=st.sampled_from(["last", "all"]),
)
def test_inference_grows_with_batch_context_and_concurrency(
    model, batch, prompt, gen, conc, attention, logits
):
    def w(**changes):
        fields = dict(
            kind="inference",
            model={"source": "preset", "id": model},
            batch_size=batch,
            prompt_tokens=prompt,
            generated_tokens=gen,
            concurrent_requests=conc,
            attention=attention,
            logits=logits,
        )
        fields.update(changes)
        return workload(**fields)

    base = total(w())
    assert total(w(batch_size=batch + 1)) >= base
    assert total(w(prompt_tokens=prompt + 1)) >= base
    assert total(w(generated_tokens=gen + 1)) >= base
    assert total(w(concurrent_requests=conc + 1)) >= base


@PROFILE
@given(
    model=st.sampled_from(MODELS),
    batch=st.integers(1, 8),
    seq=st.integers(1, 4096),
    ckpt=st.sampled_from(["none", "selective", "full", "offloaded"]),
    method=st.sampled_from([{"kind": "full"}, {"kind": "lora"}, {"kind": "qlora"}]),
)
def test_training_grows_with_batch_and_sequence(model, batch, seq, ckpt, method):
    def w(**changes):
        fields = dict(
            kind="training",
            model={"source": "preset", "id": model},
            micro_batch_size=batch,
            sequence_length=seq,
            checkpointing=ckpt,
            method=method,
        )
        fields.update(changes)
        return workload(**fields)

    base = total(w())
    assert total(w(micro_batch_size=batch + 1)) >= base
    assert total(w(sequence_length=seq + 1)) >= base


@PROFILE
@given(
    model=st.sampled_from(MODELS),
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.sampled_from([1, 2, 3, 4]),
    quant=st.sampled_from([None, "gptq", "bnb_4bit", "fp8"]),
)
def test_parallelism_never_increases_weights_per_device(model, tp, pp, quant):
    precision = {"quantization": {"scheme": quant}} if quant else {}

    def weights(t, p):
        w = workload(
            kind="inference",
            model={"source": "preset", "id": model},
            precision=precision,
            parallelism={"tensor": t, "pipeline": p},
        )
        try:
            budget = estimate((w,))
        except ValueError:  # layout not realisable for this model (heads, layers)
            return None
        return max(
            line.bytes
            for d in budget.devices
            for line in d.lines
            if line.component is Component.WEIGHTS
        )

    single = weights(1, 1)
    split = weights(tp, pp)
    if split is not None:
        assert split <= single


@PROFILE
@given(
    model=st.sampled_from(MODELS),
    capacity_gib=st.integers(8, 200),
    variable=st.sampled_from(["batch", "context", "concurrency"]),
)
def test_solved_maxima_are_tight(model, capacity_gib, variable):
    w = workload(
        kind="inference",
        model={"source": "preset", "id": model},
        prompt_tokens=512,
        generated_tokens=128,
    )
    capacity = capacity_gib * 2**30
    device = CustomDevice(name="probe", memory_total_bytes=capacity)
    req = FitRequest(workloads=(w,), devices=(device,), solve=(variable,))
    layout = fit(req).gpus[0].layouts[0]
    maxima = layout.maxima
    value = {
        "batch": maxima.batch_size,
        "concurrency": maxima.concurrent_requests,
        "context": maxima.context_tokens,
    }[variable]
    ctx = resolve_device(device)
    field = {
        "batch": "batch_size",
        "concurrency": "concurrent_requests",
        "context": "prompt_tokens",
    }[variable]

    def at(x):
        fields = dict(
            kind="inference",
            model={"source": "preset", "id": model},
            prompt_tokens=512,
            generated_tokens=128,
        )
        fields[field] = x
        return device_totals((deploy(workload(**fields)),), ctx, Headroom())

    x = value - 128 if variable == "context" and value else value
    if value == 0:
        assert at(1) > capacity
        return
    assert at(x) <= capacity
    if not maxima.context_limited_by_model:
        assert at(x + 1) > capacity


@settings(max_examples=200, deadline=None)
@given(
    a=st.integers(0, 10**6),
    b=st.integers(1, 10**4),
    c=st.integers(0, 50),
    cap=st.integers(0, 10**12),
    limit=st.integers(1, 10**9),
)
def test_max_fitting_on_monotone_polynomials(a, b, c, cap, limit):
    def f(x):
        return a + b * x + c * x * x

    got = max_fitting(f, cap, limit)
    if got == 0:
        assert f(1) > cap
    else:
        assert f(got) <= cap
        assert got == limit or f(got + 1) > cap


@PROFILE
@given(
    model=st.sampled_from(MODELS),
    batch=st.integers(1, 64),
    prompt=st.integers(1, 8192),
    gen=st.integers(0, 2048),
    tp=st.sampled_from([1, 2, 4]),
    pp=st.sampled_from([1, 2]),
    attention=st.sampled_from(["sdpa", "eager"]),
    logits=st.sampled_from(["last", "all"]),
    instances=st.integers(1, 3),
)
def test_solver_objective_equals_the_explained_budget(
    model, batch, prompt, gen, tp, pp, attention, logits, instances
):
    """The fit solver's numeric fast path and the explained budget are the same number."""
    w = workload(
        kind="inference",
        model={"source": "preset", "id": model},
        batch_size=batch,
        prompt_tokens=prompt,
        generated_tokens=gen,
        attention=attention,
        logits=logits,
        instances=instances,
        parallelism={"tensor": tp, "pipeline": pp},
    )
    try:
        budget = estimate((w,))
    except ValueError:
        return
    assert device_totals((deploy(w),), None, Headroom()) == budget.total_bytes


@PROFILE
@given(
    model=st.sampled_from(MODELS),
    batch=st.integers(1, 16),
    prompt=st.integers(1, 6000),
    chunk=st.integers(1, 16384),
    conc=st.integers(1, 4),
    attention=st.sampled_from(["sdpa", "eager"]),
    logits=st.sampled_from(["last", "all"]),
)
def test_chunked_prefill_grows_with_prompt_batch_and_concurrency(
    model, batch, prompt, chunk, conc, attention, logits
):
    def w(**changes):
        fields = dict(
            kind="inference",
            model={"source": "preset", "id": model},
            batch_size=batch,
            prompt_tokens=prompt,
            generated_tokens=0,
            concurrent_requests=conc,
            attention=attention,
            logits=logits,
            prefill_chunk_tokens=chunk,
        )
        fields.update(changes)
        return workload(**fields)

    base = total(w())
    assert total(w(prompt_tokens=prompt + 1)) >= base
    assert total(w(batch_size=batch + 1)) >= base
    assert total(w(concurrent_requests=conc + 1)) >= base


@PROFILE
@given(
    model=st.sampled_from(MODELS),
    kind=st.sampled_from(["inference", "training"]),
    instances=st.integers(1, 3),
    tp=st.sampled_from([1, 2]),
    dp=st.sampled_from([1, 2]),
    ckpt=st.sampled_from(["none", "selective", "full", "offloaded"]),
    zero=st.sampled_from([0, 1, 3]),
)
def test_parts_add_up_to_their_line(model, kind, instances, tp, dp, ckpt, zero):
    fields = dict(
        kind=kind,
        model={"source": "preset", "id": model},
        instances=instances,
        parallelism={"tensor": tp, "data": dp, "zero_stage": zero},
    )
    if kind == "training":
        fields.update(checkpointing=ckpt, sequence_length=512)
    try:
        budget = estimate((workload(**fields),))
    except ValueError:
        return
    _assert_parts_add_up(budget)


@PROFILE
@given(
    model=st.sampled_from(MODELS),
    software=st.sampled_from(
        [
            None,
            {"framework": "litgpt", "framework_version": "0.5.10"},
            {"framework": "litgpt"},
            {"framework": "torchtune", "torch_compile": True},
            {"framework": "transformers", "libraries": {"deepspeed": "0.16.0"}},
            {"framework": "transformers", "libraries": {"trl": "0.22.0"}},
            {"framework": "transformers", "framework_version": "4.45.2", "loop_holds_output": True},
            {
                "framework": "fsdp",
                "libraries": {"transformers": "4.47.0"},
                "loop_holds_output": True,
            },
            {"framework": "deepspeed", "libraries": {"liger_kernel": "0.8.0"}},
            {"framework": "transformers", "libraries": {"liger_kernel": "0.3.0"}},
        ]
    ),
    method=st.sampled_from(["full", "lora", "qlora"]),
    mixed=st.sampled_from(["autocast", "pure", "master_fp32"]),
    dp=st.sampled_from([1, 2]),
    zero=st.sampled_from([0, 1, 2, 3]),
    accumulation=st.sampled_from([1, 4]),
)
def test_training_parts_add_up_under_every_stack(
    model, software, method, mixed, dp, zero, accumulation
):
    """The stack-dependent gradients (no_sync, FSDP1 frozen gradients), loss and QLoRA layout
    keep every line equal to the sum of its parts, whichever phase is the peak."""
    import msgspec

    from vrambudget.core.spec import Software

    fields = dict(
        kind="training",
        model={"source": "preset", "id": model},
        method={"kind": method},
        mixed_precision=mixed,
        gradient_accumulation_steps=accumulation,
        sequence_length=512,
        parallelism={"data": dp, "zero_stage": zero},
    )
    try:
        w = workload(**fields)
        sw = msgspec.convert(software, Software) if software else None
        budget = estimate((w,), software=sw)
    except ValueError:
        return
    _assert_parts_add_up(budget)
    # The loss's bytes are itemized at whichever phase is the peak.
    for device in budget.devices:
        for line in device.lines:
            if line.component == "logits" and line.bytes:
                assert line.parts, device.peak_phase


def _assert_parts_add_up(budget) -> None:
    for device in budget.devices:
        for line in device.lines:
            if line.parts:
                assert sum(p.bytes for p in line.parts) == line.bytes, line.component


@PROFILE
@given(
    model=st.sampled_from(MODELS),
    capacity_gib=st.integers(8, 200),
    batch=st.integers(1, 3),
    conc=st.integers(1, 3),
)
def test_batch_and_concurrency_solved_together_are_each_tight(model, capacity_gib, batch, conc):
    """Solved in one request, batch and concurrency share their evaluations where the other
    factor is 1 (both walk the number of sequences): each maximum is the one its own
    objective gives, whatever the other factor."""
    fields = dict(
        kind="inference",
        model={"source": "preset", "id": model},
        prompt_tokens=512,
        generated_tokens=128,
        batch_size=batch,
        concurrent_requests=conc,
    )
    capacity = capacity_gib * 2**30
    device = CustomDevice(name="probe", memory_total_bytes=capacity)
    ctx = resolve_device(device)
    req = FitRequest(
        workloads=(workload(**fields),), devices=(device,), solve=("batch", "concurrency")
    )
    maxima = fit(req).gpus[0].layouts[0].maxima

    def at(field, x):
        return device_totals((deploy(workload(**{**fields, field: x})),), ctx, Headroom())

    for field, value in (
        ("batch_size", maxima.batch_size),
        ("concurrent_requests", maxima.concurrent_requests),
    ):
        if value == 0:
            assert at(field, 1) > capacity
        else:
            assert at(field, value) <= capacity < at(field, value + 1)


@PROFILE
@given(
    model=st.sampled_from(MODELS),
    batch=st.integers(1, 64),
    prompt=st.integers(1, 8192),
    gen=st.integers(0, 2048),
    conc=st.integers(1, 4),
    chunk=st.sampled_from([None, 256, 2048]),
    attention=st.sampled_from(["sdpa", "eager"]),
    logits=st.sampled_from(["last", "all"]),
)
def test_an_inference_budgets_inputs_are_the_ones_built_whole(
    model, batch, prompt, gen, conc, chunk, attention, logits
):
    """An inference budget's inputs, put together from the parts that do not scale (kept per
    request shape) and its own sequences and tokens, are the ones built whole, in the same
    order (the answer's JSON keeps it)."""
    from vrambudget.core.budget import inputs as inputs_module
    from vrambudget.core.overheads import DEFAULT_OVERHEADS
    from vrambudget.core.resolve import resolve_model

    w = deploy(
        workload(
            kind="inference",
            model={"source": "preset", "id": model},
            batch_size=batch,
            prompt_tokens=prompt,
            generated_tokens=gen,
            concurrent_requests=conc,
            prefill_chunk_tokens=chunk,
            attention=attention,
            logits=logits,
        )
    )
    arch = resolve_model(w.model)
    got = inputs_module.scaled_inputs(
        w, *inputs_module.inference_input_parts(w, arch, DEFAULT_OVERHEADS)
    )
    whole = inputs_module.inputs(w, arch, DEFAULT_OVERHEADS)
    assert list(got.items()) == list(whole.items())
