"""MIG instances as fit devices (vrambudget/core/mig.py): the catalog's MIG profiles are sourced
and plausible, their capacities follow the stated rule to the byte, and fits answer the smallest
profile a workload fits in, with its Kubernetes resource name."""

from __future__ import annotations

import msgspec
import pytest

from tests.support.sources import openable
from vrambudget.core.catalog import MIG_COMPUTE_SLICES, gpus
from vrambudget.core.fit import FitRequest, fit
from vrambudget.core.mig import MARKETING_CAPACITY_PPM, capacity, mig_devices, resource_name

GIB = 1 << 30

MIG_GPUS = {
    "a100-sxm4-40gb",
    "a100-sxm4-80gb",
    "a100-pcie-80gb",
    "h100-sxm5-80gb",
    "h100-pcie-80gb",
    "h100-nvl-94gb",
    "h20-96gb",
    "h200-sxm-141gb",
    "b200-180gb",
    "gb200-186gb",
}
"""The catalog GPUs the MIG User Guide's Supported GPUs table lists (A30 is not in the catalog;
the RTX PRO 6000 Blackwell Server Edition is, but its MIG instances are quarters of the GPU,
which the catalog's seven-slice profiles cannot express, so it has none)."""

PROFILES = [(g.id, p) for g in gpus().values() for p in g.mig_profiles]


def test_the_mig_capable_gpus_are_exactly_those_the_guide_lists():
    assert {g.id for g in gpus().values() if g.mig_profiles} == MIG_GPUS


@pytest.mark.parametrize(("gpu_id", "p"), PROFILES, ids=[f"{g}:{p.name}" for g, p in PROFILES])
def test_every_mig_profile_is_sourced_and_plausible(gpu_id, p):
    g = gpus()[gpu_id]
    assert openable(p.source) and p.source.quote and p.name in p.source.quote
    slices, _, memory = p.name.partition(".")
    assert slices == f"{p.compute_slices}g" and memory.endswith("gb")
    assert p.memory_fraction in ("1/8", "2/8", "4/8", "Full")
    assert 1 <= p.max_instances <= MIG_COMPUTE_SLICES // p.compute_slices
    assert p.memory_marketing == f"{memory.removesuffix('gb')} GB"
    if p.memory_gib_2dp is not None:
        assert p.memory_source is not None and openable(p.memory_source)
        assert p.memory_source.quote and p.memory_gib_2dp in p.memory_source.quote
    else:
        assert p.memory_source is None
    # The instance's memory, before capacity() caps it at the GPU's: never more than the GPU.
    gb = int(memory.removesuffix("gb"))
    if p.memory_gib_2dp is not None:
        whole, frac = p.memory_gib_2dp.split(".")
        raw = (2 * (int(whole) * 100 + int(frac)) - 1) * GIB // 200
    else:
        raw = gb * 850_000_000
    assert 0 < raw <= g.memory_total_bytes
    assert capacity(g, p)[0] == raw
    # A profile is named after its memory: the listed size is within 15% of the name's GB.
    assert p.memory_gib_2dp is None or 0.85 * gb * 1e9 <= raw <= 1.15 * gb * 1e9


def test_the_marketing_rule_is_below_every_listed_profile():
    """0.85 x the name's GB never exceeds a published listing's size (lowest ratio 0.895)."""
    listed = [(gpus()[g], p) for g, p in PROFILES if p.memory_gib_2dp is not None]
    assert len(listed) >= 13
    for g, p in listed:
        gb = int(p.name.split(".")[1].removesuffix("gb"))
        assert gb * 10**9 * MARKETING_CAPACITY_PPM // 10**6 <= capacity(g, p)[0], (g.id, p.name)


def test_capacity_rules_to_the_byte():
    h200 = gpus()["h200-sxm-141gb"]
    one = next(p for p in h200.mig_profiles if p.name == "1g.18gb")
    # nvidia-smi prints 16.00 GiB; the size is at least 15.995 GiB = 3199 x 2^30 / 200.
    assert capacity(h200, one) == (17_174_500_474, "nvidia_smi")
    assert 3199 * GIB // 200 == 17_174_500_474
    nvl = gpus()["h100-nvl-94gb"]
    three = next(p for p in nvl.mig_profiles if p.name == "3g.47gb")
    assert capacity(nvl, three) == ((2 * 4638 - 1) * GIB // 200, "nvidia_smi")
    a100 = gpus()["a100-sxm4-80gb"]
    three = next(p for p in a100.mig_profiles if p.name == "3g.40gb")
    assert capacity(a100, three) == (34_000_000_000, "marketing")
    assert resource_name(three) == "nvidia.com/mig-3g.40gb"


def test_profiles_are_tried_smallest_first_and_ties_prefer_more_instances():
    names = [d.profile.name for d in mig_devices("a100-sxm4-80gb")]
    assert names == ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    assert mig_devices("l40s-48gb") == () and mig_devices(None) == ()


def _fit(workload: dict[str, object], *devices: dict[str, object], counts=(1,)) -> object:
    body = {"workloads": [workload], "devices": list(devices), "device_counts": list(counts)}
    return fit(msgspec.convert(body, FitRequest))


def _catalog(gpu_id: str) -> dict[str, str]:
    return {"source": "catalog", "id": gpu_id}


MISTRAL_16K = {
    "kind": "inference",
    "model": {"source": "preset", "id": "mistral-7b-v0.3"},
    "batch_size": 1,
    "prompt_tokens": 16383,
    "generated_tokens": 1,
}


def test_a_7b_bf16_inference_takes_3g_40gb_not_2g_20gb_on_an_a100_80gb():
    g = _fit(MISTRAL_16K, _catalog("a100-sxm4-80gb"), _catalog("l40s-48gb")).gpus  # type: ignore[attr-defined]
    a100, l40s = g
    m = a100.mig
    assert m is not None and l40s.mig is None  # L40S has no MIG
    # By hand, a floor under the one-instance total: bf16 weights 7,248,023,552 x 2 B, the
    # KV cache 32 layers x 8 KV heads x 128 x (K, V) x 2 B = 131,072 B per token x 16,384
    # tokens, the 426 MiB CUDA context (compute capability 8.0): already over the
    # 2g.20gb / 1g.20gb capacity 0.85 x 20 GB = 17,000,000,000 B.
    floor = 7_248_023_552 * 2 + 131_072 * 16_384 + 426 * 2**20
    assert floor == 17_090_224_128 > 17_000_000_000
    assert m.total_bytes >= floor
    assert (m.profile, m.resource_name, m.mig_instance_of) == (
        "3g.40gb",
        "nvidia.com/mig-3g.40gb",
        "a100-sxm4-80gb",
    )
    assert (m.instances_per_gpu, m.compute_slices, m.memory_fraction) == (2, 3, "4/8")
    assert (m.capacity_bytes, m.capacity_basis) == (34_000_000_000, "marketing")
    assert m.fits and m.total_bytes == a100.layouts[0].total_bytes  # the one-device budget
    assert m.free_bytes == 34_000_000_000 - m.total_bytes
    assert any("no tensor parallelism across instances" in a for a in m.assumptions)


def test_a_listed_profile_is_chosen_with_its_listed_capacity():
    small = {**MISTRAL_16K, "model": {"source": "preset", "id": "qwen2.5-0.5b"}}
    m = _fit(small, _catalog("h200-sxm-141gb")).gpus[0].mig  # type: ignore[attr-defined]
    assert (m.profile, m.capacity_bytes, m.capacity_basis) == (
        "1g.18gb",
        17_174_500_474,
        "nvidia_smi",
    )
    assert (m.resource_name, m.instances_per_gpu) == ("nvidia.com/mig-1g.18gb", 7)


def test_when_no_profile_fits_the_largest_is_shown_not_fitting():
    big = {**MISTRAL_16K, "model": {"source": "preset", "id": "llama-3.1-70b"}}
    m = _fit(big, _catalog("a100-sxm4-40gb")).gpus[0].mig  # type: ignore[attr-defined]
    assert (m.profile, m.fits, m.verdict) == ("7g.40gb", False, "does_not_fit")
    assert m.free_bytes < 0


def test_custom_devices_and_non_mig_gpus_have_no_mig_answer():
    custom = {"source": "custom", "name": "x", "memory_total_bytes": 80 * 10**9}
    gs = _fit(MISTRAL_16K, custom, _catalog("rtx-4090-24gb")).gpus  # type: ignore[attr-defined]
    assert [g.mig for g in gs] == [None, None]


def test_vllm_takes_the_smallest_profile_it_starts_in():
    """The chosen profile starts; the next smaller one does not. Checked with the full-GPU path
    on custom devices of those capacities (vLLM's account reads only the total and the name)."""
    w = {
        "kind": "llm_serving",
        "model": {"source": "preset", "id": "qwen2.5-7b"},
        "max_model_len": 8192,
    }
    m = _fit(w, _catalog("h100-sxm5-80gb")).gpus[0].mig  # type: ignore[attr-defined]
    devices = mig_devices("h100-sxm5-80gb")
    chosen = next(i for i, d in enumerate(devices) if d.profile.name == m.profile)
    assert m.fits and chosen > 0
    for d, fits in ((devices[chosen], True), (devices[chosen - 1], False)):
        custom = {"source": "custom", "name": d.name, "memory_total_bytes": d.capacity_bytes}
        assert _fit(w, custom).gpus[0].layouts[0].fits is fits  # type: ignore[attr-defined]


def test_llama_cpp_gets_a_mig_instance_that_holds_every_layer():
    w = {
        "kind": "llm_serving",
        "engine": "llama_cpp",
        "model": {"source": "preset", "id": "llama-3.1-8b"},
        "gguf": {"n_ctx": 8192},
    }
    m = _fit(w, _catalog("a100-sxm4-40gb")).gpus[0].mig  # type: ignore[attr-defined]
    assert m.fits and 0 < m.total_bytes <= m.capacity_bytes
    assert m.resource_name == f"nvidia.com/mig-{m.profile}"


def test_a_training_layout_over_several_gpus_gets_no_mig_answer():
    w = {
        "kind": "training",
        "model": {"source": "preset", "id": "qwen2.5-0.5b"},
        "micro_batch_size": 1,
        "sequence_length": 512,
        "parallelism": {"tensor": 2},
    }
    g = _fit(w, _catalog("a100-sxm4-80gb"), counts=(2,)).gpus[0]  # type: ignore[attr-defined]
    assert g.mig is None and g.layouts[0].device_count == 2
