from __future__ import annotations

import json

from vrambudget.cli.main import main


def test_estimate_table(capsys):
    assert main(["estimate", "--model", "llama-2-7b", "--gpu", "h100-sxm5-80gb"]) == 0
    out = capsys.readouterr().out
    assert "weights" in out and "13,476,831,232" in out and "fits" in out


def test_estimate_json_file(tmp_path, capsys):
    f = tmp_path / "w.json"
    f.write_text(json.dumps({"kind": "training", "model": {"source": "preset",
                                                              "id": "qwen2.5-0.5b"}}))
    assert main(["estimate", "--file", str(f), "--json"]) == 0
    budget = json.loads(capsys.readouterr().out)
    assert budget["workloads"][0]["kind"] == "training"


def test_estimate_serving_prints_the_engine_summary(tmp_path, capsys):
    f = tmp_path / "serving.json"
    f.write_text(json.dumps({"workloads": [{"kind": "llm_serving", "model": {
        "source": "preset", "id": "llama-3.1-8b"}, "max_model_len": 8192,
        "gpu_memory_utilization": 0.9}], "device": {"source": "catalog",
                                                      "id": "h100-sxm5-80gb"}}))
    assert main(["estimate", "--file", str(f)]) == 0
    out = capsys.readouterr().out
    # The numbers of docs/API.md's serving example.
    assert "vllm 0.19.0 on NVIDIA H100 SXM5 80GB: starts" in out
    assert "443,600 tokens (27,725 blocks of 16); max concurrency 54.1504" in out


def test_estimate_error_is_clear(capsys):
    assert main(["estimate", "--model", "llama-2-7b", "--batch", "0"]) == 2
    assert "batch_size" in capsys.readouterr().err


def test_settings_from_env(monkeypatch):
    from vrambudget.service.app import Settings

    assert Settings.from_env() == Settings()
    monkeypatch.setenv("VRAMBUDGET_PORT", "9001")
    assert Settings.from_env().port == 9001
