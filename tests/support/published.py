"""Published totals of real checkpoints, as the totals tests read them: the presets' checkpoint
facts (``vrambudget/core/data/models.json``: ``checkpoint.num_params``, ``total_size_bytes``)
and the research corpus (``research/data/published_checkpoints.json``), each with the
``config.json`` that ``transformers`` builds, and the counts of a framework inventory.

Two corpus configs are copies from before ``config.json`` had a ``model_type`` key; transformers
5.23.0 refuses them (``models/auto/configuration_auto.py`` 450-453: "Unrecognized model ...
Should have a `model_type` key"; the 4.x fallback that guessed it from the repository name is
gone). :data:`CONFIG_FIXES` adds the keys the published hub files carry, with their source.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal

from vrambudget.core.catalog import presets
from vrambudget.core.inventory import ModelInventory

from . import ROOT

__all__ = [
    "CONFIG_FIXES",
    "CORPUS",
    "DTYPE_BYTES",
    "FrameworkCount",
    "Total",
    "corpus_entries",
    "framework_count",
    "totals",
]

CORPUS = ROOT / "research" / "data" / "published_checkpoints.json"

DTYPE_BYTES = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "uint8": 1,
    "int8": 1,
    "bool": 1,
}
"""Bytes per element of the torch dtypes an inventory names (written out, not asked of torch)."""

CONFIG_FIXES: dict[str, dict[str, Any]] = {
    # The corpus copy (AYaroshevskii/Tweet-Sentiment roberta-base/config.json, pytorch-
    # transformers era) has neither key. The hub file as it is now, byte-for-byte in a "Duplicate
    # from FacebookAI/roberta-base" repository (https://huggingface.co/snibbles22/roberta-base/
    # blob/main/config.json, commit c8dbdc8, 481 bytes), has: "architectures":
    # ["RobertaForMaskedLM"], "bos_token_id": 0, "eos_token_id": 2, "model_type": "roberta",
    # "pad_token_id": 1 (every other key equal to the copy's).
    "FacebookAI/roberta-base": {
        "architectures": ["RobertaForMaskedLM"],
        "bos_token_id": 0,
        "eos_token_id": 2,
        "model_type": "roberta",
        "pad_token_id": 1,
    },
    # The hub file itself (albert/albert-base-v2 config.json at 216e2f28, 534 bytes) has no
    # model_type; transformers 4.x gave it "albert" from the repository name, as its re-save
    # shows (https://huggingface.co/Xenova/albert-base-v2/blob/220f3144159d2e480c643cbe4433809c
    # e58df584/config.json, transformers 4.28.1: "model_type": "albert", the same dimensions).
    "albert/albert-base-v2": {"model_type": "albert"},
}


@dataclass(frozen=True, slots=True)
class Total:
    """One published number of one checkpoint."""

    checkpoint: str
    """The preset id or the hub repository id."""
    origin: Literal["preset", "corpus"]
    model_type: str
    config: dict[str, Any]
    kind: Literal["num_params", "bytes"]
    value: int
    source: str
    """Where the number was read, in words."""

    @property
    def id(self) -> str:
        return f"{self.checkpoint}:{self.kind}"


def corpus_entries() -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = json.loads(CORPUS.read_text())["checkpoints"]
    return entries


def _config_of(entry: dict[str, Any]) -> dict[str, Any]:
    return {**entry["config"], **CONFIG_FIXES.get(entry["repo_id"], {})}


def _source_words(source: dict[str, Any]) -> str:
    if "url" in source:
        return str(source["url"])
    return f"{source['repo']} {source['path']} @ {source['commit'][:12]}"


def totals() -> tuple[Total, ...]:
    """Every published total: the presets' (models.json ``checkpoint``) then the corpus's."""
    out: list[Total] = []
    for pid, p in presets().items():
        facts = p.checkpoint
        config = p.config or {}
        model_type = str(config.get("model_type"))
        where = f"models.json {pid} checkpoint.how"
        if facts.num_params is not None:
            out.append(
                Total(pid, "preset", model_type, config, "num_params", facts.num_params, where)
            )
        if facts.total_size_bytes is not None:
            out.append(
                Total(pid, "preset", model_type, config, "bytes", facts.total_size_bytes, where)
            )
    for e in corpus_entries():
        pub = e["published"]
        kind: Literal["num_params", "bytes"] = (
            "num_params" if pub["kind"] == "num_params" else "bytes"
        )
        out.append(
            Total(
                e["repo_id"],
                "corpus",
                e["model_type"],
                _config_of(e),
                kind,
                int(pub["value"]),
                _source_words(pub["source"]),
            )
        )
    return tuple(out)


@dataclass(frozen=True, slots=True)
class FrameworkCount:
    """What a framework inventory holds, counted from its rows (tied tensors once)."""

    params: int
    """Parameter elements."""
    persistent_buffers: int
    """Elements of the buffers in the state dict."""
    following: int
    """Elements of parameters and persistent buffers in the load dtype (they take the
    checkpoint's dtype)."""
    fixed_bytes: int
    """Bytes of the parameters and persistent buffers the model keeps in a dtype of their own
    (fp32 router biases, integer buffers)."""
    nonpersistent_buffer_bytes: int
    """Buffers computed at load (rotary ``inv_freq``, ``position_ids``), in their own dtype."""

    @property
    def count(self) -> int:
        """Parameters plus persistent buffers: what a checkpoint of this model stores."""
        return self.params + self.persistent_buffers

    def bytes_at(self, dtype_bytes: int, *, nonpersistent: bool) -> int:
        """Bytes with the load-dtype tensors at ``dtype_bytes`` each and every other one in its
        own dtype; ``nonpersistent``: with the buffers computed at load."""
        extra = self.nonpersistent_buffer_bytes if nonpersistent else 0
        return self.following * dtype_bytes + self.fixed_bytes + extra


def framework_count(inv: ModelInventory) -> FrameworkCount:
    params = pbuf = following = fixed = transient = 0
    for t in inv.tensors:
        n = math.prod(t.shape) * t.count
        if t.kind == "buffer" and not t.persistent:
            transient += n * DTYPE_BYTES[t.dtype]
            continue
        if t.kind == "parameter":
            params += n
        else:
            pbuf += n
        if t.follows:
            following += n
        else:
            fixed += n * DTYPE_BYTES[t.dtype]
    return FrameworkCount(params, pbuf, following, fixed, transient)
