"""``HubSettings.from_env`` and the settings' own checks."""

from __future__ import annotations

import pytest
from huggingface_hub import constants

from vrambudget.hub import HubSettings


def test_defaults() -> None:
    s = HubSettings.from_env({})
    assert s == HubSettings()
    assert (s.endpoint, s.token, s.timeout_s, s.cache_dir) == (None, None, 10.0, None)
    assert s.max_header_bytes == 100 * 1024 * 1024
    assert s.resolved_endpoint == constants.ENDPOINT
    assert s.hf_token is False  # never None: huggingface_hub would read a saved token


def test_every_variable() -> None:
    s = HubSettings.from_env(
        {
            "VRAMBUDGET_HUB_ENDPOINT": "https://hub.example.org/",
            "VRAMBUDGET_HUB_TOKEN": "hf_abc",
            "HF_TOKEN": "hf_other",
            "VRAMBUDGET_HUB_TIMEOUT_S": "2.5",
            "VRAMBUDGET_HUB_CACHE_DIR": "/var/cache/hf",
        }
    )
    assert s == HubSettings(
        endpoint="https://hub.example.org", token="hf_abc", timeout_s=2.5, cache_dir="/var/cache/hf"
    )
    assert s.resolved_endpoint == "https://hub.example.org"
    assert s.hf_token == "hf_abc"


def test_hf_token_is_the_fallback() -> None:
    assert HubSettings.from_env({"HF_TOKEN": "hf_x"}).token == "hf_x"
    assert HubSettings.from_env({"HF_TOKEN": "hf_x", "VRAMBUDGET_HUB_TOKEN": ""}).token == "hf_x"
    assert HubSettings.from_env({"HF_TOKEN": "  "}).token is None


def test_the_token_is_not_in_repr() -> None:
    s = HubSettings.from_env({"VRAMBUDGET_HUB_TOKEN": "hf_secretValue"})
    assert "hf_secretValue" not in repr(s) and "hf_secretValue" not in str(s)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("VRAMBUDGET_HUB_TIMEOUT_S", "soon"),
        ("VRAMBUDGET_HUB_TIMEOUT_S", "0"),
        ("VRAMBUDGET_HUB_TIMEOUT_S", "-1"),
        ("VRAMBUDGET_HUB_TIMEOUT_S", "nan"),
        ("VRAMBUDGET_HUB_TIMEOUT_S", "inf"),
        ("VRAMBUDGET_HUB_TIMEOUT_S", "601"),
        ("VRAMBUDGET_HUB_ENDPOINT", "huggingface.co"),
        ("VRAMBUDGET_HUB_ENDPOINT", "ftp://hub.example.org"),
        ("VRAMBUDGET_HUB_ENDPOINT", "https://hub.example.org/?x=1"),
        ("VRAMBUDGET_HUB_TOKEN", "hf_two words"),
    ],
)
def test_bad_values_name_the_variable(variable: str, value: str) -> None:
    with pytest.raises(ValueError, match=variable) as err:
        HubSettings.from_env({variable: value})
    if variable == "VRAMBUDGET_HUB_TOKEN":
        assert value not in str(err.value)


def test_direct_construction_is_checked() -> None:
    with pytest.raises(ValueError):
        HubSettings(timeout_s=0)
    with pytest.raises(ValueError):
        HubSettings(endpoint="not a url")
    with pytest.raises(ValueError):
        HubSettings(max_header_bytes=1)
