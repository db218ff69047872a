"""``vrambudget gguf FILE``: a GGUF file's header as an ``llm_serving`` request.

Reads the header with the ``gguf`` package (the metadata and the tensor table; no tensor data is
read): the model's dimensions from its metadata, every tensor's name, ggml type and shape, and
the file type. The request it prints budgets that exact file (``gguf.tensors``) under llama.cpp
or Ollama; pipe it to ``vrambudget estimate --file -`` or send it to ``/v1/budgets``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["add_parser", "request_of"]


def _field(fields: dict[str, Any], key: str, default: Any = None) -> Any:
    f = fields.get(key)
    if f is None:
        return default
    return f.contents()


def request_of(path: str, engine: str = "llama_cpp", gpu: str | None = None) -> dict[str, Any]:
    """The BudgetRequest (as JSON data) for the GGUF file at ``path``."""
    try:
        import gguf
    except ImportError:
        raise SystemExit(
            "vrambudget gguf needs the gguf package: pip install 'vrambudget[gguf]'"
        ) from None
    reader = gguf.GGUFReader(path)
    fields = reader.fields
    arch = _field(fields, "general.architecture")
    if arch is None:
        raise SystemExit(f"{path}: no general.architecture in the GGUF metadata")

    def meta(key: str, default: Any = None) -> Any:
        return _field(fields, f"{arch}.{key}", default)

    tensors = [
        {"name": t.name, "type": t.tensor_type.name, "shape": [int(x) for x in t.shape]}
        for t in reader.tensors
    ]
    names = {t["name"] for t in tensors}
    vocab = meta("vocab_size")
    if vocab is None:
        tokens = fields.get("tokenizer.ggml.tokens")
        vocab = len(tokens.data) if tokens is not None else None
    heads = int(meta("attention.head_count"))
    kv_heads = meta("attention.head_count_kv", heads)
    hidden = int(meta("embedding_length"))
    model: dict[str, Any] = {
        "source": "dimensions",
        "name": str(_field(fields, "general.name", arch))[:128],
        "hidden_size": hidden,
        "num_layers": int(meta("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(kv_heads if not isinstance(kv_heads, list) else max(kv_heads)),
        "head_dim": int(meta("attention.key_length", hidden // heads)),
        "intermediate_size": int(meta("feed_forward_length")),
        "vocab_size": int(vocab),
        "max_position_embeddings": int(meta("context_length", 1 << 40)),
        "tie_word_embeddings": "output.weight" not in names,
    }
    experts = meta("expert_count")
    if experts:
        model["moe"] = {
            "num_experts": int(experts),
            "experts_per_token": int(meta("expert_used_count", 1)),
            "expert_intermediate_size": int(
                meta("expert_feed_forward_length", model["intermediate_size"])
            ),
        }
    window = meta("attention.sliding_window")
    if window:
        model["sliding_window"] = int(window)
    ftype = _field(fields, "general.file_type")
    file_type = "Q4_K_M"
    if ftype is not None:
        name = gguf.LlamaFileType(int(ftype)).name
        file_type = name.removeprefix("MOSTLY_").replace("ALL_", "")
    body: dict[str, Any] = {
        "workloads": [
            {
                "kind": "llm_serving",
                "engine": engine,
                "model": model,
                "gguf": {"file_type": file_type, "tensors": tensors},
            }
        ]
    }
    if gpu is not None:
        body["device"] = {"source": "catalog", "id": gpu}
    return body


def _run(args: argparse.Namespace) -> int:
    print(json.dumps(request_of(args.file, args.engine, args.gpu), indent=1))
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "gguf",
        help="print an llm_serving request for a GGUF file (its header: dimensions and every "
        "tensor's type; needs the gguf package)",
    )
    p.add_argument("file", help="the .gguf file (only its header is read)")
    p.add_argument(
        "--engine",
        choices=["llama_cpp", "ollama"],
        default="llama_cpp",
        help="the engine the request budgets the file under (default llama_cpp)",
    )
    p.add_argument("--gpu", help="catalog GPU id for the request's device")
    p.set_defaults(func=_run)
