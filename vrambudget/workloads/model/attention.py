"""The attention block (SDPA, flash or eager; GQA, sliding windows, QK-norm, DeepSeek's latent
attention) and the KV cache it writes."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from vrambudget.core.arch import Arch, LayerType

from .. import kernels
from .ops import _Ops, _rope
from .parameters import _Bank
from .plan import BuildPlan

__all__ = ["KVCache"]


@dataclass
class KVCache:
    """Preallocated per-layer caches (vLLM/TGI style): keys and values (n, capacity, h_kv, d),
    or DeepSeek's latent (n, capacity, 1, kv_lora_rank + rope_dim). Sliding-window layers hold
    only the window (a ring buffer)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor | None]


class _AttentionBlock:
    """The attention methods of :class:`~vrambudget.workloads.model.transformer.TransformerModel`
    (which sets these fields)."""

    arch: Arch
    plan: BuildPlan
    ops: _Ops
    heads: int
    kv_heads: int

    # ------------------------------------------------------------------------- attention --

    def _rope_tables(
        self, start: int, s: int, dim: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        e = self.plan.compute_dtype
        steps = torch.arange(0, dim, 2, dtype=torch.float32, device=device)
        inv = 1.0 / torch.pow(10000.0, steps / dim)  # RoPE base 10000 (values only)
        pos = torch.arange(start, start + s, dtype=torch.float32, device=device)
        freqs = torch.outer(pos, inv)
        emb = torch.cat((freqs, freqs), dim=-1)[..., :dim]  # odd head dims: one extra column
        return emb.cos().to(e), emb.sin().to(e)

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None, training: bool
    ) -> torch.Tensor:
        if self.plan.attention != "eager":
            return kernels.flash_attention(
                q, k, v, causal=self.arch.kind == "decoder", window=window
            )
        if self.plan.checkpointing == "selective" and training:
            # Korthikanti et al. 2022 §5: recompute the attention core instead of saving the
            # s x s scores, probabilities and dropout mask.
            out: torch.Tensor = checkpoint(self._eager, q, k, v, training, use_reentrant=False)
            return out
        return self._eager(q, k, v, training)

    def _eager(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, training: bool
    ) -> torch.Tensor:
        """transformers ``eager_attention_forward``: repeat_kv, scores in the compute dtype,
        softmax in fp32 cast back, dropout on the probabilities."""
        b, sq, h, d = q.shape
        sk, hk = k.shape[1], k.shape[2]
        qh = q.transpose(1, 2)
        kh = k.transpose(1, 2)
        vh = v.transpose(1, 2)
        if hk != h:
            kh = kh[:, :, None].expand(b, hk, h // hk, sk, d).reshape(b, h, sk, d)
            vh = (
                vh[:, :, None]
                .expand(b, hk, h // hk, sk, vh.shape[-1])
                .reshape(b, h, sk, vh.shape[-1])
            )
        scores = torch.matmul(qh, kh.transpose(2, 3)) * (1.0 / math.sqrt(d))
        if self.arch.kind == "decoder" and sq > 1:
            mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).triu_(sk - sq + 1)
            scores = scores.masked_fill(mask, float("-inf"))
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        probs = self.ops.dropout(probs, training)
        return torch.matmul(probs, vh).transpose(1, 2)

    def _attention(
        self,
        bank: _Bank,
        layer: LayerType,
        x: torch.Tensor,
        start: int,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        cache: KVCache | None,
        index: int,
        training: bool,
    ) -> torch.Tensor:
        a, ops = self.arch, self.ops
        b, s, _ = x.shape
        if a.mla is not None:
            return self._mla(bank, layer, x, start, cache, index, training)
        if bank.has("attn__c_attn"):  # GPT-2: fused qkv
            qkv = ops.linear(bank, "attn__c_attn", x)
            q, k, v = qkv.split(qkv.shape[-1] // 3, dim=-1)
            out_name = "attn__c_proj"
        elif bank.has("qkv_proj"):  # Phi-3: fused qkv_proj, split by heads (Phi3Attention)
            qkv = ops.linear(bank, "qkv_proj", x)
            q_width = self.heads * a.head_dim
            kv_width = self.kv_heads * a.head_dim
            q, k, v = qkv.split((q_width, kv_width, kv_width), dim=-1)
            out_name = "o_proj"
        elif bank.has("attention__self__query"):  # BERT
            q = ops.linear(bank, "attention__self__query", x)
            k = ops.linear(bank, "attention__self__key", x)
            v = ops.linear(bank, "attention__self__value", x)
            out_name = "attention__output__dense"
        else:
            q = ops.linear(bank, "q_proj", x)
            k = ops.linear(bank, "k_proj", x)
            v = ops.linear(bank, "v_proj", x)
            out_name = "o_proj"
        d = a.head_dim
        q = q.reshape(b, s, self.heads, d)
        k = k.reshape(b, s, self.kv_heads, d)
        v = v.reshape(b, s, self.kv_heads, d)
        if bank.has("q_norm"):
            q = ops.norm(bank, "q_norm", q)
            k = ops.norm(bank, "k_norm", k)
        if rope is not None:
            q = _rope(q, *rope)
            k = _rope(k, *rope)
        if cache is not None:
            k, v = self._cache_kv(cache, index, k, v, start, layer.window)
        o = self._attend(q, k, v, layer.window, training)
        return ops.linear(bank, out_name, o.reshape(b, s, self.heads * d))

    def _cache_kv(
        self,
        cache: KVCache,
        index: int,
        k: torch.Tensor,
        v: torch.Tensor | None,
        start: int,
        window: int | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new positions into the layer's cache; return the cached keys/values to
        attend to (a prefill attends to its own fresh keys)."""
        ck, cv = cache.keys[index], cache.values[index]
        s = k.shape[1]
        cap = ck.shape[1]
        if start == 0:  # prefill: store (the last `cap` positions of) the prompt
            keep = min(s, cap)
            ck[:, :keep].copy_(k[:, s - keep :])
            if cv is not None and v is not None:
                cv[:, :keep].copy_(v[:, s - keep :])
            return k, v if v is not None else k
        slot = start % cap if window else start
        ck[:, slot : slot + s].copy_(k)
        if cv is not None and v is not None:
            cv[:, slot : slot + s].copy_(v)
        length = min(start + s, cap)
        keys = ck[:, :length]
        return keys, (cv[:, :length] if cv is not None else keys)

    def _mla(
        self,
        bank: _Bank,
        layer: LayerType,
        x: torch.Tensor,
        start: int,
        cache: KVCache | None,
        index: int,
        training: bool,
    ) -> torch.Tensor:
        """DeepSeek-V2/V3 multi-head latent attention. Prefill and training expand the latent
        into per-head keys and values; decode attends in the latent space with the absorbed
        projections (vLLM's MLA decode), reading only the cached latent."""
        a, ops = self.arch, self.ops
        m = a.mla
        assert m is not None
        b, s, _ = x.shape
        heads, nope, rope_d, vd = self.heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
        if bank.has("q_a_proj"):
            q = ops.linear(
                bank, "q_b_proj", ops.norm(bank, "q_a_layernorm", ops.linear(bank, "q_a_proj", x))
            )
        else:
            q = ops.linear(bank, "q_proj", x)
        q = q.reshape(b, s, heads, nope + rope_d)
        q_nope, q_pe = q.split((nope, rope_d), dim=-1)
        kv_a = ops.linear(bank, "kv_a_proj_with_mqa", x)
        latent, k_pe = kv_a.split((m.kv_lora_rank, rope_d), dim=-1)
        latent = ops.norm(bank, "kv_a_layernorm", latent.contiguous())
        cos, sin = self._rope_tables(start, s, rope_d, x.device)
        q_pe = _rope(q_pe, cos, sin)
        k_pe = _rope(k_pe.reshape(b, s, 1, rope_d), cos, sin)
        if cache is not None:
            entry = torch.cat((latent.reshape(b, s, 1, m.kv_lora_rank), k_pe), dim=-1)
            cached, _ = self._cache_kv(cache, index, entry, None, start, None)
            if start > 0:  # decode: absorbed attention over the latent cache
                w = ops.weight(bank, "kv_b_proj").reshape(heads, nope + vd, m.kv_lora_rank)
                w_uk, w_uv = w.split((nope, vd), dim=1)
                q_lat = torch.einsum("bshn,hnc->bshc", q_nope, w_uk)
                qq = torch.cat((q_lat, q_pe), dim=-1)
                o_lat = kernels.flash_attention(qq, cached, cached[..., : m.kv_lora_rank])
                o = torch.einsum("bshc,hvc->bshv", o_lat, w_uv)
                return ops.linear(bank, "o_proj", o.reshape(b, s, heads * vd))
        kv = ops.linear(bank, "kv_b_proj", latent).reshape(b, s, heads, nope + vd)
        k_nope, v = kv.split((nope, vd), dim=-1)
        qq = torch.cat((q_nope, q_pe), dim=-1)
        kk = torch.cat((k_nope, k_pe.expand(b, s, heads, rope_d)), dim=-1)
        o = self._attend(qq, kk, v.contiguous(), layer.window, training)
        return ops.linear(bank, "o_proj", o.reshape(b, s, heads * vd))
