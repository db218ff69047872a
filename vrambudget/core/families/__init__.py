"""From a Hugging Face ``config.json`` (or explicit dimensions) to a resolved ``Arch``.

Each family follows its ``transformers`` modelling code (``modeling_<model_type>.py``): which
tensors a layer creates, which have biases, which layers use a sliding window or experts. The
tensor inventories in this package are the only place these facts live.
"""

from __future__ import annotations

from ..arch import Arch
from ..hf_config import HFConfig
from ..hf_defaults import FAMILY_DEFAULTS
from .config import _Cfg
from .decoder import _decoder
from .gpt2_bert import _bert, _gpt2
from .tensors import compress_runs, gated_mlp, linear, norm
from .vision import _vision_tensors

__all__ = ["arch_from_hf_config", "compress_runs", "gated_mlp", "linear", "norm"]


def arch_from_hf_config(config: HFConfig) -> Arch:
    """Resolve a ``config.json``; Gemma 3's multimodal wrapper resolves its ``text_config`` and
    adds the vision tower that ``Gemma3ForConditionalGeneration`` loads."""
    model_type = config.model_type
    if model_type == "gpt2":
        return _gpt2(_Cfg(config, FAMILY_DEFAULTS["gpt2"]))
    if model_type == "bert":
        return _bert(_Cfg(config, FAMILY_DEFAULTS["bert"]))
    if model_type == "gemma3":
        text = config.text_config
        c = _Cfg(text, FAMILY_DEFAULTS["gemma3_text"])
        extras = _vision_tensors(config.vision_config, c.require("hidden_size"))
        return _decoder("gemma3", c, extras=extras)
    return _decoder(model_type, _Cfg(config, FAMILY_DEFAULTS[model_type]), extras=[])
