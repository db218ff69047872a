"""Vision, seq2seq and speech-to-text workloads (issue 14 item 5): the analytic tier against
the trace of the framework's own code (transformers' ViT, T5 and Whisper, generate-style
decoding with an EncoderDecoderCache).

Tolerance: the device totals agree within 12%, and the analytic tier never answers below the
trace by more than 1% (it counts the conservative side: a whole encoder layer's working set
and the caches from the first decoder step on). Weights are exact (the framework's inventory).
Configs: the published checkpoints of research/data/published_checkpoints.json (cited there).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from vrambudget.core.components import Component
from vrambudget.core.estimate import estimate
from vrambudget.core.spec import BudgetRequest
from vrambudget.trace.engine import trace_budget
from vrambudget.trace.models import resolve_models

CORPUS = Path(__file__).resolve().parents[2] / "research" / "data" / "published_checkpoints.json"
L4 = {"source": "catalog", "id": "l4-24gb"}


def _config(repo_suffix: str) -> dict[str, Any]:
    entries = json.loads(CORPUS.read_text())["checkpoints"]
    return next(c["config"] for c in entries if c["repo_id"].endswith(repo_suffix))


def _request(workload: dict[str, Any]) -> BudgetRequest:
    req = msgspec.convert({"workloads": [workload], "device": L4}, BudgetRequest)
    return msgspec.structs.replace(req, workloads=resolve_models(req.workloads))


CASES = [
    (
        "whisper-tiny 8 x 30 s",
        lambda: {
            "kind": "speech_to_text",
            "model": {"source": "hf_config", "config": _config("whisper-tiny")},
            "batch_size": 8,
            "audio_seconds": 30,
            "generated_tokens": 224,
        },
    ),
    (
        "t5-small 8 x 512 -> 128",
        lambda: {
            "kind": "seq2seq",
            "model": {"source": "hf_config", "config": _config("t5-small")},
            "batch_size": 8,
            "input_tokens": 512,
            "generated_tokens": 128,
        },
    ),
    (
        "vit-base 64 images",
        lambda: {
            "kind": "vision",
            "model": {"source": "hf_config", "config": _config("vit-base-patch16-224-in21k")},
            "batch_size": 64,
        },
    ),
]


@pytest.mark.parametrize(("name", "make"), CASES, ids=[c[0] for c in CASES])
def test_analytic_total_is_the_framework_trace_within_tolerance(name: str, make: Any) -> None:
    req = _request(make())
    analytic = estimate(req.workloads, req.device, req.headroom)
    traced = trace_budget(msgspec.structs.replace(req, method="trace"))
    assert traced.trace is not None and traced.trace.code.startswith("framework: transformers")
    a = {line.component: line.bytes for line in analytic.devices[0].lines}
    t = {line.component: line.bytes for line in traced.devices[0].lines}
    assert a[Component.WEIGHTS] == t[Component.WEIGHTS]
    error = (traced.total_bytes - analytic.total_bytes) / analytic.total_bytes
    assert abs(error) <= 0.12, (name, error)
    assert error <= 0.01, f"{name}: the analytic tier is {error:+.1%} below the trace"


def test_speech_positions_follow_whispers_window() -> None:
    """65 s of audio: 3 windows of 30 s, each 3,000 log-mel frames halved by conv2's stride 2:
    1,500 encoder positions (WhisperFeatureExtractor chunk_length 30, hop 160 at 16 kHz)."""
    from vrambudget.core.budget.encoders import encoder_info, encoder_positions

    req = _request({**CASES[0][1](), "audio_seconds": 65, "batch_size": 2})
    w = req.workloads[0]
    assert encoder_positions(w, encoder_info(w, "w")) == (6, 1500)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("seconds", "windows"), [(0.5, 1), (30.0, 1), (30.0004, 2), (60.0, 2), (65.0, 3)]
)
def test_whisper_windows_round_up_to_30_seconds(seconds: float, windows: int) -> None:
    """The budget and the traced program read one count: any audio past a 30 s boundary (even
    a few samples at 16 kHz) opens another window."""
    req = _request({**CASES[0][1](), "audio_seconds": seconds})
    assert req.workloads[0].windows == windows  # type: ignore[union-attr]


def test_vision_positions_are_patches_and_the_class_token() -> None:
    """ViT-base/16 at 384 px: (384 / 16)^2 = 576 patches + 1 class token."""
    from vrambudget.core.budget.encoders import encoder_info, encoder_positions

    req = _request({**CASES[2][1](), "image_size": 384})
    w = req.workloads[0]
    assert encoder_positions(w, encoder_info(w, "w")) == (64, 577)  # type: ignore[arg-type]


def test_cross_attention_cache_by_hand() -> None:
    """t5-small decoding: cross-attention K+V = 8 sequences x 512 positions x (2 x 8 heads x 64
    x 6 layers) x 4 B (fp32 checkpoint) = 100,663,296 B; self-attention = 8 x 128 tokens x the
    same width x 4 B = 25,165,824 B: 125,829,120 B at the decode peak."""
    req = _request(CASES[1][1]())
    budget = estimate(req.workloads, req.device, req.headroom)
    device = budget.devices[0]
    assert device.peak_phase == "decode"
    kv = next(line.bytes for line in device.lines if line.component is Component.KV_CACHE)
    assert kv == 8 * 512 * (2 * 8 * 64 * 6) * 4 + 8 * 128 * (2 * 8 * 64 * 6) * 4


def test_a_text_decoder_is_refused_for_a_vision_workload() -> None:
    from vrambudget.core.errors import InvalidWorkload

    req = _request({"kind": "vision", "model": {"source": "hf_config", "config": _config("phi-2")}})
    with pytest.raises(InvalidWorkload, match="vision tower"):
        estimate(req.workloads, req.device, req.headroom)
