"""`hub` models through the service (issue 14 item 3): a fake Hub on 127.0.0.1 serving
hub-shaped repositories whose safetensors files were written by the ``safetensors`` package from
real (tiny) transformers models; the service honours ``VRAMBUDGET_HUB_ENDPOINT``, fetches the
config and the headers, resolves the model (the framework inventory in a trace worker), caches
it, and answers 422 / 503 naming the field when the Hub says no or does not answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from huggingface_hub import close_session, constants
from litestar.testing import TestClient
from safetensors.torch import save_file

from tests.hub.fake_hub import FakeHub, FakeRepo
from vrambudget.hub import HubSettings
from vrambudget.service.app import Settings, create_app

TOKEN = "hf_serviceTestToken0123456789"
PHI = {
    "model_type": "phi",
    "architectures": ["PhiForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 256,
    "torch_dtype": "bfloat16",
}
QWEN2 = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def _write(root: Path, config: dict[str, Any]) -> int:
    """A checkpoint directory as ``save_pretrained`` writes it: config.json and
    model.safetensors of the model transformers builds (bf16); its parameter count."""
    import transformers

    cls = getattr(transformers, config["architectures"][0])
    cfg = transformers.CONFIG_MAPPING[config["model_type"]].from_dict(config)
    model = cls(cfg).to(torch.bfloat16)
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config))
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()}, root / "model.safetensors"
    )
    return sum(p.numel() for p in model.parameters())


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeHub, dict[str, int]]]:
    root = tmp_path_factory.mktemp("hub")
    counts = {
        "org/tiny-phi": _write(root / "org" / "tiny-phi", PHI),
        "org/tiny-qwen2": _write(root / "org" / "tiny-qwen2", QWEN2),
    }
    _write(root / "org" / "gated-phi", PHI)
    repos = {
        name: FakeRepo(root=root / name, sha=f"{i + 1:040x}", refs={"main": f"{i + 1:040x}"})
        for i, name in enumerate(["org/tiny-phi", "org/tiny-qwen2", "org/gated-phi"])
    }
    repos["org/gated-phi"].gated_token = TOKEN
    with FakeHub(repos) as server:
        yield server, counts


@pytest.fixture(autouse=True)
def _local_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    close_session()
    yield
    close_session()


def _budget(client: TestClient[Any], model: dict[str, Any]) -> Any:
    body = {"workloads": [{"kind": "inference", "model": model, "prompt_tokens": 16}]}
    return client.post("/v1/budgets", json=body)


def _weights(answer: dict[str, Any]) -> int:
    lines = answer["devices"][0]["lines"]
    return int(next(line["bytes"] for line in lines if line["component"] == "weights"))


def test_hub_models_are_fetched_resolved_and_cached(
    hub: tuple[FakeHub, dict[str, int]], tmp_path: Path
) -> None:
    server, counts = hub
    settings = Settings(
        hub=HubSettings(endpoint=server.url, token=TOKEN, cache_dir=str(tmp_path), timeout_s=5)
    )
    with TestClient(create_app(settings)) as client:
        server.clear()
        r = _budget(client, {"source": "hub", "id": "org/tiny-phi"})
        assert r.status_code == 200, r.text
        answer = r.json()
        summary = answer["workloads"][0]
        assert summary["num_params"] == counts["org/tiny-phi"]
        assert summary["model"]["source"].startswith("hub org/tiny-phi@" + "0" * 39 + "1:")
        assert "PhiForCausalLM" in summary["model"]["source"]
        assert summary["format"]["stored_bytes"] == "safetensors headers"
        assert summary["format"]["weights_from"] == "checkpoint"
        # the stored bf16 parameters, plus the two fp32 rotary tables transformers computes at
        # load (PhiRotaryEmbedding inv_freq and original_inv_freq: partial_rotary_factor 0.5 of
        # head_dim 16 -> 4 values each)
        assert _weights(answer) == counts["org/tiny-phi"] * 2 + 2 * 4 * 4
        ranges = [s.range for s in server.requests() if s.path.endswith(".safetensors")]
        assert ranges and all(rng is not None for rng in ranges)  # headers only, by range
        # A closed-form family from the Hub: the same bytes as its closed form, read stored.
        r = _budget(client, {"source": "hub", "id": "org/tiny-qwen2", "revision": "main"})
        assert r.status_code == 200, r.text
        assert r.json()["workloads"][0]["num_params"] == counts["org/tiny-qwen2"]
        # Cached: the same request again asks the Hub for no safetensors file.
        server.clear()
        assert _budget(client, {"source": "hub", "id": "org/tiny-phi"}).status_code == 200
        assert not [s for s in server.requests() if s.path.endswith(".safetensors")]
        # A gated repository with the deployment's token: its answer never echoes the token.
        r = _budget(client, {"source": "hub", "id": "org/gated-phi"})
        assert r.status_code == 200, r.text
        assert TOKEN not in r.text


def test_hub_refusals_name_the_field(hub: tuple[FakeHub, dict[str, int]], tmp_path: Path) -> None:
    server, _ = hub
    settings = Settings(hub=HubSettings(endpoint=server.url, cache_dir=str(tmp_path), timeout_s=5))
    with TestClient(create_app(settings)) as client:
        r = _budget(client, {"source": "hub", "id": "org/no-such-repo"})
        assert r.status_code == 422, r.text
        assert r.json()["errors"][0]["field"] == "$.workloads[0].model.id"
        r = _budget(client, {"source": "hub", "id": "org/tiny-phi", "revision": "no-such-branch"})
        assert r.status_code == 422, r.text
        assert r.json()["errors"][0]["field"] == "$.workloads[0].model.revision"
        r = _budget(client, {"source": "hub", "id": "org/gated-phi"})  # no token here
        assert r.status_code == 422, r.text
        assert r.json()["errors"][0]["field"] == "$.workloads[0].model.id"


def test_an_unreachable_hub_is_a_503(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = Settings(
        hub=HubSettings(endpoint=f"http://127.0.0.1:{port}", cache_dir=str(tmp_path), timeout_s=2)
    )
    with TestClient(create_app(settings)) as client:
        r = _budget(client, {"source": "hub", "id": "org/tiny-phi"})
        assert r.status_code == 503, r.text
        problem = r.json()
        assert problem["type"].endswith("/hub-unreachable")
        assert r.headers["retry-after"] == "30"
        assert problem["errors"][0]["field"] == "$.workloads[0].model.id"
        assert "branch. Retry later" in problem["detail"], problem["detail"]


def test_a_speculative_drafter_from_the_hub_is_resolved(
    hub: tuple[FakeHub, dict[str, int]], tmp_path: Path
) -> None:
    """A vLLM draft model named by its Hub repository is fetched and resolved like the target;
    its parameters (bf16) join the weights, and its Hub id goes into the launch command."""
    server, counts = hub
    settings = Settings(
        hub=HubSettings(endpoint=server.url, token=TOKEN, cache_dir=str(tmp_path), timeout_s=5)
    )
    target = {"source": "hub", "id": "org/tiny-qwen2"}
    body = {
        "workloads": [
            {
                "kind": "llm_serving",
                "engine_version": "0.19.0",
                "model": target,
                "max_model_len": 256,
                "speculative": {
                    "method": "draft_model",
                    "num_speculative_tokens": 2,
                    "model": {"source": "hub", "id": "org/tiny-qwen2"},
                },
            }
        ],
        "device": {"source": "catalog", "id": "h100-sxm5-80gb"},
    }
    with TestClient(create_app(settings)) as client:
        r = client.post("/v1/budgets", json=body)
        assert r.status_code == 200, r.text
        answer = r.json()
        weights = next(ln for ln in answer["devices"][0]["lines"] if ln["component"] == "weights")
        draft = sum(p["bytes"] for p in weights["parts"] if p["name"].startswith("draft model"))
        assert draft == counts["org/tiny-qwen2"] * 2
        assert '"model": "org/tiny-qwen2"' in answer["serving"]["launch"]
        body["workloads"][0]["speculative"]["model"] = {"source": "hub", "id": "org/no-such"}
        r = client.post("/v1/budgets", json=body)
        assert r.status_code == 422, r.text
        assert r.json()["errors"][0]["field"] == "$.workloads[0].speculative.model.id"
