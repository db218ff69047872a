"""The model: embeddings, the decoder (or encoder) layers, the final norm and heads, and the
preallocated KV cache."""

from __future__ import annotations

import dataclasses
import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from vrambudget.core.arch import Arch, LayerType
from vrambudget.core.layout import kv_heads_per_device
from vrambudget.core.statics import tied_head_module, tied_saving

from ..marks import Marks
from .attention import KVCache, _AttentionBlock
from .mlp import _FeedForward
from .ops import _GEMMA_FAMILIES, _Ops
from .parameters import _Bank, _name
from .plan import BuildPlan

__all__ = ["TransformerModel"]


class TransformerModel(_AttentionBlock, _FeedForward, nn.Module):
    def __init__(self, arch: Arch, plan: BuildPlan, marks: Marks | None = None) -> None:
        super().__init__()
        # modules_to_save as PEFT applies it (ensure_weight_tying may save the embedding and
        # tie the head to its copy)
        names, shared = tied_saving(arch, plan.saved_modules, plan.tie_saved_head)
        plan = dataclasses.replace(plan, saved_modules=names)
        self.arch = arch
        self.plan = plan
        self.marks = marks or Marks()
        t = plan.tensor_parallel
        self.heads = arch.num_heads // t
        self.kv_heads = self.heads if arch.mla else kv_heads_per_device(arch, t)
        gemma = arch.model_type in _GEMMA_FAMILIES
        self.ops = _Ops(
            plan, self.marks, rms=arch.norm == "rmsnorm", norm_offset=1.0 if gemma else 0.0
        )
        self.embed = _Bank(arch.embeddings, arch, plan)
        self.layer_types: list[LayerType] = []
        banks = []
        for layer, n in arch.layer_runs:
            for _ in range(n):
                banks.append(_Bank(layer.tensors, arch, plan))
                self.layer_types.append(layer)
        self.layers = nn.ModuleList(banks)
        tied = tied_head_module(arch) if plan.trainable == "lora" and not shared else None
        self.shared_head = shared  # the tied head reads the embedding's saved copy
        self.head = _Bank(arch.head, arch, plan, (tied,) if tied is not None else ())
        self.extras = _Bank(arch.extras, arch, plan) if arch.extras else None
        if plan.trainable == "lora" and self.extras is not None:
            self.extras.requires_grad_(False)

    # ------------------------------------------------------------------------ embeddings --

    def _embed(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        a, ops, e = self.arch, self.ops, self.plan.compute_dtype
        names = [g.name for g in a.embeddings]
        table_name = _name(a.embeddings[0])
        if table_name in self.embed.quantized:  # a quantized table: gather dequantized rows
            x = torch.zeros(*ids.shape, a.hidden_size, dtype=e, device=ids.device)
        else:
            x = F.embedding(ids, ops.weight(self.embed, table_name))
        if x.dtype != e:
            x = x.to(e)
        if a.model_type in _GEMMA_FAMILIES:
            x = x * torch.tensor(math.sqrt(a.hidden_size), dtype=e, device=x.device)
        s = ids.shape[1]
        if "wpe" in names or "position_embeddings" in names:
            pos_name = "wpe" if "wpe" in names else "position_embeddings"
            x = x + ops.weight(self.embed, pos_name)[start : start + s].to(e)
        if "token_type_embeddings" in names:
            x = x + ops.weight(self.embed, "token_type_embeddings")[0].to(e)
        if a.kind == "encoder":
            x = ops.norm(self.embed, "embeddings__LayerNorm", x)
        return x

    # ----------------------------------------------------------------------------- layers --

    def _layer(
        self,
        index: int,
        x: torch.Tensor,
        start: int,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        cache: KVCache | None,
        training: bool,
    ) -> torch.Tensor:
        bank = cast(_Bank, self.layers[index])  # nn.ModuleList is not generic
        layer = self.layer_types[index]
        ops = self.ops
        if bank.has("attention__output__LayerNorm"):  # BERT: post-norm
            a = ops.dropout(
                self._attention(bank, layer, x, start, None, None, index, training), training
            )
            x = ops.norm(bank, "attention__output__LayerNorm", x + a)
            m = ops.dropout(self._mlp(bank, layer, x), training)
            return ops.norm(bank, "output__LayerNorm", x + m)
        if bank.has("ln_1"):  # GPT-2
            a = self._attention(
                bank, layer, ops.norm(bank, "ln_1", x), start, None, cache, index, training
            )
            x = x + ops.dropout(a, training)
            m = self._mlp(bank, layer, ops.norm(bank, "ln_2", x))
            return x + ops.dropout(m, training)
        sandwich = self.arch.sandwich_norms
        if bank.has("layernorms__0"):
            pre_attn, pre_mlp = "layernorms__0", "layernorms__2" if sandwich else "layernorms__1"
        else:  # explicit dimensions
            pre_attn, pre_mlp = "input_layernorm", "post_attention_layernorm"
        a = self._attention(
            bank, layer, ops.norm(bank, pre_attn, x), start, rope, cache, index, training
        )
        if sandwich:
            a = ops.norm(bank, "layernorms__1", a)
        x = x + ops.dropout(a, training)
        m = self._mlp(bank, layer, ops.norm(bank, pre_mlp, x))
        if sandwich:
            m = ops.norm(bank, "layernorms__3", m)
        return x + ops.dropout(m, training)

    def hidden_states(
        self,
        ids: torch.Tensor,
        *,
        start: int = 0,
        cache: KVCache | None = None,
        training: bool = False,
    ) -> torch.Tensor:
        """The final hidden states (after the final norm, for decoders)."""
        x = self.ops.dropout(self._embed(ids, start), training)
        rope = None
        learned = self.embed.has("wpe") or self.embed.has("position_embeddings")
        if self.arch.kind == "decoder" and self.arch.mla is None and not learned:
            rope = self._rope_tables(start, ids.shape[1], self.arch.head_dim, ids.device)
        for i in range(len(self.layers)):
            with self.marks.module(f"layers.{i}"):
                if training and self.plan.checkpointing == "full":
                    x = checkpoint(self._layer, i, x, start, rope, None, True, use_reentrant=False)
                else:
                    x = self._layer(i, x, start, rope, cache, training)
        self.ops.cast_cache.clear()
        for name in ("ln_f", "norm"):
            if self.head.has(name):
                return self.ops.norm(self.head, name, x)
        return x

    def lm_head(self, h: torch.Tensor) -> torch.Tensor:
        own = self.head.has("lm_head") or self.head.has("lm_head__saved")  # a tied head's copy
        head = self.head if own else self.embed
        name = "lm_head" if own else _name(self.arch.embeddings[0])
        logits = self.ops.linear(head, name, h, saved_copy=own or self.shared_head)
        if self.arch.final_softcap:
            # Gemma 2 (transformers Gemma2ForCausalLM.forward): tanh saves its output; the cap's
            # value does not change the memory
            logits = torch.tanh(logits / 30.0) * 30.0
        return logits

    def pooled(self, h: torch.Tensor) -> torch.Tensor:
        """The first token's state, through BERT's pooler when the model has one."""
        if self.head.has("pooler__dense"):
            return torch.tanh(self.ops.linear(self.head, "pooler__dense", h[:, 0]))
        return h[:, 0]

    # ------------------------------------------------------------------------------ cache --

    def allocate_cache(self, sequences: int, context: int, dtype: torch.dtype) -> KVCache:
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor | None] = []
        dev = self.plan.device
        for layer in self.layer_types:
            cap = min(context, layer.window) if layer.window else context
            if self.arch.mla is not None:
                m = self.arch.mla
                keys.append(
                    torch.zeros(
                        sequences,
                        cap,
                        1,
                        m.kv_lora_rank + m.qk_rope_head_dim,
                        dtype=dtype,
                        device=dev,
                    )
                )
                values.append(None)
                continue
            shape = (sequences, cap, self.kv_heads, self.arch.head_dim)
            keys.append(torch.zeros(shape, dtype=dtype, device=dev))
            values.append(torch.zeros(shape, dtype=dtype, device=dev))
        return KVCache(keys, values)
