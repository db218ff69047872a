"""One fake Hub on 127.0.0.1 for the module, holding every repository the tests ask for."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import close_session, constants

from tests.hub.fake_hub import FakeHub, FakeRepo
from tests.hub.repos import (
    CONFIG,
    GATED_TOKEN,
    PRIVATE_TOKEN,
    write_big_header,
    write_pipeline,
    write_sharded,
    write_single,
)
from vrambudget.hub import HubSettings


def _sha(n: int) -> str:
    return f"{n:040x}"


class HubTree:
    """The repositories on disk and what their headers list."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sharded = write_sharded(root / "org" / "sharded")
        self.single = write_single(root / "org" / "single")
        self.big_header_n = write_big_header(root / "org" / "big-header")
        write_single(root / "org" / "gated")
        write_single(root / "org" / "private")
        write_single(root / "org" / "broken")
        bad = root / "org" / "bad-config"
        write_single(bad)
        (bad / "config.json").write_bytes(b'{"model_type": "llama", ')
        listed = root / "org" / "list-config"
        write_single(listed)
        (listed / "config.json").write_text("[1, 2, 3]")
        write_pipeline(root / "org" / "pipeline")
        bin_only = root / "org" / "bin-only"
        bin_only.mkdir(parents=True)
        (bin_only / "config.json").write_text(json.dumps(CONFIG))
        (bin_only / "pytorch_model.bin").write_bytes(b"\x80\x02" + bytes(1000))
        bad_header = root / "org" / "bad-header"
        bad_header.mkdir(parents=True)
        (bad_header / "config.json").write_text(json.dumps(CONFIG))
        garbage = b"{this is not json}      "
        (bad_header / "model.safetensors").write_bytes(
            len(garbage).to_bytes(8, "little") + garbage + bytes(16)
        )
        bad_offsets = root / "org" / "bad-offsets"
        bad_offsets.mkdir(parents=True)
        (bad_offsets / "config.json").write_text(json.dumps(CONFIG))
        header = json.dumps(
            {"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 10]}}
        ).encode()
        (bad_offsets / "model.safetensors").write_bytes(
            len(header).to_bytes(8, "little") + header + bytes(10)
        )
        no_config = root / "org" / "no-config"
        write_single(no_config)
        (no_config / "config.json").unlink()

    def repos(self) -> dict[str, FakeRepo]:
        names = [
            "sharded",
            "single",
            "big-header",
            "gated",
            "private",
            "broken",
            "bad-config",
            "list-config",
            "pipeline",
            "bin-only",
            "bad-header",
            "bad-offsets",
            "no-config",
        ]
        repos = {
            f"org/{name}": FakeRepo(
                root=self.root / "org" / name, sha=_sha(i + 1), refs={"main": _sha(i + 1)}
            )
            for i, name in enumerate(names)
        }
        repos["org/single"].refs["v1.0"] = repos["org/single"].sha
        repos["org/gated"].gated_token = GATED_TOKEN
        repos["org/private"].private_token = PRIVATE_TOKEN
        repos["org/broken"].status = 500
        return repos


_PROXY_VARIABLES = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
)


@pytest.fixture(autouse=True)
def _hub_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Tests talk to 127.0.0.1 only: whatever the machine's HF_HUB_OFFLINE or proxies say.
    huggingface_hub's shared HTTP client reads proxies when it is made, so it is remade."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    close_session()
    yield
    close_session()


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> HubTree:
    return HubTree(tmp_path_factory.mktemp("hub-tree"))


@pytest.fixture(scope="module")
def _server(tree: HubTree) -> Iterator[FakeHub]:
    with FakeHub(tree.repos()) as hub:
        yield hub


@pytest.fixture
def hub(_server: FakeHub) -> FakeHub:
    """The module's fake Hub, its request log emptied."""
    _server.clear()
    return _server


@pytest.fixture
def settings(hub: FakeHub, tmp_path: Path) -> HubSettings:
    """Settings for the fake Hub, with a fresh huggingface_hub cache (so every file is asked
    for) and no token."""
    return HubSettings(endpoint=hub.url, timeout_s=5.0, cache_dir=str(tmp_path / "hf-cache"))
