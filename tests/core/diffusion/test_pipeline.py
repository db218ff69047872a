"""The resolved pipeline: cached by what it depends on, checked per request, labelled per
request."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from vrambudget.core.diffusion.pipeline import resolve_pipeline
from vrambudget.core.diffusion.presets import presets
from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.spec.diffusion import ComponentsPipeline, ImageGenerationWorkload


def _w(**kw: Any) -> ImageGenerationWorkload:
    body = {"kind": "image_generation", "pipeline": {"source": "preset", "id": "sd3-medium"}}
    return msgspec.convert({**body, **kw}, ImageGenerationWorkload)


def test_one_build_serves_every_resolution_and_label() -> None:
    a = resolve_pipeline(_w(height=512, width=512))
    assert resolve_pipeline(_w(height=1024, width=768)) is a
    named = resolve_pipeline(_w(name="mine"))
    assert named.name == "mine" and a.name == "Stable Diffusion 3 Medium"
    assert named.components is a.components
    assert resolve_pipeline(_w(precision="fp32")) is not a


def test_the_resolution_is_checked_on_a_cached_pipeline() -> None:
    """SD3 needs multiples of 16 and at most 192 x 2 x 8 = 3072 px (its cropped pos_embed)."""
    resolve_pipeline(_w(height=1024, width=1024))
    with pytest.raises(InvalidWorkload) as e:
        resolve_pipeline(_w(height=1000), "workloads[3]")
    assert e.value.field == "workloads[3].height"
    with pytest.raises(InvalidWorkload) as e:
        resolve_pipeline(_w(width=3088))
    assert e.value.field == "workloads[0].width"
    assert "at most 3072 px" in e.value.message


def test_a_components_pipeline_hashes_by_class_and_configs() -> None:
    comps = {r: c.config for r, c in presets()["sd-1.5"].components.items()}
    a = ComponentsPipeline(class_name="StableDiffusionPipeline", components=comps)  # type: ignore[arg-type]
    b = ComponentsPipeline(
        class_name="StableDiffusionPipeline",
        components={k: dict(v) for k, v in reversed(comps.items())},  # type: ignore[arg-type]
    )
    assert a == b and hash(a) == hash(a) == hash(b)
    other = ComponentsPipeline(class_name="StableDiffusionXLPipeline", components=comps)  # type: ignore[arg-type]
    assert hash(other) != hash(a)
