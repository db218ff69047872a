"""``vrambudget.hub.read_local`` on checkpoint directories written with ``safetensors``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.hub.repos import CONFIG, by_name, write_pipeline, write_sharded, write_single
from vrambudget.hub import HubError, read_local


def _header_file(path: Path, header: bytes, data: bytes = b"", n: int | None = None) -> None:
    path.write_bytes((len(header) if n is None else n).to_bytes(8, "little") + header + data)


def _fails(path: Path, kind: str = "invalid", **kw: int) -> HubError:
    with pytest.raises(HubError) as err:
        read_local(path, **kw)
    assert (err.value.kind, err.value.field) == (kind, "path")
    return err.value


def test_sharded_with_index(tmp_path: Path) -> None:
    want = write_sharded(tmp_path)
    got = read_local(tmp_path)
    assert (got.origin, got.repo_id, got.revision, got.commit) == ("local", None, None, None)
    assert got.config == CONFIG
    assert got.checkpoint is not None
    assert by_name(got.checkpoint.tensors) == want
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert got.checkpoint.total_size == index["metadata"]["total_size"]
    assert got.checkpoint.stored_bytes == got.checkpoint.total_size
    names = sorted(set(index["weight_map"].values()))
    assert got.files == tuple((n, (tmp_path / n).stat().st_size) for n in names)


def test_single_file(tmp_path: Path) -> None:
    want = write_single(tmp_path)
    got = read_local(str(tmp_path))
    assert got.checkpoint is not None
    assert by_name(got.checkpoint.tensors) == want
    assert got.checkpoint.total_size is None
    assert got.files == (("model.safetensors", (tmp_path / "model.safetensors").stat().st_size),)


def test_never_reads_tensor_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads of a safetensors file stop at 8 + N bytes."""
    write_sharded(tmp_path)
    read_bytes: dict[str, int] = {}
    real_open = Path.open

    class Counting:
        def __init__(self, f: object, name: str) -> None:
            self._f, self._name = f, name

        def read(self, n: int = -1) -> bytes:
            assert n >= 0, "an unbounded read"
            data: bytes = self._f.read(n)  # type: ignore[attr-defined]
            read_bytes[self._name] = read_bytes.get(self._name, 0) + len(data)
            return data

        def __getattr__(self, attr: str) -> object:
            return getattr(self._f, attr)

        def __enter__(self) -> Counting:
            return self

        def __exit__(self, *exc: object) -> None:
            self._f.close()  # type: ignore[attr-defined]

    def counting_open(self: Path, *args: object, **kw: object) -> object:
        f = real_open(self, *args, **kw)  # type: ignore[call-overload]
        return Counting(f, self.name) if self.suffix == ".safetensors" else f

    files = {p.name: p.read_bytes() for p in tmp_path.glob("*.safetensors")}
    monkeypatch.setattr(Path, "open", counting_open)
    read_local(tmp_path)
    monkeypatch.undo()
    assert read_bytes.keys() == files.keys()
    for name, data in files.items():
        assert read_bytes[name] == 8 + int.from_bytes(data[:8], "little")
    big = "model-00002-of-00002.safetensors"
    assert read_bytes[big] < len(files[big])


def test_every_top_level_safetensors_without_index(tmp_path: Path) -> None:
    write_sharded(tmp_path)
    (tmp_path / "model.safetensors.index.json").unlink()
    got = read_local(tmp_path)
    assert got.checkpoint is not None and got.checkpoint.total_size is None
    assert [f for f, _ in got.files] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]


def test_pipeline_directory(tmp_path: Path) -> None:
    write_pipeline(tmp_path)
    got = read_local(tmp_path)
    assert got.config["_class_name"] == "StableDiffusionPipeline"
    assert got.checkpoint is None
    assert [f for f, _ in got.files] == ["unet/diffusion_pytorch_model.safetensors"]


def test_symlinked_snapshot(tmp_path: Path) -> None:
    """A Hub snapshot in huggingface_hub's cache links every file into a blob store."""
    blobs, snapshot = tmp_path / "blobs", tmp_path / "snapshot"
    want = write_single(blobs)
    snapshot.mkdir()
    for f in blobs.iterdir():
        os.symlink(f, snapshot / f.name)
    got = read_local(snapshot)
    assert got.checkpoint is not None and by_name(got.checkpoint.tensors) == want


def test_truncated_header(tmp_path: Path) -> None:
    write_single(tmp_path)
    data = (tmp_path / "model.safetensors").read_bytes()
    n = int.from_bytes(data[:8], "little")
    cut = data[8 : 8 + n // 2]
    _header_file(tmp_path / "model.safetensors", cut, data[8 + n :])
    assert "not JSON" in _fails(tmp_path).message


def test_header_length_beyond_the_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    _header_file(tmp_path / "model.safetensors", b"{}", n=1_000_000)
    assert "1000000-byte header" in _fails(tmp_path).message


def test_header_over_the_limit(tmp_path: Path) -> None:
    write_single(tmp_path)
    n = int.from_bytes((tmp_path / "model.safetensors").read_bytes()[:8], "little")
    assert "limit" in _fails(tmp_path, max_header_bytes=n - 1).message
    read_local(tmp_path, max_header_bytes=n)


def test_file_shorter_than_the_length_prefix(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"\x02\x00\x00")
    assert "shorter than the 8-byte" in _fails(tmp_path).message


@pytest.mark.parametrize(
    ("header", "data_len", "words"),
    [
        ({"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 10]}}, 10, "expected 12"),
        ({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 1]}}, 1, "unknown dtype"),
        ({"w": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}, 3, "hole"),
        (
            {
                "a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]},
            },
            6,
            "overlap",
        ),
        ({"w": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}, 5, "buffer of 5"),
        ({"w": {"dtype": "U8", "shape": ["2"], "data_offsets": [0, 2]}}, 2, "shape"),
        ({"w": {"dtype": "U8", "shape": [2], "data_offsets": [2, 0]}}, 2, "out of order"),
        ({"w": {"dtype": "U8", "shape": [2], "data_offsets": [0]}}, 2, "two integers"),
        ({"w": [1, 2]}, 0, "not an object"),
        ({"__metadata__": "x"}, 0, "__metadata__"),
        ({"w": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, 2, "expected 1.5"),
    ],
)
def test_inconsistent_headers(
    tmp_path: Path, header: dict[str, object], data_len: int, words: str
) -> None:
    (tmp_path / "config.json").write_text("{}")
    raw = json.dumps(header).encode()
    _header_file(tmp_path / "model.safetensors", raw, bytes(data_len))
    assert words in _fails(tmp_path).message


def test_sub_byte_and_metadata_headers_pass(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    header = {
        "__metadata__": {"format": "pt"},
        "packed": {"dtype": "F4", "shape": [4, 2], "data_offsets": [0, 4]},
        "empty": {"dtype": "F32", "shape": [0, 3], "data_offsets": [4, 4]},
        "scalar": {"dtype": "F64", "shape": [], "data_offsets": [4, 12]},
    }
    _header_file(tmp_path / "model.safetensors", json.dumps(header).encode(), bytes(12))
    got = read_local(tmp_path)
    assert got.checkpoint is not None
    assert [(t.name, t.nbytes, t.shape) for t in got.checkpoint.tensors] == [
        ("packed", 4, (4, 2)),
        ("empty", 0, (0, 3)),
        ("scalar", 8, ()),
    ]


def test_index_naming_a_path_outside(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    index = {"weight_map": {"w": "../outside.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "leaves the repository" in _fails(tmp_path).message


def test_index_naming_a_missing_shard(tmp_path: Path) -> None:
    write_sharded(tmp_path)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    _fails(tmp_path, kind="not_found")


def test_a_tensor_in_two_shards(tmp_path: Path) -> None:
    write_sharded(tmp_path)
    index_file = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    first = tmp_path / "model-00001-of-00002.safetensors"
    (tmp_path / "copy.safetensors").write_bytes(first.read_bytes())
    index["weight_map"]["extra"] = "copy.safetensors"
    index_file.write_text(json.dumps(index))
    assert "stored twice" in _fails(tmp_path).message


@pytest.mark.parametrize(
    ("config", "words"), [(b"{", "not JSON"), (b'"x"', "not an object"), (b"\xff\xfe", "JSON")]
)
def test_bad_config(tmp_path: Path, config: bytes, words: str) -> None:
    write_single(tmp_path)
    (tmp_path / "config.json").write_bytes(config)
    assert words in _fails(tmp_path).message


def test_not_a_checkpoint_directory(tmp_path: Path) -> None:
    _fails(tmp_path / "absent", kind="not_found")
    (tmp_path / "file").write_text("x")
    _fails(tmp_path / "file", kind="not_found")
    _fails(tmp_path, kind="not_found")  # no config.json


def test_config_without_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    got = read_local(tmp_path)
    assert got.checkpoint is None and got.files == ()
