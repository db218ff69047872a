"""A model's tensor inventory from the framework's own module tree.

The model is built from its ``config.json`` with ``transformers``' modelling code on the meta
device (shapes and dtypes, no memory): every parameter and buffer, which module owns it, which
names share storage (tied weights), which tensors the loader keeps in fp32 (the model's
``_get_dtype_plan``, the rule ``from_pretrained`` applies: ``modeling_utils.py``
``PreTrainedModel._get_dtype_plan``). A prefill of a few tokens on meta tensors, at two prompt
lengths, then shows what the framework's cache keeps per token (keys and values) and per
sequence (recurrent state): the per-layer cache profile.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from transformers import PreTrainedConfig, PreTrainedModel
from transformers.core_model_loading import build_glob_alternation

from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.inventory import (
    CacheLayer,
    CacheProfile,
    EncoderInfo,
    InvDims,
    InvTensor,
    ModelInventory,
    StateTensor,
)

from .config import LIBRARY, _quiet, _short, build_config, model_class

__all__ = ["build_meta_model", "inventory"]

_INT = re.compile(r"(?<=\.)\d+(?=\.|$)")
LOAD_DTYPE = torch.bfloat16
"""The 16-bit dtype the inventory is built at; tensors that stay in another dtype are marked."""
_PROFILE_LENGTHS = (2, 3)


def build_meta_model(
    cfg: PreTrainedConfig, cls: type[PreTrainedModel], dtype: torch.dtype = LOAD_DTYPE
) -> PreTrainedModel:
    """``cls`` built from ``cfg`` on the meta device, in eval mode."""
    try:
        with _quiet(), torch.device("meta"):
            model: PreTrainedModel = cls._from_config(cfg, dtype=dtype)
    except InvalidWorkload:
        raise
    except Exception as exc:  # noqa: BLE001 - the config is the user's: any refusal is theirs
        raise InvalidWorkload(
            "config", f"{LIBRARY} could not build {cls.__name__}: {_short(exc)}"
        ) from None
    model.eval()
    return model


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _plan_matcher(model: PreTrainedModel, dtype: torch.dtype) -> re.Pattern[str] | None:
    plan = model._get_dtype_plan(dtype)
    if not plan:
        return None
    pattern, _, _ = build_glob_alternation(list(plan.keys()))
    return pattern


def _persistent(model: torch.nn.Module, name: str) -> bool:
    parent_name, _, leaf = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    return leaf not in parent._non_persistent_buffers_set


def _tensors(model: PreTrainedModel) -> Iterator[tuple[str, torch.Tensor, str, bool]]:
    """(name, tensor, kind, persistent) of every parameter and buffer, tied ones once."""
    for name, p in model.named_parameters():
        yield name, p, "parameter", True
    for name, b in model.named_buffers():
        yield name, b, "buffer", _persistent(model, name)


def _owner(model: torch.nn.Module, name: str) -> str:
    parent_name = name.rpartition(".")[0]
    return type(model.get_submodule(parent_name) if parent_name else model).__name__


def _collapse(model: PreTrainedModel) -> tuple[InvTensor, ...]:
    strict = _plan_matcher(model, LOAD_DTYPE)
    at_fp16 = _plan_matcher(model, torch.float16)
    rows: dict[tuple[Any, ...], tuple[set[int], list[int]]] = {}
    for name, t, kind, persistent in _tensors(model):
        pattern = _INT.sub("{}", name)
        floating = t.dtype.is_floating_point
        kept = bool(strict and strict.search(name))
        follows = floating and t.dtype == LOAD_DTYPE and not kept
        fp32_at_fp16 = follows and bool(at_fp16 and at_fp16.search(name))
        dtype = "float32" if kept else _dtype_name(t.dtype)
        key = (pattern, tuple(t.shape), dtype, follows, fp32_at_fp16, kind, persistent,
               _owner(model, name))  # fmt: skip
        entry = rows.setdefault(key, (set(), [0]))
        m = _INT.search(name)
        if m:
            entry[0].add(int(m.group()))
        entry[1][0] += 1
    return tuple(
        InvTensor(
            pattern=k[0],
            shape=k[1],
            dtype=k[2],
            follows=k[3],
            fp32_at_fp16=k[4],
            kind=k[5],
            persistent=k[6],
            module=k[7],
            layers=tuple(sorted(layers)),
            count=count[0],
        )
        for k, (layers, count) in rows.items()
    )


def _tied(model: PreTrainedModel) -> tuple[tuple[str, str], ...]:
    seen: dict[int, str] = {}
    tied: list[tuple[str, str]] = []
    for name, p in model.named_parameters(remove_duplicate=False):
        first = seen.setdefault(id(p), name)
        if first != name:
            tied.append((name, first))
    return tuple(tied)


def _get(cfg: Any, *names: str, default: int = 0) -> int:
    for name in names:
        value = getattr(cfg, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default


def _dims(cfg: PreTrainedConfig) -> InvDims:
    text = cfg.get_text_config(decoder=True)
    h = _get(text, "hidden_size", "d_model", "n_embd", default=1)
    heads = _get(text, "num_attention_heads", "decoder_attention_heads", "n_head", default=1)
    kv = _get(text, "num_key_value_heads", "num_kv_heads", default=heads)
    if getattr(text, "multi_query", False) is True and not getattr(
        text, "new_decoder_architecture", False
    ):
        # Falcon-7B/40B-style and GPTBigCode multi-query attention: one K/V head whatever
        # num_kv_heads says (transformers 5.23.0 models/falcon/modeling_falcon.py line 241:
        # ``config.num_kv_heads if (self.new_decoder_architecture or not self.multi_query)
        # else 1``).
        kv = 1
    head_dim = _get(text, "head_dim", "d_kv", default=max(1, h // max(heads, 1)))
    return InvDims(
        hidden_size=h,
        num_layers=_get(
            text,
            "num_hidden_layers",
            "num_decoder_layers",
            "decoder_layers",
            "num_layers",
            "n_layer",
            default=1,
        ),
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        intermediate_size=_get(
            text,
            "intermediate_size",
            "d_ff",
            "decoder_ffn_dim",
            "n_inner",
            "ffn_dim",
            default=4 * h,
        ),
        vocab_size=_get(text, "vocab_size", default=1),
        max_positions=_get(
            text, "max_position_embeddings", "n_positions", "max_target_positions", default=1 << 40
        ),
        experts_per_token=_get(
            text, "num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k", "moe_k"
        ),
        activation=next(
            (
                a
                for n in ("hidden_act", "activation_function", "hidden_activation")
                if isinstance(a := getattr(text, n, None), str)
            ),
            "",
        ),
    )


def _dims_of(c: Any, default_layers: int = 1) -> InvDims:
    h = _get(c, "hidden_size", "d_model", default=1)
    heads = _get(c, "num_attention_heads", "encoder_attention_heads", "num_heads", default=1)
    return InvDims(
        hidden_size=h,
        num_layers=_get(
            c, "encoder_layers", "num_layers", "num_hidden_layers", default=default_layers
        ),
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=_get(c, "d_kv", "head_dim", default=max(1, h // heads)),
        intermediate_size=_get(c, "encoder_ffn_dim", "d_ff", "intermediate_size", default=4 * h),
        vocab_size=0,
        max_positions=_get(c, "max_source_positions", "max_position_embeddings", default=1 << 40),
    )


def _encoder(
    cfg: PreTrainedConfig, tensors: tuple[InvTensor, ...], dims: InvDims, kind: str
) -> EncoderInfo | None:
    """The encoder or vision tower the config describes (None: a text decoder)."""
    cross = 2 * dims.num_heads * dims.head_dim * dims.num_layers if kind == "encoder_decoder" else 0
    vision = getattr(cfg, "vision_config", None)
    if vision is None and getattr(cfg, "image_size", None) and getattr(cfg, "patch_size", None):
        vision = cfg
    if vision is not None and isinstance(getattr(vision, "patch_size", None), int):
        image, patch = int(vision.image_size), int(vision.patch_size)
        patches = (image // patch) ** 2
        tables = [
            t.shape[-2]  # (positions, hidden), or ViT's (1, positions, hidden)
            for t in tensors
            if "position_embedding" in t.pattern and ("vision" in t.pattern or vision is cfg)
            and len(t.shape) >= 2
        ]  # fmt: skip
        rows = tables[0] if tables else patches
        return EncoderInfo(
            modality="vision",
            dims=_dims_of(vision),
            image_size=image,
            patch_size=patch,
            num_channels=_get(vision, "num_channels", default=3),
            extra_tokens=max(0, rows - patches) if tables else 0,
        )
    if getattr(cfg, "num_mel_bins", None) and getattr(cfg, "max_source_positions", None):
        positions = int(cfg.max_source_positions)
        return EncoderInfo(
            modality="audio",
            dims=_dims_of(cfg),
            num_mel_bins=int(cfg.num_mel_bins),
            frames_per_second=100,  # WhisperFeatureExtractor: hop_length 160 at 16 kHz
            max_frames=2 * positions,
            stride=2,  # WhisperEncoder.conv2: stride 2
            cross_kv_elems=cross,
        )
    if kind == "encoder_decoder":
        return EncoderInfo(modality="text", dims=_dims_of(cfg), cross_kv_elems=cross)
    return None


def _kind(model: PreTrainedModel, cfg: PreTrainedConfig) -> str:
    if getattr(cfg, "is_encoder_decoder", False):
        return "encoder_decoder"
    generates = type(model).__name__.endswith(
        ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel")
    )
    return "decoder" if generates and hasattr(model, "get_output_embeddings") else "encoder"


def _stack(tensors: tuple[InvTensor, ...], dims: InvDims) -> str | None:
    """The main layer stack: the numbered list whose layer count is the text model's, with the
    most parameters (the language model, not a vision tower)."""
    sizes: dict[str, list[int]] = {}
    for t in tensors:
        if "{}" not in t.pattern or t.kind != "parameter":
            continue
        prefix = t.pattern[: t.pattern.index("{}") + 2]
        numel = 1
        for d in t.shape:
            numel *= d
        entry = sizes.setdefault(prefix, [0, 0])
        entry[0] = max(entry[0], max(t.layers, default=-1) + 1)
        entry[1] += numel * t.count
    if not sizes:
        return None
    matching = [p for p, (n, _) in sizes.items() if n == dims.num_layers]
    pool = matching or list(sizes)
    return max(pool, key=lambda p: sizes[p][1])


# ------------------------------------------------------------------------ cache profile --


def _cache_of(output: Any) -> Any:
    for attr in ("past_key_values", "cache_params"):
        cache = getattr(output, attr, None)
        if cache is not None:
            return cache
    return None


def _cache_tensors(obj: Any, prefix: str = "", depth: int = 0) -> Iterator[tuple[str, Any]]:
    if depth > 3:
        return
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            yield from _cache_tensors(v, f"{prefix}[{i}]", depth + 1)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _cache_tensors(v, f"{prefix}.{k}", depth + 1)
    elif hasattr(obj, "__dict__") and not isinstance(obj, torch.nn.Module | type):
        for k, v in vars(obj).items():
            if not k.startswith("__"):
                yield from _cache_tensors(v, f"{prefix}.{k}" if prefix else k, depth + 1)


def _layer_states(layer: Any) -> dict[str, tuple[int, torch.dtype]]:
    return {
        name: (t.numel(), t.dtype)
        for name, t in _cache_tensors(layer)
        if t.dim() > 0 and not name.startswith("_")
    }


def _run(model: PreTrainedModel, tokens: int) -> Any:
    ids = torch.zeros(1, tokens, dtype=torch.long, device="meta")
    with torch.no_grad(), _quiet():
        return _cache_of(model(input_ids=ids, use_cache=True))


def _profile(model: PreTrainedModel, dtype: torch.dtype) -> tuple[CacheProfile | None, str | None]:
    """Per layer: K+V elements per token and the state kept per sequence (meta tensors)."""
    s1, s2 = _PROFILE_LENGTHS
    try:
        a, b = _run(model, s1), _run(model, s2)
    except Exception as exc:  # noqa: BLE001 - a model that needs other inputs: say so, go on
        return None, f"the cache was not profiled ({_short(exc, 160)})"
    if a is None or b is None:
        return None, None
    layers_a = getattr(a, "layers", None)
    layers_b = getattr(b, "layers", None)
    if not layers_a or not layers_b or len(layers_a) != len(layers_b):
        return None, f"the cache ({type(b).__name__}) has no per-layer view; not profiled"
    out: list[CacheLayer] = []
    follows = True
    for la, lb in zip(layers_a, layers_b, strict=True):
        sa, sb = _layer_states(la), _layer_states(lb)
        per_token = 0
        state: list[StateTensor] = []
        for name, (nb, dt) in sb.items():
            na = sa.get(name, (0, dt))[0]
            if nb != na:
                per_token += (nb - na) // (s2 - s1)
                follows = follows and dt == dtype
            else:
                state.append(
                    StateTensor(name=name, numel=nb, dtype=_dtype_name(dt), follows=dt == dtype)
                )
        window = getattr(lb, "sliding_window", None)
        if per_token and isinstance(window, int) and window > 0:
            kind = "sliding"
        elif per_token:
            kind = "full"
            window = None
        elif state:
            kind, window = "recurrent", None
        else:
            kind, window = "none", None
        out.append(
            CacheLayer(
                kind=kind,  # type: ignore[arg-type]
                kv_elems_per_token=per_token,
                window=window if kind == "sliding" else None,
                state=tuple(state),
            )
        )
    return CacheProfile(
        cache_class=type(b).__name__, layers=tuple(out), kv_dtype_follows=follows
    ), None


def inventory(config: Mapping[str, Any], *, profile_cache: bool = True) -> ModelInventory:
    """The inventory of the model ``from_pretrained`` would build for ``config``."""
    cfg = build_config(config)
    cls = model_class(cfg, config)
    model = build_meta_model(cfg, cls)
    tensors = _collapse(model)
    dims = _dims(cfg)
    kind = _kind(model, cfg)
    notes: list[str] = []
    cache = None
    if profile_cache and kind == "decoder":
        cache, note = _profile(model, LOAD_DTYPE)
        if note:
            notes.append(note)
    elif kind == "encoder_decoder":
        notes.append(
            "encoder-decoder: the decoder's self-attention cache follows the config; the "
            "cross-attention cache (encoder length x layers) is sized by the trace tier"
        )
    return ModelInventory(
        encoder=_encoder(cfg, tensors, dims, kind),
        library=LIBRARY,
        architecture=cls.__name__,
        model_type=str(cfg.model_type),
        kind=kind,  # type: ignore[arg-type]
        tensors=tensors,
        stack=_stack(tensors, dims),
        tied=_tied(model),
        dims=dims,
        cache=cache,
        notes=tuple(notes),
    )
