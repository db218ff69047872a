"""``vrambudget.hub.fetch`` against a Hub on 127.0.0.1 that answers as huggingface.co does."""

from __future__ import annotations

import json
import logging
import pickle
import socket
import time
import traceback
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from huggingface_hub import constants

from tests.hub.conftest import HubTree
from tests.hub.fake_hub import FakeHub, Seen
from tests.hub.repos import CONFIG, GATED_TOKEN, PRIVATE_TOKEN, by_name
from vrambudget.hub import HubError, HubSettings, fetch, read_local


def _safetensors_gets(seen: list[Seen]) -> list[Seen]:
    return [s for s in seen if s.path.endswith(".safetensors")]


def _range(seen: Seen) -> tuple[int, int]:
    assert seen.range is not None, f"{seen.method} {seen.path} without a Range header"
    first, _, last = seen.range.removeprefix("bytes=").partition("-")
    return int(first), int(last)


def test_sharded_checkpoint(hub: FakeHub, tree: HubTree, settings: HubSettings) -> None:
    got = fetch("org/sharded", None, settings=settings)
    repo = hub.repos["org/sharded"]
    assert (got.origin, got.repo_id, got.revision, got.commit) == (
        "hub",
        "org/sharded",
        None,
        repo.sha,
    )
    assert got.config == CONFIG
    assert got.checkpoint is not None
    assert by_name(got.checkpoint.tensors) == tree.sharded
    # Shards in name order, each one's tensors in storage order.
    shard_1 = [t.name for t in got.checkpoint.tensors[:3]]
    assert set(shard_1) == {
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.counter",
    }
    index = json.loads((repo.root / "model.safetensors.index.json").read_text())
    assert got.checkpoint.total_size == index["metadata"]["total_size"]
    assert got.checkpoint.total_size == got.checkpoint.stored_bytes
    sizes = tuple(
        (name, (repo.root / name).stat().st_size)
        for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    )
    assert got.files == got.checkpoint.files == sizes
    dtypes = {t.dtype for t in got.checkpoint.tensors}
    assert dtypes == {"BF16", "I32", "U8", "F8_E4M3", "F32", "F16"}


def test_every_request_names_the_commit(hub: FakeHub, settings: HubSettings) -> None:
    """After the model-info call resolves "main", every file is read at the commit: a branch
    that moves during a fetch is never mixed."""
    got = fetch("org/sharded", "main", settings=settings)
    seen = hub.requests()
    assert seen[0].path == "/api/models/org/sharded/revision/main?blobs=true"
    files = seen[1:]
    assert files and all(f"/resolve/{got.commit}/" in s.path for s in files)


def test_only_safetensors_headers_are_requested(hub: FakeHub, settings: HubSettings) -> None:
    fetch("org/sharded", None, settings=settings)
    repo = hub.repos["org/sharded"]
    gets = _safetensors_gets(hub.requests())
    assert sorted(Path(s.path).name for s in gets) == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    for s in gets:
        data = (repo.root / Path(s.path).name).read_bytes()
        n = int.from_bytes(data[:8], "little")
        first, last = _range(s)
        assert s.method == "GET" and s.status == 206
        # huggingface_hub's first range is 100,001 bytes (most headers fit in it), never more.
        assert first == 0 and last <= max(100_000, 8 + n - 1)
    big = next(s for s in gets if s.path.endswith("00002.safetensors"))
    size = (repo.root / "model-00002-of-00002.safetensors").stat().st_size
    assert big.body_bytes < size, "the whole shard was sent"


def test_a_long_header_is_read_in_a_second_range(
    hub: FakeHub, tree: HubTree, settings: HubSettings
) -> None:
    got = fetch("org/big-header", None, settings=settings)
    assert got.checkpoint is not None and len(got.checkpoint.tensors) == 2500
    n = tree.big_header_n
    ranges = [_range(s) for s in _safetensors_gets(hub.requests())]
    assert ranges == [(0, 100_000), (8, n + 7)]  # the header, never the data at 8 + n


def test_single_file_at_a_tag_and_at_a_commit(
    hub: FakeHub, tree: HubTree, settings: HubSettings
) -> None:
    sha = hub.repos["org/single"].sha
    at_tag = fetch("org/single", "v1.0", settings=settings)
    assert (at_tag.revision, at_tag.commit) == ("v1.0", sha)
    assert at_tag.checkpoint is not None
    assert by_name(at_tag.checkpoint.tensors) == tree.single
    assert at_tag.checkpoint.total_size is None  # no index
    at_sha = fetch("org/single", sha, settings=settings)
    assert (at_sha.revision, at_sha.commit) == (sha, sha)
    assert at_sha.checkpoint == at_tag.checkpoint


def test_config_comes_from_the_cache_at_a_known_commit(hub: FakeHub, settings: HubSettings) -> None:
    fetch("org/single", None, settings=settings)
    hub.clear()
    fetch("org/single", None, settings=settings)
    assert not [s for s in hub.requests() if s.path.endswith("config.json")]


def test_hub_and_local_agree(hub: FakeHub, settings: HubSettings) -> None:
    for name in ("sharded", "single", "big-header"):
        remote = fetch(f"org/{name}", None, settings=settings)
        local = read_local(hub.repos[f"org/{name}"].root)
        assert local.checkpoint == remote.checkpoint
        assert (local.config, local.files) == (remote.config, remote.files)


def test_gated_without_token(hub: FakeHub, settings: HubSettings) -> None:
    with pytest.raises(HubError) as err:
        fetch("org/gated", None, settings=settings)
    assert (err.value.kind, err.value.field) == ("gated", "id")
    assert all(s.authorization is None for s in hub.requests())


def test_gated_with_token(hub: FakeHub, settings: HubSettings) -> None:
    got = fetch("org/gated", None, settings=replace(settings, token=GATED_TOKEN))
    assert got.checkpoint is not None
    seen = hub.requests()
    assert seen and all(s.authorization == f"Bearer {GATED_TOKEN}" for s in seen)


@pytest.fixture
def all_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="huggingface_hub")
    caplog.set_level(logging.DEBUG, logger="vrambudget")
    yield caplog


def test_a_refused_token_never_shows(
    hub: FakeHub, settings: HubSettings, all_logs: pytest.LogCaptureFixture
) -> None:
    wrong = "hf_wrongSecretValue42"
    for repo_id in ("org/gated", "org/private"):
        with pytest.raises(HubError) as err:
            fetch(repo_id, None, settings=replace(settings, token=wrong))
        assert (err.value.kind, err.value.field) == ("gated", "id")
        assert any(s.authorization == f"Bearer {wrong}" for s in hub.requests())
        chain = "".join(traceback.format_exception(err.value))  # with huggingface_hub's cause
        for text in (str(err.value), repr(err.value), err.value.message, chain):
            assert wrong not in text
    assert all_logs.records, "nothing was logged at DEBUG: the check below would be empty"
    for record in all_logs.records:
        assert wrong not in record.getMessage()
    assert wrong not in repr(replace(settings, token=wrong))


def test_a_working_token_never_shows_in_logs(
    hub: FakeHub, settings: HubSettings, all_logs: pytest.LogCaptureFixture
) -> None:
    fetch("org/gated", None, settings=replace(settings, token=GATED_TOKEN))
    assert all_logs.records
    for record in all_logs.records:
        assert GATED_TOKEN not in record.getMessage()


def test_private_without_token_reads_as_not_found(hub: FakeHub, settings: HubSettings) -> None:
    with pytest.raises(HubError) as err:
        fetch("org/private", None, settings=settings)
    assert (err.value.kind, err.value.field) == ("not_found", "id")
    got = fetch("org/private", None, settings=replace(settings, token=PRIVATE_TOKEN))
    assert got.checkpoint is not None


def test_no_token_sends_none_even_with_one_in_the_environment(
    hub: FakeHub, settings: HubSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A developer's HF_TOKEN (or saved login) is never sent by a server built on this."""
    monkeypatch.setenv("HF_TOKEN", "hf_developerLocalToken")
    fetch("org/single", None, settings=settings)
    assert all(s.authorization is None for s in hub.requests())


@pytest.mark.parametrize(
    ("repo_id", "revision", "kind", "field"),
    [
        ("org/missing", None, "not_found", "id"),
        ("org/single", "no-such-branch", "not_found", "revision"),
        ("org/broken", None, "unreachable", "id"),
        ("org/bad-config", None, "invalid", "id"),
        ("org/list-config", None, "invalid", "id"),
        ("org/bad-header", None, "invalid", "id"),
        ("org/bad-offsets", None, "invalid", "id"),
        ("org/no-config", None, "not_found", "id"),
    ],
)
def test_errors(
    hub: FakeHub, settings: HubSettings, repo_id: str, revision: str | None, kind: str, field: str
) -> None:
    started = time.monotonic()
    with pytest.raises(HubError) as err:
        fetch(repo_id, revision, settings=settings)
    assert (err.value.kind, err.value.field) == (kind, field)
    assert repo_id in err.value.message
    assert "http://" not in err.value.message  # a sentence, not huggingface_hub's URL dump
    assert time.monotonic() - started < 5  # a 500 is not retried with backoff
    assert pickle.loads(pickle.dumps(err.value)).message == err.value.message


def test_missing_repo_is_the_hubs_404(hub: FakeHub, settings: HubSettings) -> None:
    with pytest.raises(HubError):
        fetch("org/missing", None, settings=settings)
    assert [(s.status, s.path) for s in hub.requests()] == [
        (404, "/api/models/org/missing?blobs=true")
    ]


def test_diffusers_pipeline(hub: FakeHub, tree: HubTree, settings: HubSettings) -> None:
    got = fetch("org/pipeline", None, settings=settings)
    assert got.config["_class_name"] == "StableDiffusionPipeline"
    assert got.checkpoint is None
    unet = tree.root / "org" / "pipeline" / "unet" / "diffusion_pytorch_model.safetensors"
    assert got.files == (("unet/diffusion_pytorch_model.safetensors", unet.stat().st_size),)
    assert not _safetensors_gets(hub.requests())


def test_a_repo_without_safetensors(hub: FakeHub, settings: HubSettings) -> None:
    got = fetch("org/bin-only", None, settings=settings)
    assert got.checkpoint is None
    assert got.files == (("pytorch_model.bin", 1002),)
    assert not [s for s in hub.requests() if s.path.endswith(".bin")]


def test_header_over_the_limit(hub: FakeHub, tree: HubTree, settings: HubSettings) -> None:
    with pytest.raises(HubError) as err:
        fetch("org/big-header", None, settings=replace(settings, max_header_bytes=100_000))
    assert err.value.kind == "invalid"
    assert "limit" in err.value.message


@pytest.mark.parametrize(
    ("repo_id", "revision", "field"),
    [
        ("", None, "id"),
        ("a/b/c", None, "id"),
        ("org/..", None, "id"),
        ("org/name--x", None, "id"),
        ("-org/name", None, "id"),
        ("org/" + "x" * 97, None, "id"),
        ("org/name.git", None, "id"),
        ("org/ name", None, "id"),
        ("org/name", "../../etc/passwd", "revision"),
        ("org/name", "/main", "revision"),
        ("org/name", "x" * 257, "revision"),
        ("org/name", "", "revision"),
        ("org/name", "main\n", "revision"),
        ("org/name", "a b", "revision"),
    ],
)
def test_bad_names_are_refused_before_any_request(
    hub: FakeHub, settings: HubSettings, repo_id: str, revision: str | None, field: str
) -> None:
    with pytest.raises(HubError) as err:
        fetch(repo_id, revision, settings=settings)
    assert (err.value.kind, err.value.field) == ("invalid", field)
    assert hub.requests() == []


def test_good_names_pass(hub: FakeHub, settings: HubSettings) -> None:
    for repo_id, revision in [("org/missing", "refs/pr/1"), ("gpt2", None), ("a.b/c_d-e", "v1.0")]:
        with pytest.raises(HubError) as err:
            fetch(repo_id, revision, settings=settings)
        assert err.value.kind == "not_found"
    assert len(hub.requests()) == 3


def test_closed_port_is_unreachable(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = HubSettings(
        endpoint=f"http://127.0.0.1:{port}", timeout_s=2.0, cache_dir=str(tmp_path)
    )
    started = time.monotonic()
    with pytest.raises(HubError) as err:
        fetch("org/single", None, settings=settings)
    assert (err.value.kind, err.value.field) == ("unreachable", "id")
    assert time.monotonic() - started < 2


def test_silent_server_times_out(tmp_path: Path) -> None:
    """A server that accepts the connection and never answers: the timeout bounds the wait."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        settings = HubSettings(
            endpoint=f"http://127.0.0.1:{port}", timeout_s=0.5, cache_dir=str(tmp_path)
        )
        started = time.monotonic()
        with pytest.raises(HubError) as err:
            fetch("org/single", None, settings=settings)
        elapsed = time.monotonic() - started
    assert err.value.kind == "unreachable"
    assert "0.5 s" in err.value.message
    assert elapsed < 3


def test_offline_mode_is_unreachable(
    hub: FakeHub, settings: HubSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubError) as err:
        fetch("org/single", None, settings=settings)
    assert err.value.kind == "unreachable"
    assert "offline" in err.value.message
    assert hub.requests() == []


def test_hub_cache_over_the_real_fetch(hub: FakeHub, settings: HubSettings) -> None:
    from vrambudget.hub import HubCache

    cache = HubCache(settings)
    first = cache.get("org/sharded", "main")
    asked = len(hub.requests())
    assert cache.get("org/sharded", "main") is first
    assert len(hub.requests()) == asked


@pytest.mark.parametrize(
    ("failing", "status"),
    [
        ("config.json", 503),
        ("model.safetensors.index.json", 502),
        ("model-00002-of-00002.safetensors", 500),
        ("config.json", 429),
    ],
)
def test_a_hub_failing_mid_fetch_fails_fast(
    tree: HubTree, tmp_path: Path, failing: str, status: int
) -> None:
    """The model info answers, then a file does not: no retry with backoff (huggingface_hub's
    hf_hub_download would retry a failed HEAD for up to minutes)."""
    repos = tree.repos()
    repos["org/sharded"].file_status[failing] = status
    with FakeHub(repos) as flaky:
        settings = HubSettings(endpoint=flaky.url, timeout_s=5.0, cache_dir=str(tmp_path))
        started = time.monotonic()
        with pytest.raises(HubError) as err:
            fetch("org/sharded", None, settings=settings)
        elapsed = time.monotonic() - started
        asked = [s for s in flaky.requests() if s.path.endswith(failing)]
    assert (err.value.kind, err.value.field) == ("unreachable", "id")
    assert failing in err.value.message and str(status) in err.value.message
    assert elapsed < 2 and len(asked) == 1


@pytest.mark.parametrize(
    ("status", "kind"), [(403, "gated"), (502, "unreachable"), (410, "unreachable")]
)
def test_model_info_statuses(tree: HubTree, tmp_path: Path, status: int, kind: str) -> None:
    repos = tree.repos()
    repos["org/single"].status = status
    with FakeHub(repos) as odd:
        settings = HubSettings(endpoint=odd.url, timeout_s=5.0, cache_dir=str(tmp_path))
        with pytest.raises(HubError) as err:
            fetch("org/single", None, settings=settings)
    assert (err.value.kind, err.value.field) == (kind, "id")
