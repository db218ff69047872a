"""Checkpoint trees written with the ``safetensors`` package (tiny tensors of the dtypes real
checkpoints store), laid out as Hub repositories and checkpoint directories."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from vrambudget.core.checkpoint import StoredTensor

__all__ = [
    "CONFIG",
    "DTYPE_CODES",
    "GATED_TOKEN",
    "PRIVATE_TOKEN",
    "by_name",
    "expected",
    "write_big_header",
    "write_pipeline",
    "write_sharded",
    "write_single",
]

GATED_TOKEN = "hf_gatedSecretToken0123456789"
PRIVATE_TOKEN = "hf_privateSecretToken9876543210"

CONFIG = {"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 2, "vocab_size": 16}

DTYPE_CODES = {
    torch.bfloat16: "BF16",
    torch.int32: "I32",
    torch.uint8: "U8",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float32: "F32",
    torch.float16: "F16",
}


def _shard_1() -> dict[str, torch.Tensor]:
    return {
        "model.embed_tokens.weight": torch.zeros(16, 8, dtype=torch.bfloat16),
        "model.layers.0.self_attn.q_proj.weight": torch.ones(8, 8, dtype=torch.bfloat16),
        "model.layers.0.counter": torch.arange(3, dtype=torch.int32),
    }


def _shard_2() -> dict[str, torch.Tensor]:
    return {
        "model.layers.1.mask": torch.ones(5, dtype=torch.uint8),
        "model.layers.1.mlp.down_proj.weight": torch.zeros(8, 8).to(torch.float8_e4m3fn),
        # 160,000 bytes: more than huggingface_hub's first 100,001-byte range, so a test can
        # see that the data past the header is never requested.
        "lm_head.weight": torch.zeros(200, 200, dtype=torch.float32),
        "model.norm.weight": torch.ones(8, dtype=torch.float16),
    }


def expected(tensors: dict[str, torch.Tensor]) -> dict[str, StoredTensor]:
    """What a header lists for ``tensors`` (by name)."""
    return {
        name: StoredTensor(
            name=name,
            dtype=DTYPE_CODES[t.dtype],
            shape=tuple(t.shape),
            nbytes=t.numel() * t.element_size(),
        )
        for name, t in tensors.items()
    }


def write_sharded(root: Path) -> dict[str, StoredTensor]:
    """config.json + two shards + model.safetensors.index.json; the tensors by name."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(CONFIG))
    shards = {
        "model-00001-of-00002.safetensors": _shard_1(),
        "model-00002-of-00002.safetensors": _shard_2(),
    }
    weight_map: dict[str, str] = {}
    total = 0
    for name, tensors in shards.items():
        save_file(tensors, str(root / name), metadata={"format": "pt"})
        for tname, t in tensors.items():
            weight_map[tname] = name
            total += t.numel() * t.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return expected({**_shard_1(), **_shard_2()})


def write_single(root: Path) -> dict[str, StoredTensor]:
    """config.json + model.safetensors; the tensors by name."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(CONFIG))
    tensors = _shard_1()
    save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
    return expected(tensors)


def write_big_header(root: Path, count: int = 2500) -> int:
    """config.json + a model.safetensors whose header is longer than 100,000 bytes; returns
    the header length N."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(CONFIG))
    pad = "a_name_long_enough_to_push_the_safetensors_header_past_the_first_range_request"
    tensors = {
        f"model.layers.{i}.{pad}.weight": torch.ones(1, dtype=torch.uint8) for i in range(count)
    }
    save_file(tensors, str(root / "model.safetensors"))
    n = int.from_bytes((root / "model.safetensors").read_bytes()[:8], "little")
    assert n > 100_000
    return n


def write_pipeline(root: Path) -> None:
    """A diffusers pipeline: model_index.json and components in subfolders."""
    (root / "unet").mkdir(parents=True, exist_ok=True)
    (root / "model_index.json").write_text(
        json.dumps({"_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "UNet"]})
    )
    (root / "unet" / "config.json").write_text(json.dumps({"in_channels": 4}))
    save_file(
        {"conv_in.weight": torch.zeros(4, 4, dtype=torch.float16)},
        str(root / "unet" / "diffusion_pytorch_model.safetensors"),
    )


def by_name(tensors: tuple[StoredTensor, ...]) -> dict[str, StoredTensor]:
    return {t.name: t for t in tensors}
