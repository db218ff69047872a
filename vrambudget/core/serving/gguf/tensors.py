"""A model's tensors as a GGUF file of a named quantization holds them: llama.cpp's names, the
ggml type llama-quantize gives each (``recipe``), their shapes and bytes, and the layer each
belongs to (the input layer, a repeating layer, or the output layer).

The shapes come from the architecture's tensor inventory (the same one every other budget
uses), renamed as ``convert_hf_to_gguf.py`` names them; ggml shapes list the input features
first (``ne[0]``), then the output features, then the experts of a merged MoE tensor.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from ...arch import Arch, Role, TensorGroup
from ...errors import InvalidWorkload
from ...spec import GGUFTensorSpec
from .recipe import QuantState, file_type_default, tensor_type
from .types import tensor_bytes

__all__ = ["INPUT", "GGUFTensor", "file_tensors", "gguf_tensors"]

_BLOCK = re.compile(r"^blk\.(\d+)\.")

INPUT = -1
"""The layer index of the input layer (the token embeddings): llama.cpp keeps it on the CPU."""

# the Hugging Face module name of a layer's tensor -> the GGUF tensor name (convert_hf_to_gguf
# tensor_mapping.py); anything else keeps a generic name and the file type's default rule
_LAYER_NAMES: dict[str, str] = {
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_output",
    "qkv_proj": "attn_qkv",
    "attn.c_attn": "attn_qkv",
    "attn.c_proj": "attn_output",
    "q_a_proj": "attn_q_a",
    "q_b_proj": "attn_q_b",
    "kv_a_proj_with_mqa": "attn_kv_a_mqa",
    "kv_b_proj": "attn_kv_b",
    "gate_proj": "ffn_gate",
    "up_proj": "ffn_up",
    "gate_up_proj": "ffn_up",
    "down_proj": "ffn_down",
    "mlp.c_fc": "ffn_up",
    "mlp.c_proj": "ffn_down",
    "experts.gate_proj": "ffn_gate_exps",
    "experts.up_proj": "ffn_up_exps",
    "experts.down_proj": "ffn_down_exps",
    "experts.gate_up_proj": "ffn_gate_up_exps",  # fused (gpt-oss's checkpoint layout)
    "shared_experts.gate_proj": "ffn_gate_shexp",
    "shared_experts.up_proj": "ffn_up_shexp",
    "shared_experts.down_proj": "ffn_down_shexp",
    "router": "ffn_gate_inp",
    "shared_expert_gate": "ffn_gate_inp_shexp",
}


@dataclass(frozen=True, slots=True)
class GGUFTensor:
    name: str
    type: str
    shape: tuple[int, ...]
    layer: int
    """INPUT, a repeating layer 0 .. n_layer - 1, or n_layer for the output layer."""
    nbytes: int


def _shape(t: TensorGroup, experts: bool) -> tuple[int, ...]:
    if t.cols == 1:
        return (t.rows,)
    if experts:
        return (t.cols, t.rows, t.count)
    return (t.cols, t.rows)


@lru_cache(maxsize=512)
def gguf_tensors(arch: Arch, file_type: str) -> tuple[GGUFTensor, ...]:
    """Every tensor of the GGUF file, in the file's order (token embeddings, the layers, the
    output norm and head). Vision towers are not in the text GGUF (llama.cpp loads them from a
    separate mmproj file) and are left out. Vectors (norms, biases) and the MoE routers stay in
    the converted file's F32 (llama-quantize skips 1-D tensors and ``ffn_gate_inp``)."""
    default = file_type_default(file_type)
    state = QuantState.start(arch, file_type)
    out: list[GGUFTensor] = []

    def add(name: str, shape: tuple[int, ...], layer: int, kind: str | None) -> None:
        """``kind`` None: kept F32; else the recipe's type for that kind of tensor."""
        typ = "F32" if kind is None else tensor_type(state, default, kind, name, shape, layer)
        out.append(GGUFTensor(name, typ, shape, layer, tensor_bytes(typ, shape)))

    for t in arch.embeddings:
        if t.role is Role.VISION:
            continue
        if t.name in ("embed_tokens", "wte"):
            add("token_embd.weight", _shape(t, False), INPUT, "token_embd")
        else:
            add("position_embd.weight", _shape(t, False), INPUT, None)
    i = 0
    for layer_type, count in arch.layer_runs:
        for _ in range(count):
            for t in layer_type.tensors:
                if t.role is Role.VISION or t.buffer:
                    continue
                kind = _LAYER_NAMES.get(t.name, t.name.replace(".", "_"))
                if t.role in (Role.NORM, Role.BIAS) or t.cols == 1:
                    for j in range(t.count):  # one F32 vector per count
                        add(f"blk.{i}.{kind}.{j}", (t.rows,), i, None)
                elif t.role is Role.EXPERT or t.count == 1:
                    quantized = None if t.role is Role.ROUTER else kind
                    add(f"blk.{i}.{kind}.weight", _shape(t, t.role is Role.EXPERT), i, quantized)
                else:
                    for j in range(t.count):
                        add(f"blk.{i}.{kind}.{j}.weight", _shape(t, False), i, kind)
            i += 1
    for t in arch.head:
        if t.role is Role.LM_HEAD:
            add("output.weight", _shape(t, False), i, "output")
        elif t.role is not Role.VISION:
            add("output_norm.weight", (t.rows,), i, None)
    return tuple(out)


_INPUT_NAMES = ("token_embd.", "token_types.", "position_embd.", "per_layer_token_embd.")


def file_tensors(specs: tuple[GGUFTensorSpec, ...], n_layer: int) -> tuple[GGUFTensor, ...]:
    """A GGUF file's own tensors (its header), placed as llama.cpp places them: ``blk.N.*`` in
    layer N, the token embeddings in the input layer, everything else (output norm and head,
    rope tables) in the output layer. Raises InvalidWorkload naming ``gguf.tensors[i]``."""
    out = []
    for i, t in enumerate(specs):
        m = _BLOCK.match(t.name)
        if m is not None:
            layer = int(m.group(1))
            if layer >= n_layer:
                raise InvalidWorkload(
                    f"gguf.tensors[{i}].name",
                    f"layer {layer} of {t.name!r} is beyond the model's {n_layer} layers",
                )
        elif t.name.startswith(_INPUT_NAMES):
            layer = INPUT
        else:
            layer = n_layer
        try:
            nbytes = tensor_bytes(t.type, t.shape)
        except ValueError as exc:
            raise InvalidWorkload(f"gguf.tensors[{i}].shape", str(exc)) from None
        out.append(GGUFTensor(t.name, t.type, t.shape, layer, nbytes))
    return tuple(out)
