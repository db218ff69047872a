from __future__ import annotations

import json

from service.cli import main


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


def test_estimate_error_is_clear(capsys):
    assert main(["estimate", "--model", "llama-2-7b", "--batch", "0"]) == 2
    assert "batch_size" in capsys.readouterr().err


def test_settings_from_env(monkeypatch):
    from service.api.app import Settings

    assert Settings.from_env() == Settings()
    monkeypatch.setenv("VRAMBUDGET_PORT", "9001")
    assert Settings.from_env().port == 9001
