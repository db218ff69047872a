"""A config's cache key: its canonical encoding, computed once per config object."""

from __future__ import annotations

import msgspec
import pytest

from vrambudget.core import hf_config
from vrambudget.core.hf_config import config_key
from vrambudget.core.spec import HFConfigModel


def test_the_key_is_the_sorted_encoding_and_ignores_key_order() -> None:
    a = {"model_type": "llama", "hidden_size": 64, "rope_scaling": {"type": "linear", "factor": 2}}
    b = {"rope_scaling": {"factor": 2, "type": "linear"}, "hidden_size": 64, "model_type": "llama"}
    assert config_key(a) == config_key(b) == msgspec.json.encode(a, order="sorted")
    assert config_key({**a, "hidden_size": 128}) != config_key(a)


def test_a_config_object_is_encoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    config = {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24}
    calls = []
    real = msgspec.json.encode

    def counting(obj: object, **kw: object) -> bytes:
        calls.append(obj)
        return real(obj, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(hf_config.msgspec.json, "encode", counting)
    model = HFConfigModel(config=config)
    keys = {config_key(config) for _ in range(3)} | {config_key(model.config)}
    hash(model), hash(model)
    assert len(keys) == 1
    assert [c for c in calls if c is config] == [config]
