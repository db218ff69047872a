"""The output-quality check of a probe (vrambudget/agent/probe_quality.py, quality.py): a real
CPU probe of a tiny Llama with an fp32 reference against bf16 and nf4, the thresholds, the
failure policy, the host's own evaluation file, and what is refused at submission (422)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec
import pytest
from litestar.testing import TestClient

from vrambudget.agent.child import ChildSettings
from vrambudget.agent.quality import eval_file
from vrambudget.core.probe_report import ProbeRequest, ProbeResult

LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 512,
}
NF4 = {"weights": "bf16", "quantization": {"scheme": "bnb_4bit", "quant_type": "nf4"}}


def _request(quality: dict[str, Any], config: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "workload": {
            "kind": "inference",
            "model": {"source": "hf_config", "config": config or LLAMA},
            "prompt_tokens": 8,
            "generated_tokens": 1,
            "precision": {"weights": "fp32", "compute": "fp32"},
        },
        "warmup_iterations": 0,
        "iterations": 1,
        "quality": quality,
    }


def _quality(**fields: Any) -> dict[str, Any]:
    return {
        "reference": {"weights": "fp32", "compute": "fp32"},
        "candidates": [
            {"label": "bf16", "precision": {"weights": "bf16"}},
            {"label": "nf4", "precision": NF4},
        ],
        "max_sequences": 6,
        "sequence_tokens": 128,
        **fields,
    }


def test_a_real_probe_child_reports_bf16_passing_and_nf4_further_off() -> None:
    """Through the spawned child, as the agent runs it: the measurement and then the check."""
    from vrambudget.agent.runner import ProbeProcess

    req = msgspec.convert(_request(_quality()), ProbeRequest)
    process = ProbeProcess(msgspec.json.encode(req), ChildSettings(), 300)
    process.start()
    out = process.wait()
    assert out.status == "succeeded", out.error
    assert out.result_json is not None
    result = msgspec.json.decode(out.result_json, type=ProbeResult)
    assert result.torch is not None and result.torch.allocated_peak_bytes > 0
    q = result.quality
    assert q is not None
    assert q.weights == "synthetic" and q.eval_set == "builtin" and q.sequences == 6
    assert q.tokens == 6 * 127  # every shipped passage is longer than 128 bytes
    bf16, nf4 = q.candidates
    assert bf16.label == "bf16" and bf16.passed and bf16.reasons == ()
    assert bf16.token_agreement >= 0.9 and bf16.mean_kl < 1e-4
    assert bf16.emulated is None
    assert nf4.mean_kl > bf16.mean_kl and nf4.p99_kl > bf16.p99_kl
    assert nf4.emulated is not None and nf4.emulated.startswith("nf4 quantize -> dequantize")


def test_a_missed_threshold_is_a_result_and_a_failed_evaluation_fails_the_probe() -> None:
    from vrambudget.agent.probe import measure

    req = msgspec.convert(_request(_quality(max_mean_kl=0.0, max_sequences=2)), ProbeRequest)
    out = measure(req, ChildSettings())
    assert out.status == "succeeded" and out.result is not None
    q = out.result.quality
    assert q is not None and not q.passed
    for c in q.candidates:
        assert not c.passed
        assert c.reasons[0].startswith("mean KL ") and "over max_mean_kl 0" in c.reasons[0]

    # GPT-2 has one fused c_attn: no k_proj / v_proj to round a KV cache at
    gpt2 = {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "n_embd": 32,
        "n_layer": 1,
        "n_head": 2,
        "vocab_size": 128,
        "n_positions": 64,
    }
    kv = _quality(
        candidates=[{"label": "kv", "precision": {"weights": "fp32", "kv_cache": "fp8_e4m3"}}]
    )
    out = measure(msgspec.convert(_request(kv, gpt2), ProbeRequest), ChildSettings())
    assert out.status == "failed"
    assert out.result is not None and out.result.torch is not None  # the measurement stays
    assert out.result.quality is None
    assert out.error is not None and out.error.startswith("quality check: ValueError: ")
    assert "k_proj / v_proj" in out.error and out.result.message == out.error


def test_the_hosts_own_evaluation_file(tmp_path: Path) -> None:
    from vrambudget.agent.probe import measure

    (tmp_path / "mine.txt").write_text("# two passages\nabcdefghij\n\nklmnopqrstuvwxyz\n")
    req = msgspec.convert(
        _request(_quality(eval_set="mine.txt", candidates=[_quality()["candidates"][0]])),
        ProbeRequest,
    )
    out = measure(req, ChildSettings(eval_dir=str(tmp_path)))
    assert out.status == "succeeded", out.error
    q = out.result.quality if out.result is not None else None
    assert q is not None and q.eval_set == "mine.txt"
    assert q.sequences == 2 and q.tokens == 9 + 15  # bytes as tokens, each predicting the next


def test_eval_file_stays_inside_the_directory(tmp_path: Path) -> None:
    root = tmp_path / "eval"
    root.mkdir()
    (root / "ok.txt").write_text("text\n")
    (tmp_path / "secret.txt").write_text("no\n")
    os.symlink(tmp_path / "secret.txt", root / "link.txt")
    assert eval_file(root, "builtin") is None
    assert eval_file(root, "ok.txt") == (root / "ok.txt").resolve()
    for name, words in (
        ("..", "a file name"),
        ("link.txt", "outside"),
        ("missing.txt", "no evaluation file"),
    ):
        with pytest.raises(ValueError, match=words):
            eval_file(root, name)
    with pytest.raises(ValueError, match="VRAMBUDGET_AGENT_EVAL_DIR"):
        eval_file(None, "ok.txt")


def test_submission_refuses_what_the_check_cannot_run(tmp_path: Path) -> None:
    from vrambudget.agent.api import create_agent_app
    from vrambudget.agent.settings import AgentSettings

    evals = tmp_path / "evals"
    evals.mkdir()
    (evals / "here.txt").write_text("some text\n")
    app = create_agent_app(
        AgentSettings(data_dir=tmp_path / "data", tokens=(b"t",), eval_dir=evals)
    )
    auth = {"Authorization": "Bearer t"}
    mxfp4 = {"weights": "bf16", "quantization": {"scheme": "mxfp4"}}
    cases = [
        (
            _quality(
                candidates=[{"label": "a", "precision": NF4}, {"label": "b", "precision": mxfp4}]
            ),
            "$.quality.candidates[1].precision.quantization",
        ),
        (_quality(reference=mxfp4), "$.quality.reference.quantization"),
        (_quality(eval_set="absent.txt"), "$.quality.eval_set"),
        (_quality(eval_set=".."), "$.quality.eval_set"),
    ]
    dims = _request(_quality())
    dims["workload"]["model"] = {
        "source": "dimensions",
        "hidden_size": 64,
        "num_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 100,
    }
    with TestClient(app) as client:
        for quality, field in cases:
            r = client.post("/v1/probes", json=_request(quality), headers=auth)
            assert r.status_code == 422, r.text
            assert r.json()["errors"][0]["field"] == field, r.text
        r = client.post("/v1/probes", json=dims, headers=auth)
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == "$.workload.model"
        assert "config.json" in r.json()["errors"][0]["message"]
        # an existing file is accepted (the probe is queued, not run here)
        r = client.post("/v1/probes", json=_request(_quality(eval_set="here.txt")), headers=auth)
        assert r.status_code == 202, r.text
        client.delete(r.headers["Location"], headers=auth)


def test_a_cpu_quality_check_widens_the_memory_limit_by_what_it_holds() -> None:
    """Master fp32 weights + one candidate (at most fp32) + the reference's fp32 logits, by hand
    for the tiny model: per layer q, o (128 x 128), k, v (128 x 64), gate/up/down (128 x 256),
    two norms; embeddings and head 500 x 128; the final norm."""
    from tests.support.workloads import INFER
    from vrambudget.agent.limits import quality_bytes

    per_layer = 2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 256 + 2 * 128
    params = 2 * per_layer + 2 * 500 * 128 + 128
    req = msgspec.convert(
        {
            "workload": INFER,
            "quality": {
                "reference": {"weights": "fp32"},
                "candidates": [{"label": "b", "precision": {"weights": "bf16"}}],
                "max_sequences": 4,
                "sequence_tokens": 64,
            },
        },
        ProbeRequest,
    )
    assert quality_bytes(req) == 2 * 4 * params + 4 * 64 * 500 * 4
    assert quality_bytes(msgspec.structs.replace(req, quality=None)) == 0
