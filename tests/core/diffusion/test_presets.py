"""The pipeline presets: every component's closed-form parameter count equals the published
count the preset cites, the weights of each preset are exact to the byte against a hand count,
and every source can be opened and quotes the fact."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import pytest

from tests.support.sources import openable, wording_hits
from vrambudget.core.diffusion.configs import read_config
from vrambudget.core.diffusion.counts import component_inventory, decoder_params
from vrambudget.core.diffusion.pipeline import CLASSES, resolve_pipeline
from vrambudget.core.diffusion.presets import PIPELINE_IDS, presets
from vrambudget.core.spec.diffusion import ImageGenerationWorkload, PresetPipeline

COMPONENTS = [
    (p.id, role, dict(CLASSES[p.class_name])[role])
    for p in presets().values()
    for role in p.components
]


@pytest.mark.parametrize(
    ("preset", "role", "cls"), COMPONENTS, ids=[f"{p}:{r}" for p, r, _ in COMPONENTS]
)
def test_closed_form_count_equals_the_published_count(preset: str, role: str, cls: str) -> None:
    component = presets()[preset].components[role]
    inv = component_inventory(cls, read_config(cls, component.config, role), role)
    assert component.checkpoint.num_params is not None
    assert inv.num_params == component.checkpoint.num_params


def test_published_counts_are_the_known_totals() -> None:
    """The totals the brief and the sources quote, by hand."""
    p = presets()
    assert p["sd-1.5"].components["unet"].checkpoint.num_params == 859_520_964
    assert p["sdxl-base-1.0"].components["unet"].checkpoint.num_params == 2_567_463_684
    assert p["sd-1.5"].components["vae"].checkpoint.num_params == 83_653_863
    assert p["sd3-medium"].components["transformer"].checkpoint.num_params == 2_028_328_000
    assert p["flux.1-dev"].components["transformer"].checkpoint.num_params == 11_901_408_320
    # schnell has no guidance embedder: 2 x (256 x 3072 + 3072 + 3072 x 3072 + 3072) fewer
    guidance = 256 * 3072 + 3072 + 3072 * 3072 + 3072
    assert guidance == 10_229_760
    assert p["flux.1-schnell"].components["transformer"].checkpoint.num_params == (
        11_901_408_320 - guidance
    )


def test_the_sd3_vae_decoder_count_is_the_published_one() -> None:
    """AITune's printout of SD3-medium lists the decoder alone: 49,545,475 parameters."""
    c = presets()["sd3-medium"].components["vae"]
    inv = component_inventory("AutoencoderKL", read_config("AutoencoderKL", c.config, "vae"), "vae")
    assert decoder_params(inv) == 49_545_475


def _weights(preset: str, precision: str | None = None) -> int:
    w = ImageGenerationWorkload(pipeline=PresetPipeline(id=preset), precision=precision)  # type: ignore[arg-type]
    p = resolve_pipeline(w)
    return sum(c.inventory.weight_bytes(p.dtype) for c in p.components)


POSITION_IDS = 77 * 8  # CLIP's int64 position_ids buffer (not persistent, on the device)


def test_weights_to_the_byte() -> None:
    assert _weights("sd-1.5") == (859_520_964 + 83_653_863 + 123_060_480) * 2 + POSITION_IDS
    assert _weights("sd-1.5") == 2_132_471_230
    assert _weights("sd-1.5", "fp32") == (859_520_964 + 83_653_863 + 123_060_480) * 4 + 616
    assert (
        _weights("sdxl-base-1.0")
        == (2_567_463_684 + 83_653_863 + 123_060_480 + 694_659_840) * 2 + 2 * POSITION_IDS
    )
    # SD3 in fp16: transformers keeps T5's 24 wo projections (24 x 10,240 x 4,096) in fp32;
    # the transformer's persistent pos_embed (192^2 x 1536) is cast with the weights.
    wo = 24 * 10_240 * 4_096
    assert wo == 1_006_632_960
    t5 = (4_762_310_656 - wo) * 2 + wo * 4
    assert _weights("sd3-medium") == (
        (2_028_328_000 + 192 * 192 * 1536) * 2
        + 83_819_683 * 2
        + (123_650_304 + 694_659_840) * 2
        + 2 * POSITION_IDS
        + t5
    )
    # bf16 keeps nothing in fp32 (_keep_in_fp32_modules applies at fp16 only)
    assert (
        _weights("flux.1-schnell")
        == (11_891_178_560 + 83_819_683 + 123_060_480 + 4_762_310_656) * 2 + POSITION_IDS
    )
    assert (
        _weights("sd3-medium", "bf16")
        == (
            2_028_328_000
            + 192 * 192 * 1536
            + 83_819_683
            + 123_650_304
            + 694_659_840
            + 4_762_310_656
        )
        * 2
        + 2 * POSITION_IDS
    )


def test_preset_ids_are_the_data_file_ids() -> None:
    assert tuple(presets()) == PIPELINE_IDS
    assert set(PIPELINE_IDS) == {"sd-1.5", "sdxl-base-1.0", "sd3-medium", "flux.1-schnell",
                                 "flux.1-dev"}  # fmt: skip


SOURCES = [
    (p.id, role, field, source)
    for p in presets().values()
    for role, c in p.components.items()
    for field, source in (
        ("config_source", c.config_source),
        ("checkpoint.source", c.checkpoint.source),
    )
    if source is not None
]


@pytest.mark.parametrize(
    ("preset", "role", "field", "source"),
    SOURCES,
    ids=[f"{p}:{r}:{f}" for p, r, f, _ in SOURCES],
)
def test_sources_are_openable_and_quoted(preset: str, role: str, field: str, source: Any) -> None:
    assert openable(source), (preset, role, field)
    assert source.quote and source.quote.strip()


def test_every_denoiser_count_has_a_source() -> None:
    for p in presets().values():
        for role, c in p.components.items():
            if role in ("unet", "transformer"):
                assert c.checkpoint.source is not None, p.id


def test_no_private_ids_or_first_person_wording() -> None:
    raw = json.loads(resources.files("vrambudget.core.data").joinpath("pipelines.json").read_text())
    bad = [
        (e["id"], role, path, hits)
        for e in raw["presets"]
        for role, c in e["components"].items()
        for path, hits in wording_hits(c)
    ]
    assert not bad, bad
