"""``vrambudget gguf FILE``: a real GGUF file's header (written here with the gguf package) as a
request whose model buffers are the file's own tensor bytes."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest

from vrambudget.cli.main import main
from vrambudget.core.estimate import estimate
from vrambudget.core.spec import BudgetRequest

gguf = pytest.importorskip("gguf")


def _write(path, tied: bool) -> int:
    """A 2-layer llama GGUF: F16 matrices, F32 norms; returns the tensor bytes."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_context_length(2048)
    w.add_embedding_length(256)
    w.add_feed_forward_length(512)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_vocab_size(1024)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    total = 0

    def add(name: str, rows: int, cols: int | None) -> None:
        nonlocal total
        data = np.zeros((rows, cols), np.float16) if cols else np.ones(rows, np.float32)
        w.add_tensor(name, data)
        total += data.nbytes

    add("token_embd.weight", 1024, 256)
    add("output_norm.weight", 256, None)
    if not tied:
        add("output.weight", 1024, 256)
    for i in range(2):
        add(f"blk.{i}.attn_norm.weight", 256, None)
        add(f"blk.{i}.attn_q.weight", 256, 256)
        add(f"blk.{i}.attn_k.weight", 128, 256)
        add(f"blk.{i}.attn_v.weight", 128, 256)
        add(f"blk.{i}.attn_output.weight", 256, 256)
        add(f"blk.{i}.ffn_norm.weight", 256, None)
        add(f"blk.{i}.ffn_gate.weight", 512, 256)
        add(f"blk.{i}.ffn_up.weight", 512, 256)
        add(f"blk.{i}.ffn_down.weight", 256, 512)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return total


@pytest.mark.parametrize("tied", [False, True])
def test_gguf_header_to_budget(tmp_path, capsys, tied):
    path = tmp_path / "m.gguf"
    total = _write(path, tied)
    assert main(["gguf", str(path), "--gpu", "rtx-4090-24gb"]) == 0
    body = json.loads(capsys.readouterr().out)
    w = body["workloads"][0]
    assert w["model"]["num_layers"] == 2 and w["model"]["num_key_value_heads"] == 2
    assert w["model"]["tie_word_embeddings"] is tied
    assert w["gguf"]["file_type"] == "F16"
    assert len(w["gguf"]["tensors"]) == (21 if not tied else 20)
    req = msgspec.convert(body, BudgetRequest)
    b = estimate(req.workloads, req.device, None, None, req.software)
    embd = 1024 * 256 * 2
    gpu = {ln.component.value: ln.bytes for ln in b.devices[0].lines}["weights"]
    # every tensor but the token embeddings on the GPU; a tied head keeps a copy there
    assert gpu == total - embd + (embd if tied else 0)
    assert b.disk.total_bytes == total
    d = b.serving.details  # type: ignore[union-attr]
    assert d.tensor_types == {"F16": 16 if not tied else 15, "F32": 5}


def test_a_tensor_beyond_the_layers_is_a_field_error(tmp_path, capsys):
    path = tmp_path / "m.gguf"
    _write(path, False)
    main(["gguf", str(path), "--gpu", "rtx-4090-24gb"])
    body = json.loads(capsys.readouterr().out)
    body["workloads"][0]["gguf"]["tensors"][3]["name"] = "blk.7.attn_norm.weight"
    req = msgspec.convert(body, BudgetRequest)
    from vrambudget.core.errors import InvalidWorkload

    with pytest.raises(InvalidWorkload) as err:
        estimate(req.workloads, req.device, None, None, req.software)
    assert err.value.field == "workloads[0].gguf.tensors[3].name"
