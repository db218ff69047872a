"""The answer for image-generation workloads: the budget shape every workload answers with,
the offload modes' weights, the phases, host RAM and disk, and the refusals."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from vrambudget.core.components import Component
from vrambudget.core.diffusion.presets import presets
from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.estimate import estimate
from vrambudget.core.fit import fit
from vrambudget.core.result import Budget
from vrambudget.core.spec import BudgetRequest, FitRequest

C = Component


def _request(**workload: Any) -> BudgetRequest:
    body = {
        "workloads": [{"kind": "image_generation", **workload}],
        "device": {"source": "catalog", "id": "h100-sxm5-80gb"},
    }
    return msgspec.convert(body, BudgetRequest)


def _budget(**workload: Any) -> Budget:
    r = _request(**workload)
    return estimate(r.workloads, r.device, r.headroom)


def _lines(b: Budget) -> dict[Component, int]:
    return {line.component: line.bytes for line in b.devices[0].lines}


SD15 = {"pipeline": {"source": "preset", "id": "sd-1.5"}, "height": 512, "width": 512}
SDXL = {"pipeline": {"source": "preset", "id": "sdxl-base-1.0"}}


def test_the_answer_shape() -> None:
    b = _budget(**SD15)
    d = b.devices[0]
    assert [line.component for line in d.lines] == list(Component)
    assert [p.name for p in d.phases] == ["text_encode", "denoise", "vae_decode"]
    assert d.peak_phase == "vae_decode"
    lines = _lines(b)
    subtotal = sum(v for c, v in lines.items() if c is not C.HEADROOM)
    assert b.total_bytes == subtotal + lines[C.HEADROOM]
    assert max(p.total_bytes for p in d.phases) == b.total_bytes  # the peak phase's total
    assert b.workloads[0].kind == "image_generation"
    assert b.workloads[0].num_params == 859_520_964 + 83_653_863 + 123_060_480
    weights = next(line for line in d.lines if line.component is C.WEIGHTS)
    assert {p.name: p.bytes for p in weights.parts} == {
        "text_encoder": 123_060_480 * 2 + 616,
        "unet": 859_520_964 * 2,
        "vae": 83_653_863 * 2,
    }
    assert "diffusers" in weights.source


def test_lines_add_up_at_the_peak() -> None:
    """Weights, activations and the workspaces are the bytes live at the allocated peak; the
    allocator line is the replay's reserved peak minus them; the context is the device's."""
    lines = _lines(_budget(**SD15))
    assert lines[C.WEIGHTS] == 2_132_471_230
    # the decoder's 768 channels at 512^2, and three latent-sized tensors: the latents, their
    # scaled copy (latents / scaling_factor) and post_quant_conv's output
    assert lines[C.ACTIVATIONS] == 768 * 512 * 512 * 2 + 3 * 4 * 64 * 64 * 2
    # H100, torch 2.15: one cuBLAS workspace of 32 MiB, shared with cuBLASLt (torch >= 2.12)
    assert lines[C.RUNTIME_WORKSPACE] == 32 * 2**20
    # the H100's 534 MiB context and the 180,813,824 B of kernel images an inference loads
    assert lines[C.CUDA_CONTEXT] == 534 * 2**20 + 180_813_824
    assert lines[C.ALLOCATOR_OVERHEAD] > 0
    assert lines[C.KV_CACHE] == lines[C.GRADIENTS] == 0


def test_sdxl_decodes_in_fp32() -> None:
    """StableDiffusionXLPipeline upcasts the fp16 VAE (force_upcast): at the decode peak the VAE
    weights are fp32 and the decoder's 768 channels at 1024^2 are 4 bytes."""
    b = _budget(**SDXL)
    lines = _lines(b)
    weights = next(line for line in b.devices[0].lines if line.component is C.WEIGHTS)
    assert {p.name: p.bytes for p in weights.parts}["vae"] == 83_653_863 * 4
    assert lines[C.ACTIVATIONS] >= 768 * 1024 * 1024 * 4


def test_model_offload_keeps_one_component() -> None:
    """enable_model_cpu_offload: at the denoise peak only the UNet; the decode then holds only
    the VAE."""
    b = _budget(**SD15, cpu_offload="model")
    weights = next(line for line in b.devices[0].lines if line.component is C.WEIGHTS)
    assert b.devices[0].peak_phase == "denoise"
    assert {p.name: p.bytes for p in weights.parts} == {"unet": 859_520_964 * 2}
    assert b.total_bytes < _budget(**SD15).total_bytes


def test_sd3_model_offload_peaks_while_encoding() -> None:
    """SD3: T5 XXL (9.5 GB at fp16, its wo in fp32) is the largest component, and it stays on the
    GPU while the negative prompt is encoded by the CLIP towers again (each component offloads
    only its predecessor): the peak is text encoding, with T5 and CLIP-G resident."""
    b = _budget(pipeline={"source": "preset", "id": "sd3-medium"}, cpu_offload="model")
    weights = next(line for line in b.devices[0].lines if line.component is C.WEIGHTS)
    assert b.devices[0].peak_phase == "text_encode"
    parts = {p.name: p.bytes for p in weights.parts}
    assert set(parts) == {"text_encoder_2", "text_encoder_3"}


def test_sequential_offload_holds_the_largest_module() -> None:
    b = _budget(**SD15, cpu_offload="sequential")
    assert _lines(b)[C.WEIGHTS] < 100 * 2**20
    assert b.total_bytes < _budget(**SD15, cpu_offload="model").total_bytes


def test_guidance_doubles_the_unet_batch() -> None:
    small = {**SD15, "height": 256, "width": 256, "batch_size": 8}
    on = _budget(**small)
    off = _budget(**small, guidance=False)
    denoise_on = next(p.total_bytes for p in on.devices[0].phases if p.name == "denoise")
    denoise_off = next(p.total_bytes for p in off.devices[0].phases if p.name == "denoise")
    assert denoise_on > denoise_off


def test_vae_tiling_only_above_one_tile() -> None:
    """SDXL's VAE tiles latents above 128 (sample_size 1024): at 1024 px tiling changes nothing;
    at 2048 px it bounds the decode."""
    assert _budget(**SDXL, vae_tiling=True).total_bytes == _budget(**SDXL).total_bytes
    big = {**SDXL, "height": 2048, "width": 2048}
    assert _budget(**big, vae_tiling=True).total_bytes < _budget(**big).total_bytes / 2


def test_host_and_disk() -> None:
    b = _budget(**SD15, cpu_offload="model")
    weights = 2_132_471_230
    assert any(i.bytes == weights for i in b.host_ram.items)
    assert b.disk.total_bytes == (859_520_964 + 83_653_863 + 123_060_480) * 2


def test_instances_multiply() -> None:
    one, two = _lines(_budget(**SD15)), _lines(_budget(**SD15, instances=2))
    for c in (C.WEIGHTS, C.ACTIVATIONS, C.CUDA_CONTEXT, C.RUNTIME_WORKSPACE):
        assert two[c] == 2 * one[c]


def test_components_source() -> None:
    """A pipeline given by its class and configs answers like the preset with those configs."""
    comps = {r: c.config for r, c in presets()["sd-1.5"].components.items()}
    b = _budget(
        pipeline={"source": "components", "class_name": "StableDiffusionPipeline",
                  "components": comps},
        height=512, width=512,
    )  # fmt: skip
    assert b.total_bytes == _budget(**SD15).total_bytes


@pytest.mark.parametrize(
    ("workload", "field"),
    [
        ({**SD15, "num_frames": 8}, "workloads[0].num_frames"),
        ({"pipeline": {"source": "preset", "id": "flux.1-dev"}, "height": 1000},
         "workloads[0].height"),
        ({**SD15, "max_sequence_length": 128}, "workloads[0].max_sequence_length"),
        (
            {"pipeline": {"source": "components", "class_name": "StableDiffusionPipeline",
                          "components": {"unet": {}}}},
            "workloads[0].pipeline.components",
        ),
        (
            {"pipeline": {"source": "components", "class_name": "StableDiffusionPipeline",
                          "components": {"unet": {"block_out_channels": [320, 640]},
                                         "vae": {}, "text_encoder": {}}}},
            "workloads[0].pipeline.components.unet.block_out_channels",
        ),
        (
            {"pipeline": {"source": "components", "class_name": "StableDiffusionPipeline",
                          "components": {"unet": {"_class_name": "AutoencoderKL"}, "vae": {},
                                         "text_encoder": {}}}},
            "workloads[0].pipeline.components.unet",
        ),
    ],
)  # fmt: skip
def test_refusals_name_the_field(workload: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidWorkload) as e:
        _budget(**workload)
    assert e.value.field == field


def test_wire_ranges() -> None:
    for bad in ({**SD15, "height": 500}, {**SD15, "height": 32}, {**SD15, "batch_size": 0}):
        with pytest.raises(msgspec.ValidationError):
            _request(**bad)


def test_mixed_with_other_kinds_or_fitted_is_refused() -> None:
    body = {
        "workloads": [
            {"kind": "image_generation", **SD15},
            {"kind": "generic", "assets": [{"name": "x", "bytes": 1}]},
        ]
    }
    r = msgspec.convert(body, BudgetRequest)
    with pytest.raises(InvalidWorkload):
        estimate(r.workloads)
    f = msgspec.convert({"workloads": [{"kind": "image_generation", **SD15}]}, FitRequest)
    with pytest.raises(InvalidWorkload):
        fit(f)


def test_co_located_image_workloads_add_up() -> None:
    r = msgspec.convert(
        {"workloads": [{"kind": "image_generation", **SD15}, {"kind": "image_generation", **SD15}]},
        BudgetRequest,
    )
    both = _lines(estimate(r.workloads))
    one = _lines(estimate(r.workloads[:1]))
    assert both[C.WEIGHTS] == 2 * one[C.WEIGHTS]


def _sd3_patched(patch: int, **workload: Any) -> Budget:
    comps = {r: dict(c.config) for r, c in presets()["sd3-medium"].components.items()}
    comps["transformer"]["patch_size"] = patch
    pipeline = {"source": "components", "class_name": "StableDiffusion3Pipeline",
                "components": comps}  # fmt: skip
    return _budget(pipeline=pipeline, **workload)


def test_denoiser_tokens_follow_the_sd3_patch_size() -> None:
    """SD3 at 1024 x 1024: 128 x 128 latents; patch 2 (the published config): 64 x 64 = 4,096
    patches + 77 CLIP + 256 T5 = 4,429 tokens; patch 4: 32 x 32 = 1,024 + 333 = 1,357 (the
    answer said 4,429 with a hard-coded patch of 2 while the walk used 4)."""
    sd3 = _budget(pipeline={"source": "preset", "id": "sd3-medium"})
    assert sd3.devices[0].inputs["denoiser_tokens"] == 4_429
    assert _sd3_patched(4).devices[0].inputs["denoiser_tokens"] == 1_357
    flux = _budget(pipeline={"source": "preset", "id": "flux.1-schnell"})
    assert flux.devices[0].inputs["denoiser_tokens"] == 64 * 64 + 512


def test_a_side_must_be_whole_patches_of_the_sd3_patch_size() -> None:
    """VAE factor 8 x patch 4 = 32: 1040 px (65 latents, not whole patches of 4) is refused;
    the hard-coded patch of 2 let it through (a multiple of 16)."""
    with pytest.raises(InvalidWorkload) as e:
        _sd3_patched(4, height=1040)
    assert e.value.field == "workloads[0].height"
    assert "multiple of 32" in e.value.message
    _sd3_patched(2, height=1040)  # 16 | 1040
