"""A probe runs the real checkpoint when the host has it (a model directory or the Hugging Face
cache), synthetic weights otherwise, and says which (vrambudget/agent/probe_run.py,
vrambudget/trace/checkpoints.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.support.workloads import QWEN_INFER
from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.probe_report import ProbeRequest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

REPO = "vrambudget-tests/tiny-llama"
CONFIG = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
}


def _save(directory: Path) -> dict[str, Any]:
    """A real (randomly initialized) Llama checkpoint saved by transformers; its state dict."""
    torch.manual_seed(1)
    cfg = transformers.LlamaConfig(**CONFIG, torch_dtype="float32")
    model = transformers.LlamaForCausalLM(cfg)
    model.save_pretrained(directory, safe_serialization=True)
    return {k: v.clone() for k, v in model.state_dict().items()}


def _request(weights: str = "auto", kind: str = "inference") -> ProbeRequest:
    model = {"source": "hub", "id": REPO}
    precision = {"weights": "fp32", "compute": "fp32"}
    workload: dict[str, Any] = (
        {
            "kind": "inference",
            "model": model,
            "batch_size": 1,
            "prompt_tokens": 8,
            "generated_tokens": 2,
            "precision": precision,
        }
        if kind == "inference"
        else {
            "kind": "training",
            "model": model,
            "sequence_length": 8,
            "precision": precision,
            "mixed_precision": "pure",
            "attention": "sdpa",
        }
    )
    return msgspec.convert(
        {"workload": workload, "iterations": 1, "weights": weights}, ProbeRequest
    )


def _program(req: ProbeRequest, model_dirs: tuple[str, ...]) -> Any:
    from vrambudget.agent.child import ChildSettings
    from vrambudget.agent.probe_run import _program
    from vrambudget.workloads.marks import Marks

    return _program(req, ChildSettings(model_dirs=model_dirs), Marks(), torch.device("cpu"))


def _assert_loaded(model: Any, saved: dict[str, Any]) -> None:
    state = model.state_dict()
    for name, tensor in saved.items():
        assert torch.equal(state[name], tensor), name


def test_model_directory_checkpoint_is_loaded_exactly(tmp_path: Path) -> None:
    saved = _save(tmp_path / "models" / REPO)
    program = _program(_request(), (str(tmp_path / "models"),))
    source = program.weights_source
    assert source.kind == "checkpoint"
    assert source.path == str(tmp_path / "models" / REPO)
    assert source.revision is None
    _assert_loaded(program.model, saved)


def test_hub_cache_snapshot_is_found_with_its_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants as hc

    cache = tmp_path / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo_dir = cache / f"models--{REPO.replace('/', '--')}"
    saved = _save(repo_dir / "snapshots" / commit)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(commit)
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))
    program = _program(_request(), ())
    source = program.weights_source
    assert (source.kind, source.revision) == ("checkpoint", commit)
    assert source.reason == "found in the Hugging Face cache"
    _assert_loaded(program.model, saved)


def test_missing_checkpoint_falls_back_to_synthetic_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    # The config comes from a model directory without weights: resolvable, but not loadable.
    d = tmp_path / "models" / REPO
    d.mkdir(parents=True)
    (d / "config.json").write_text(
        msgspec.json.encode(
            {**CONFIG, "model_type": "llama", "architectures": ["LlamaForCausalLM"]}
        ).decode()
    )
    from vrambudget.trace.checkpoints import Missing, find_checkpoint

    found = find_checkpoint(_request().workload.model, (str(tmp_path / "models"),))  # type: ignore[union-attr]
    assert isinstance(found, Missing)
    assert REPO in found.reason and "has no safetensors" in found.reason
    with pytest.raises(InvalidWorkload) as info:
        _program(_request("checkpoint"), (str(tmp_path / "models"),))
    assert info.value.field == "weights" and REPO in info.value.message


def test_synthetic_on_request_even_when_the_checkpoint_is_there(tmp_path: Path) -> None:
    """The checkpoint's config still defines the model (no Hub fetch); its weights are not
    loaded: the synthetic N(0, 0.02) values differ from the saved ones."""
    saved = _save(tmp_path / "models" / REPO)
    program = _program(_request("synthetic"), (str(tmp_path / "models"),))
    source = program.weights_source
    assert source.kind == "synthetic"
    assert source.reason == "the request asked for synthetic weights"
    assert source.path == str(tmp_path / "models" / REPO)
    state = program.model.state_dict()
    assert not torch.equal(state["model.embed_tokens.weight"], saved["model.embed_tokens.weight"])


def test_training_probe_on_the_real_checkpoint(tmp_path: Path) -> None:
    """The measured result of a training step on the loaded weights says checkpoint, and its
    weights view is the checkpoint's parameters (fp32) and the rotary buffers, to the byte."""
    from vrambudget.agent.child import ChildSettings
    from vrambudget.agent.probe import measure

    saved = _save(tmp_path / "models" / REPO)
    out = measure(_request(kind="training"), ChildSettings(model_dirs=(str(tmp_path / "models"),)))
    assert out.status == "succeeded", out.error
    assert out.result is not None and out.result.weights is not None
    assert out.result.weights.kind == "checkpoint"
    params = sum(t.numel() * t.element_size() for t in saved.values())
    # + the rotary embedding's inv_freq and original_inv_freq buffers (not in the checkpoint):
    # head_dim 16 -> 8 fp32 frequencies each.
    rope = 2 * 8 * 4
    assert out.result.torch is not None
    assert out.result.torch.weights_bytes == params + rope


def test_model_dirs_setting_reaches_the_child(tmp_path: Path) -> None:
    import os

    from vrambudget.agent.child import ChildSettings
    from vrambudget.agent.settings import AgentSettings, AgentSettingsError

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    settings = AgentSettings.from_env({"VRAMBUDGET_AGENT_MODEL_DIRS": f"{a}{os.pathsep}{b}"})
    assert ChildSettings.of(settings).model_dirs == (str(a), str(b))
    with pytest.raises(AgentSettingsError, match="VRAMBUDGET_AGENT_MODEL_DIRS"):
        AgentSettings.from_env({"VRAMBUDGET_AGENT_MODEL_DIRS": str(tmp_path / "absent")})


@pytest.mark.parametrize(("code", "compute"), [("framework", "bf16"), ("builtin", "bf16")])
def test_before_build_sees_the_concrete_precision_before_any_weight(
    code: str, compute: str
) -> None:
    """The CUDA probe measures cuBLAS's workspace with a GEMM in the compute dtype before the
    model is built; a request left at ``compute: auto`` (the default) must reach it resolved
    (qwen2.5-0.5b's config says bfloat16), not as ``auto`` -- the first GPU campaign failed
    every run with ``KeyError: 'auto'`` there."""
    from vrambudget.agent.child import ChildSettings
    from vrambudget.agent.probe_run import _program as build
    from vrambudget.workloads.marks import Marks

    req = msgspec.convert(
        {
            "workload": QWEN_INFER,
            "iterations": 1,
            "code": code,
            "weights": "synthetic",
        },
        ProbeRequest,
    )
    assert req.workload.precision.compute == "auto"
    seen: list[str] = []

    class Stop(Exception):
        pass

    def stop(w: Any) -> None:
        seen.append(w.precision.compute)
        raise Stop  # the hook runs before anything is allocated for the model

    with pytest.raises(Stop):
        build(req, ChildSettings(), Marks(), torch.device("cpu"), before_build=stop)
    assert seen == [compute]


def test_a_failed_probe_says_where_it_failed() -> None:
    """The child's error names the exception and its innermost frames (file:line in function),
    the package path kept from ``vrambudget/`` on."""
    from vrambudget.agent.probe import failure_message

    def inner() -> None:
        {"bf16": 1}["auto"]

    try:
        inner()
    except KeyError as exc:
        msg = failure_message(exc)
    assert msg.startswith("KeyError: 'auto' (at ")
    assert "test_weights.py:" in msg and " in inner <- " in msg
    try:  # a long message is cut to fit, the frames never
        raise ValueError("x" * 5000)
    except ValueError as exc:
        long = failure_message(exc)
    assert len(long) == 4000 and long.endswith(")") and " in test_a_failed_probe" in long
