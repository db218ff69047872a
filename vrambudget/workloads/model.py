"""A transformer built from a resolved ``Arch``: the parameter tensors are exactly the
architecture's tensor inventory (``vrambudget.core.families``) sliced for one tensor-parallel
rank, so the weights a trace or a probe allocates are the weights the formulas count.

Forward code follows the families' ``transformers`` modelling code in what it allocates and
saves: pre-norm decoder layers (sandwich norms for Gemma 2/3, QK-norm for Qwen3/Gemma 3), RoPE as
``q * cos + rotate_half(q) * sin``, gated or GELU MLPs, MoE with top-k routing, DeepSeek's latent
attention, GPT-2's learned positions and BERT's post-norm encoder. The norms and attention use
``kernels`` (fused/flash memory behaviour); everything else is plain torch.

Routing in an MoE layer is data dependent, which fake tensors cannot follow: tokens are assumed
balanced over experts (ceil(tokens x top_k / experts) each), the capacity a grouped GEMM sees
on average.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from vrambudget.core.arch import Arch, LayerType, Role, TensorGroup
from vrambudget.core.layout import kv_heads_per_device, per_device_shape
from vrambudget.core.quantization import quantized_roles, tensor_storage
from vrambudget.core.spec import BitsAndBytes4bit, Quantization

from . import kernels
from .marks import Marks

__all__ = ["BuildPlan", "KVCache", "TransformerModel"]

Attention = Literal["sdpa", "flash", "eager"]

# Families whose gated MLP uses GELU (tanh) instead of SiLU (Gemma: hidden_activation
# gelu_pytorch_tanh); memory is the same, the name keeps real runs faithful.
_GELU_FAMILIES = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text"})
_GEMMA_FAMILIES = _GELU_FAMILIES  # RMSNorm weight applied as (1 + w); embeddings x sqrt(h)
_EPS = 1e-6


@dataclass(frozen=True)
class BuildPlan:
    """Everything the builder needs besides the architecture."""

    tensor_parallel: int
    param_dtype: torch.dtype
    """Storage dtype of unquantized parameters."""
    compute_dtype: torch.dtype
    quantization: Quantization | None
    attention: Attention
    device: torch.device
    trainable: Literal["none", "full", "lora"] = "none"
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ()
    adapter_dtype: torch.dtype = torch.float32
    autocast: bool = False
    """fp32 parameters cast to the compute dtype at each use (torch.autocast's weight cache)."""
    dropout: float = 0.0
    checkpointing: Literal["none", "selective", "full"] = "none"


def _name(group: TensorGroup) -> str:
    return group.name.replace(".", "__")


class _Bank(nn.Module):
    """The parameters of one layer (or of the embeddings/head), created from tensor groups."""

    def __init__(self, groups: tuple[TensorGroup, ...], arch: Arch, plan: BuildPlan) -> None:
        super().__init__()
        t = plan.tensor_parallel
        q = plan.quantization
        roles = quantized_roles(q) if q is not None else frozenset()
        self.shapes: dict[str, tuple[int, int]] = {}
        self.quantized: set[str] = set()
        grad = plan.trainable == "full"
        for g in groups:
            rows, cols, count = per_device_shape(g, arch, t, 1)
            name = _name(g)
            self.shapes[name] = (rows, cols)
            shape: tuple[int, ...] = (rows,) if cols == 1 else (rows, cols)
            if g.role is Role.EXPERT:
                shape = (count, rows, cols)
            elif count > 1 and g.role is not Role.NORM:
                shape = (count, *shape)
            if q is not None and g.role in roles:
                n = count if g.role is Role.EXPERT else 1
                payload, meta = tensor_storage(q, rows, cols, 1)
                self.register_buffer(name, torch.empty(n, payload, dtype=torch.uint8,
                                                       device=plan.device))
                self.register_buffer(name + "__meta", torch.empty(n, meta, dtype=torch.uint8,
                                                                  device=plan.device))
                self.quantized.add(name)
                continue
            if g.role is Role.NORM and count > 1:  # e.g. the 2 or 4 norms of a decoder layer
                for i in range(count):
                    self.register_parameter(f"{name}__{i}", nn.Parameter(torch.empty(
                        shape, dtype=plan.param_dtype, device=plan.device), requires_grad=grad))
                continue
            self.register_parameter(name, nn.Parameter(torch.empty(
                shape, dtype=plan.param_dtype, device=plan.device), requires_grad=grad))
        if plan.trainable == "lora":
            for g in groups:
                if g.name.rsplit(".", 1)[-1] in plan.lora_targets and g.role in (
                        Role.LINEAR, Role.EXPERT):
                    rows, cols, count = per_device_shape(g, arch, t, 1)
                    lead = (count,) if g.role is Role.EXPERT else ()
                    r = plan.lora_rank
                    self.register_parameter(_name(g) + "__lora_A", nn.Parameter(torch.empty(
                        (*lead, r, cols), dtype=plan.adapter_dtype, device=plan.device)))
                    self.register_parameter(_name(g) + "__lora_B", nn.Parameter(torch.empty(
                        (*lead, rows, r), dtype=plan.adapter_dtype, device=plan.device)))

    def has(self, name: str) -> bool:
        return hasattr(self, name)


class _Ops:
    """Linear layers, norms and casts shared by every layer; holds the per-forward autocast
    weight cache."""

    def __init__(self, plan: BuildPlan, marks: Marks, rms: bool, norm_offset: float) -> None:
        self.plan = plan
        self.marks = marks
        self.rms = rms
        self.norm_offset = norm_offset
        self.cast_cache: dict[int, torch.Tensor] = {}

    def weight(self, bank: _Bank, name: str) -> torch.Tensor:
        w: torch.Tensor = getattr(bank, name)
        # Parameters stored in another dtype than the compute dtype (autocast, or e.g. fp32
        # weights with fp16 compute) are cast at use, once per forward, as torch.autocast does.
        if w.dtype == self.plan.compute_dtype or not w.is_floating_point():
            return w
        key = id(w)
        cached = self.cast_cache.get(key)
        if cached is None:  # torch.autocast caches the cast of a leaf weight per region
            with self.marks.scope("runtime_workspace"):
                cached = w.to(self.plan.compute_dtype)
            self.cast_cache[key] = cached
        return cached

    def linear(self, bank: _Bank, name: str, x: torch.Tensor) -> torch.Tensor:
        bias = getattr(bank, name + "__bias", None)
        if bias is not None:
            bias = self.weight(bank, name + "__bias")
        rows, cols = bank.shapes[name]
        if name in bank.quantized:
            packed: torch.Tensor = getattr(bank, name)
            if self._dequantizes():
                with self.marks.scope("runtime_workspace"):
                    y = kernels.dequantized_linear(x, packed, rows, cols, bias)
            else:
                y = kernels.packed_linear(x, rows, bias)
        else:
            y = F.linear(x, self.weight(bank, name), bias)
        lora_a = getattr(bank, name + "__lora_A", None)
        if lora_a is None:
            return y
        lora_b = getattr(bank, name + "__lora_B")
        # PEFT LoraLayer.forward: the input is cast to the adapter dtype, lora_B(lora_A(x)) is
        # scaled and added, and the sum is cast back to the base output's dtype.
        xa = x.to(lora_a.dtype)
        z = F.linear(F.linear(xa, lora_a), lora_b) * (2.0 / self.plan.lora_rank)
        return (y + z).to(y.dtype)

    def _dequantizes(self) -> bool:
        return isinstance(self.plan.quantization, BitsAndBytes4bit)

    def norm(self, bank: _Bank, name: str, x: torch.Tensor) -> torch.Tensor:
        w = self.weight(bank, name)
        b = getattr(bank, name + "__bias", None)
        if b is not None:
            b = self.weight(bank, name + "__bias")
        return kernels.fused_norm(x, w, b, eps=_EPS, rms=self.rms, offset=self.norm_offset)

    def dropout(self, x: torch.Tensor, training: bool) -> torch.Tensor:
        p = self.plan.dropout
        return F.dropout(x, p, training=True) if training and p > 0 else x


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers ``apply_rotary_pos_emb``; cos/sin (s, d) broadcast over batch and heads."""
    return x * cos[:, None, :] + _rotate_half(x) * sin[:, None, :]


@dataclass
class KVCache:
    """Preallocated per-layer caches (vLLM/TGI style): keys and values (n, capacity, h_kv, d),
    or DeepSeek's latent (n, capacity, 1, kv_lora_rank + rope_dim). Sliding-window layers hold
    only the window (a ring buffer)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor | None]


class TransformerModel(nn.Module):
    def __init__(self, arch: Arch, plan: BuildPlan, marks: Marks | None = None) -> None:
        super().__init__()
        self.arch = arch
        self.plan = plan
        self.marks = marks or Marks()
        t = plan.tensor_parallel
        self.heads = arch.num_heads // t
        self.kv_heads = self.heads if arch.mla else kv_heads_per_device(arch, t)
        gemma = arch.model_type in _GEMMA_FAMILIES
        self.ops = _Ops(plan, self.marks, rms=arch.norm == "rmsnorm",
                        norm_offset=1.0 if gemma else 0.0)
        self.embed = _Bank(arch.embeddings, arch, plan)
        self.layer_types: list[LayerType] = []
        banks = []
        for layer, n in arch.layer_runs:
            for _ in range(n):
                banks.append(_Bank(layer.tensors, arch, plan))
                self.layer_types.append(layer)
        self.layers = nn.ModuleList(banks)
        self.head = _Bank(arch.head, arch, plan)
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
            x = x + ops.weight(self.embed, pos_name)[start:start + s].to(e)
        if "token_type_embeddings" in names:
            x = x + ops.weight(self.embed, "token_type_embeddings")[0].to(e)
        if a.kind == "encoder":
            x = ops.norm(self.embed, "embeddings__LayerNorm", x)
        return x

    def _rope_tables(self, start: int, s: int, dim: int, device: torch.device
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        e = self.plan.compute_dtype
        steps = torch.arange(0, dim, 2, dtype=torch.float32, device=device)
        inv = 1.0 / torch.pow(10000.0, steps / dim)  # RoPE base 10000 (values only)
        pos = torch.arange(start, start + s, dtype=torch.float32, device=device)
        freqs = torch.outer(pos, inv)
        emb = torch.cat((freqs, freqs), dim=-1)[..., :dim]  # odd head dims: one extra column
        return emb.cos().to(e), emb.sin().to(e)

    # ------------------------------------------------------------------------- attention --

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None,
                training: bool) -> torch.Tensor:
        if self.plan.attention != "eager":
            return kernels.flash_attention(q, k, v, causal=self.arch.kind == "decoder",
                                           window=window)
        if self.plan.checkpointing == "selective" and training:
            # Korthikanti et al. 2022 §5: recompute the attention core instead of saving the
            # s x s scores, probabilities and dropout mask.
            out: torch.Tensor = checkpoint(self._eager, q, k, v, training, use_reentrant=False)
            return out
        return self._eager(q, k, v, training)

    def _eager(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, training: bool
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
            vh = vh[:, :, None].expand(b, hk, h // hk, sk, vh.shape[-1]).reshape(
                b, h, sk, vh.shape[-1])
        scores = torch.matmul(qh, kh.transpose(2, 3)) * (1.0 / math.sqrt(d))
        if self.arch.kind == "decoder" and sq > 1:
            mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).triu_(sk - sq + 1)
            scores = scores.masked_fill(mask, float("-inf"))
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        probs = self.ops.dropout(probs, training)
        return torch.matmul(probs, vh).transpose(1, 2)

    def _attention(self, bank: _Bank, layer: LayerType, x: torch.Tensor, start: int,
                   rope: tuple[torch.Tensor, torch.Tensor] | None, cache: KVCache | None,
                   index: int, training: bool) -> torch.Tensor:
        a, ops = self.arch, self.ops
        b, s, _ = x.shape
        if a.mla is not None:
            return self._mla(bank, layer, x, start, cache, index, training)
        if bank.has("attn__c_attn"):  # GPT-2: fused qkv
            qkv = ops.linear(bank, "attn__c_attn", x)
            q, k, v = qkv.split(qkv.shape[-1] // 3, dim=-1)
            out_name = "attn__c_proj"
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

    def _cache_kv(self, cache: KVCache, index: int, k: torch.Tensor, v: torch.Tensor | None,
                  start: int, window: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new positions into the layer's cache; return the cached keys/values to
        attend to (a prefill attends to its own fresh keys)."""
        ck, cv = cache.keys[index], cache.values[index]
        s = k.shape[1]
        cap = ck.shape[1]
        if start == 0:  # prefill: store (the last `cap` positions of) the prompt
            keep = min(s, cap)
            ck[:, :keep].copy_(k[:, s - keep:])
            if cv is not None and v is not None:
                cv[:, :keep].copy_(v[:, s - keep:])
            return k, v if v is not None else k
        slot = start % cap if window else start
        ck[:, slot:slot + s].copy_(k)
        if cv is not None and v is not None:
            cv[:, slot:slot + s].copy_(v)
        length = min(start + s, cap)
        keys = ck[:, :length]
        return keys, (cv[:, :length] if cv is not None else keys)

    def _mla(self, bank: _Bank, layer: LayerType, x: torch.Tensor, start: int,
             cache: KVCache | None, index: int, training: bool) -> torch.Tensor:
        """DeepSeek-V2/V3 multi-head latent attention. Prefill and training expand the latent
        into per-head keys and values; decode attends in the latent space with the absorbed
        projections (vLLM's MLA decode), reading only the cached latent."""
        a, ops = self.arch, self.ops
        m = a.mla
        assert m is not None
        b, s, _ = x.shape
        heads, nope, rope_d, vd = self.heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
        if bank.has("q_a_proj"):
            q = ops.linear(bank, "q_b_proj", ops.norm(bank, "q_a_layernorm",
                                                      ops.linear(bank, "q_a_proj", x)))
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
                o_lat = kernels.flash_attention(qq, cached, cached[..., :m.kv_lora_rank])
                o = torch.einsum("bshc,hvc->bshv", o_lat, w_uv)
                return ops.linear(bank, "o_proj", o.reshape(b, s, heads * vd))
        kv = ops.linear(bank, "kv_b_proj", latent).reshape(b, s, heads, nope + vd)
        k_nope, v = kv.split((nope, vd), dim=-1)
        qq = torch.cat((q_nope, q_pe), dim=-1)
        kk = torch.cat((k_nope, k_pe.expand(b, s, heads, rope_d)), dim=-1)
        o = self._attend(qq, kk, v.contiguous(), layer.window, training)
        return ops.linear(bank, "o_proj", o.reshape(b, s, heads * vd))

    # ------------------------------------------------------------------------------- MLP --

    def _act(self, x: torch.Tensor) -> torch.Tensor:
        if self.arch.model_type in _GELU_FAMILIES:
            return F.gelu(x, approximate="tanh")
        return F.silu(x)

    def _gated(self, bank: _Bank, prefix: str, x: torch.Tensor) -> torch.Tensor:
        ops = self.ops
        g = self._act(ops.linear(bank, prefix + "gate_proj", x))
        return ops.linear(bank, prefix + "down_proj", g * ops.linear(bank, prefix + "up_proj", x))

    def _mlp(self, bank: _Bank, layer: LayerType, x: torch.Tensor) -> torch.Tensor:
        ops = self.ops
        if layer.moe:
            return self._moe(bank, x)
        if bank.has("mlp__c_fc"):
            return ops.linear(bank, "mlp__c_proj", F.gelu(ops.linear(bank, "mlp__c_fc", x),
                                                          approximate="tanh"))
        if bank.has("intermediate__dense"):
            return ops.linear(bank, "output__dense", F.gelu(ops.linear(
                bank, "intermediate__dense", x)))
        if bank.has("gate_proj"):
            return self._gated(bank, "", x)
        return ops.linear(bank, "fc2", F.gelu(ops.linear(bank, "fc1", x)))

    def _experts(self, bank: _Bank, xe: torch.Tensor) -> torch.Tensor:
        """Grouped GEMM over experts: xe (E, n, h) -> (E, n, h)."""
        ops = self.ops
        out = []
        for name in ("experts__gate_proj", "experts__up_proj"):
            if name in bank.quantized:
                rows, _ = bank.shapes[name]
                out.append(kernels.packed_linear(xe, rows))
            else:
                w = ops.weight(bank, name)
                out.append(torch.bmm(xe, w.transpose(1, 2)) + self._expert_lora(bank, name, xe))
        hidden = self._act(out[0]) * out[1]
        name = "experts__down_proj"
        if name in bank.quantized:
            return kernels.packed_linear(hidden, bank.shapes[name][0])
        w = ops.weight(bank, name)
        return torch.bmm(hidden, w.transpose(1, 2)) + self._expert_lora(bank, name, hidden)

    def _expert_lora(self, bank: _Bank, name: str, x: torch.Tensor) -> torch.Tensor | float:
        a = getattr(bank, name + "__lora_A", None)
        if a is None:
            return 0.0
        b = getattr(bank, name + "__lora_B")
        z = torch.bmm(torch.bmm(x.to(a.dtype), a.transpose(1, 2)), b.transpose(1, 2))
        return (z * (2.0 / self.plan.lora_rank)).to(x.dtype)

    def _moe(self, bank: _Bank, x: torch.Tensor) -> torch.Tensor:
        a = self.arch
        moe = a.moe
        assert moe is not None
        b, s, h = x.shape
        tokens = b * s
        flat = x.reshape(tokens, h)
        logits = F.linear(flat, self.ops.weight(bank, "router"))
        probs = F.softmax(logits, dim=-1, dtype=torch.float32)
        weights, _ = torch.topk(probs, moe.experts_per_token, dim=-1)
        weights = weights.to(x.dtype)
        k, experts = moe.experts_per_token, moe.num_experts
        per_expert = -(-tokens * k // experts)
        routed = flat.repeat_interleave(k, dim=0)  # gathered inputs, one row per (token, k)
        pad = per_expert * experts - tokens * k
        if pad:
            routed = torch.cat((routed, routed.new_zeros(pad, h)))
        ye = self._experts(bank, routed.reshape(experts, per_expert, h))
        ye = ye.reshape(experts * per_expert, h)[:tokens * k].reshape(tokens, k, h)
        y = (ye * weights[..., None]).sum(dim=1)
        if bank.has("shared_experts__gate_proj"):
            shared = self._gated(bank, "shared_experts__", flat)
            if bank.has("shared_expert_gate"):
                shared = torch.sigmoid(F.linear(flat, self.ops.weight(
                    bank, "shared_expert_gate"))) * shared
            y = y + shared
        return y.reshape(b, s, h)

    # ----------------------------------------------------------------------------- layers --

    def _layer(self, index: int, x: torch.Tensor, start: int,
               rope: tuple[torch.Tensor, torch.Tensor] | None, cache: KVCache | None,
               training: bool) -> torch.Tensor:
        bank = cast(_Bank, self.layers[index])  # nn.ModuleList is not generic
        layer = self.layer_types[index]
        ops = self.ops
        if bank.has("attention__output__LayerNorm"):  # BERT: post-norm
            a = ops.dropout(self._attention(bank, layer, x, start, None, None, index, training),
                            training)
            x = ops.norm(bank, "attention__output__LayerNorm", x + a)
            m = ops.dropout(self._mlp(bank, layer, x), training)
            return ops.norm(bank, "output__LayerNorm", x + m)
        if bank.has("ln_1"):  # GPT-2
            a = self._attention(bank, layer, ops.norm(bank, "ln_1", x), start, None, cache,
                                index, training)
            x = x + ops.dropout(a, training)
            m = self._mlp(bank, layer, ops.norm(bank, "ln_2", x))
            return x + ops.dropout(m, training)
        sandwich = self.arch.sandwich_norms
        if bank.has("layernorms__0"):
            pre_attn, pre_mlp = "layernorms__0", "layernorms__2" if sandwich else "layernorms__1"
        else:  # explicit dimensions
            pre_attn, pre_mlp = "input_layernorm", "post_attention_layernorm"
        a = self._attention(bank, layer, ops.norm(bank, pre_attn, x), start, rope, cache,
                            index, training)
        if sandwich:
            a = ops.norm(bank, "layernorms__1", a)
        x = x + ops.dropout(a, training)
        m = self._mlp(bank, layer, ops.norm(bank, pre_mlp, x))
        if sandwich:
            m = ops.norm(bank, "layernorms__3", m)
        return x + ops.dropout(m, training)

    def hidden_states(self, ids: torch.Tensor, *, start: int = 0, cache: KVCache | None = None,
                      training: bool = False) -> torch.Tensor:
        """The final hidden states (after the final norm, for decoders)."""
        x = self.ops.dropout(self._embed(ids, start), training)
        rope = None
        learned = self.embed.has("wpe") or self.embed.has("position_embeddings")
        if self.arch.kind == "decoder" and self.arch.mla is None and not learned:
            rope = self._rope_tables(start, ids.shape[1], self.arch.head_dim, ids.device)
        for i in range(len(self.layers)):
            with self.marks.module(f"layers.{i}"):
                if training and self.plan.checkpointing == "full":
                    x = checkpoint(self._layer, i, x, start, rope, None, True,
                                   use_reentrant=False)
                else:
                    x = self._layer(i, x, start, rope, cache, training)
        self.ops.cast_cache.clear()
        for name in ("ln_f", "norm"):
            if self.head.has(name):
                return self.ops.norm(self.head, name, x)
        return x

    def lm_head(self, h: torch.Tensor) -> torch.Tensor:
        head = self.head if self.head.has("lm_head") else self.embed
        name = "lm_head" if self.head.has("lm_head") else _name(self.arch.embeddings[0])
        return self.ops.linear(head, name, h)

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
                keys.append(torch.zeros(sequences, cap, 1, m.kv_lora_rank + m.qk_rope_head_dim,
                                        dtype=dtype, device=dev))
                values.append(None)
                continue
            shape = (sequences, cap, self.kv_heads, self.arch.head_dim)
            keys.append(torch.zeros(shape, dtype=dtype, device=dev))
            values.append(torch.zeros(shape, dtype=dtype, device=dev))
        return KVCache(keys, values)


def component_of(name: str) -> str:
    """Component of a named parameter or buffer of a ``TransformerModel``."""
    if name.endswith("__meta"):
        return "quantization_metadata"
    if "__lora_" in name:
        return "adapters"
    return "weights"

