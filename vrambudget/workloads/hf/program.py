"""The workloads run through the framework's own code: a ``transformers`` model built from the
model's ``config.json``, generating as ``GenerationMixin.generate`` does and training as
``Trainer`` does, with PEFT's own LoRA wrappers.

Run two ways, like the built-in programs (:mod:`vrambudget.workloads.run`): on fake tensors by
the trace tier (kernels that do not exist on the CPU -- CUDA attention, bitsandbytes and other
quantized GEMMs -- are stand-ins that allocate what they allocate:
:mod:`~vrambudget.workloads.hf.attention`, :mod:`~vrambudget.workloads.hf.quantized`) and for
real by the probe agent.

Generation follows transformers 5.23.0 ``generation/utils.py`` (``_sample``, lines 3122-3270):
a ``DynamicCache`` grown by ``torch.cat`` per layer and step (``cache_utils.py``
``DynamicLayer.update``), ``prepare_inputs_for_generation`` / ``_update_model_kwargs_for_
generation``, ``logits_to_keep=1`` at prefill, the last position's logits copied to fp32
(``outputs.logits[:, -1].to(copy=True, dtype=torch.float32)``), greedy selection and the ids
grown by ``torch.cat``. The trace runs the prefill and the last decode step (the cache resized to
the length it has then); the steps between differ only in length.

Training follows ``trainer.py`` (``training_step``, ``compute_loss``): the model's forward, its
``loss_function`` (``ForCausalLMLoss``: logits upcast to fp32), ``backward``, gradient clipping
(``clip_grad_norm_``, ``max_grad_norm`` 1.0 by default), ``optimizer.step()`` and
``model.zero_grad()`` (gradients set to None). LoRA is ``peft.get_peft_model``; QLoRA quantizes
the base to 4-bit and runs ``prepare_model_for_kbit_training`` first, as TRL's ``SFTTrainer``
does for a 4-bit model -- which casts every other 16-bit parameter to fp32.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch
from msgspec import UNSET
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes

from vrambudget.core.arch import ALL_LINEAR, Arch
from vrambudget.core.catalog import preset
from vrambudget.core.deployed import checkpoint_of, deploy, deployed_quantization
from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.resolve import resolve_model
from vrambudget.core.resolved import ResolvedModel
from vrambudget.core.spec import (
    EncoderWorkload,
    HFConfigModel,
    InferenceWorkload,
    LoRA,
    ModelWorkload,
    PresetModel,
    QLoRA,
    Seq2SeqWorkload,
    SpeechToTextWorkload,
    TrainingWorkload,
    VisionWorkload,
)
from vrambudget.core.statics import effective_precision

from ..marks import Marks
from ..run import TORCH_DTYPES
from ..step import TrainingState, step, training_state
from .attention import attn_implementation, cuda_sdpa, unpadded_batches
from .config import build_config, model_class
from .quantized import quantize_linears

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

__all__ = ["FrameworkProgram", "framework_config", "framework_unsupported", "prepare_framework"]

_MAX_GRAD_NORM = 1.0  # transformers TrainingArguments.max_grad_norm default


def framework_config(model: object) -> dict[str, Any] | None:
    """The ``config.json`` the framework builds the model from (None: a model given by its
    dimensions, which only the built-in builders know)."""
    match model:
        case PresetModel():
            config = preset(model.id).config
            return dict(config) if config is not None else None
        case HFConfigModel() | ResolvedModel():
            return dict(model.config)
    return None


def framework_unsupported(w: ModelWorkload | EncoderWorkload) -> str | None:
    """Why the framework program cannot run ``w`` (None: it can). The built-in builders
    cover these cases: one tensor-parallel rank's shard, explicit dimensions, selective
    recomputation, quantized expert tensors."""
    if framework_config(w.model) is None:
        return "a model given by its dimensions has no config.json for the framework"
    if w.parallelism.tensor > 1:
        return "tensor parallelism: the framework program runs one whole model"
    if isinstance(w, TrainingWorkload) and w.checkpointing == "selective":
        return "selective recomputation is not a transformers option"
    if isinstance(w, TrainingWorkload) and w.checkpointing == "offloaded":
        return "offloaded recomputation keeps layer inputs in host memory, which fake tensors lack"
    if isinstance(w, InferenceWorkload) and w.precision.kv_cache not in (
        "auto",
        w.precision.compute,
    ):
        return "transformers' DynamicCache keeps keys and values in the compute dtype"
    if isinstance(w, InferenceWorkload) and w.prefill_chunk_tokens is not None:
        return "chunked prefill is not generate's default"
    quant = effective_precision(w).quantization
    if quant not in (None, UNSET) and resolve_model(w.model).moe is not None:
        # The stand-ins replace nn.Linear layers; transformers' experts are 3-D parameters.
        return "quantized expert tensors have no stand-in in the framework program"
    return None


def _materialize(model: nn.Module, device: torch.device) -> None:
    """Allocate every parameter and buffer of a meta-device model on ``device`` (in module
    order, tied tensors once, parameter subclasses kept)."""
    done: dict[int, Any] = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is None:
                continue
            new = done.get(id(p))
            if new is None:
                new = type(p)(
                    torch.empty(p.shape, dtype=p.dtype, device=device),
                    requires_grad=p.requires_grad,
                )
                done[id(p)] = new
            module._parameters[name] = new
        for name, b in list(module._buffers.items()):
            if b is None:
                continue
            new = done.get(id(b))
            if new is None:
                new = done[id(b)] = torch.empty(b.shape, dtype=b.dtype, device=device)
            module._buffers[name] = new


def _output_names(model: nn.Module) -> set[str]:
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None  # type: ignore[operator]
    return {name for name, m in model.named_modules() if m is out}


@dataclass
class FrameworkProgram:
    """A model built by the framework, ready to run ``iterations`` times."""

    workload: ModelWorkload | EncoderWorkload
    arch: Arch
    model: nn.Module
    marks: Marks
    device: torch.device
    emulate: bool
    every_decode_step: bool = False
    last_output: torch.Tensor | None = None
    kv_cache_bytes: int | None = None
    kv_rounding: int = 1
    notes: list[str] = field(default_factory=list)
    training: TrainingState | None = None
    """Built at the first training iteration and kept across ``run`` calls (see
    :mod:`vrambudget.workloads.step`)."""

    def outputs_finite(self) -> bool:
        out = self.last_output
        return out is None or bool(torch.isfinite(out.float()).all().item())

    @contextlib.contextmanager
    def _kernels(self) -> Iterator[None]:
        """Emulated: CUDA's SDPA and transformers' mask decisions for unpadded batches."""
        if not self.emulate:
            yield
            return
        with cuda_sdpa(), unpadded_batches():
            yield

    def run(self, iterations: int) -> None:
        # PEFT and transformers call each other's deprecated spellings (FutureWarning).
        with self._kernels(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            if isinstance(self.workload, InferenceWorkload):
                self._inference(self.workload, iterations)
            elif isinstance(self.workload, VisionWorkload):
                self._vision(self.workload, iterations)
            elif isinstance(self.workload, Seq2SeqWorkload | SpeechToTextWorkload):
                self._seq2seq(self.workload, iterations)
            else:
                self._training(self.workload, iterations)

    # ------------------------------------------------------------------------- inference --

    def _tag_cache(self, cache: Any) -> int:
        """Tag the cache's tensors (keys, values, states) as the KV cache; their bytes."""
        total = 0
        r = self.kv_rounding
        for t in _cache_tensors(cache):
            self.marks.tag(t, "kv_cache", "cache")
            total += -(-t.untyped_storage().nbytes() // r) * r
        return total

    def _ids(self, n: int, s: int) -> torch.Tensor:
        return torch.zeros(n, s, dtype=torch.long, device=self.device)

    @torch.no_grad()
    def _inference(self, w: InferenceWorkload, iterations: int) -> None:
        model, marks = self.model, self.marks
        n = w.num_sequences
        if self.arch.kind == "encoder":
            for it in range(iterations):
                marks.iteration(it)
                marks.phase("forward")
                out = model(input_ids=self._ids(n, w.prompt_tokens), return_dict=True)
                first = out[0] if isinstance(out, tuple) else next(iter(out.values()))
                self.last_output = first.detach().reshape(-1)[:8].clone()
                del out, first
            return
        from transformers import DynamicCache

        # generate passes logits_to_keep=1 (utils.py 2950-2954); logits "all" asks for every
        # position's (scoring a prompt), as a forward without it computes them.
        supports = model._supports_logits_to_keep()  # type: ignore[operator]
        keep = {"logits_to_keep": 1} if supports and w.logits == "last" else {}
        for it in range(iterations):
            marks.iteration(it)
            marks.phase("prefill")
            ids = self._ids(n, w.prompt_tokens)
            kwargs: dict[str, Any] = {
                "past_key_values": DynamicCache(config=_config(model)),
                "use_cache": True,
                "attention_mask": torch.ones(
                    n, w.prompt_tokens, dtype=torch.long, device=self.device
                ),
                **keep,
            }
            ids, kwargs = self._step(ids, kwargs, first=True)
            self.kv_cache_bytes = self._tag_cache(kwargs["past_key_values"])
            if w.generated_tokens == 0:
                continue
            marks.phase("decode")
            last = w.context_tokens - 1
            # The trace runs the last step only: its cache is the largest, and the steps before
            # differ only in length (real runs decode every step).
            positions = range(w.prompt_tokens, last + 1) if self.every_decode_step else [last]
            for pos in positions:
                if ids.shape[1] < pos:  # skip ahead: the state generate has at this position
                    ids, kwargs = self._fast_forward(kwargs, n, pos)
                ids, kwargs = self._step(ids, kwargs, first=False)
                self.kv_cache_bytes = self._tag_cache(kwargs["past_key_values"])
            del kwargs

    def _step(
        self, ids: torch.Tensor, kwargs: dict[str, Any], *, first: bool
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """One iteration of ``_sample``: forward, cache update, the last logits to fp32, the
        next token appended."""
        model = self.model
        inputs = (
            model.prepare_inputs_for_generation(ids, is_first_iteration=True, **kwargs)  # type: ignore[operator]
            if first
            else model.prepare_inputs_for_generation(ids, next_sequence_length=1, **kwargs)  # type: ignore[operator]
        )
        out = model(**inputs, return_dict=True)
        kwargs = model._update_model_kwargs_for_generation(  # type: ignore[operator]
            out, kwargs, is_encoder_decoder=False
        )
        with self.marks.scope("logits"):
            self.marks.tag(out.logits, "logits")
            logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)
            tokens = torch.argmax(logits, dim=-1)
            self.last_output = logits[..., :8].clone()
            ids = torch.cat([ids, tokens[:, None]], dim=-1)
        del out, logits, tokens
        return ids, kwargs

    def _fast_forward(
        self, kwargs: dict[str, Any], n: int, pos: int
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """The ids, mask and cache as ``generate`` holds them before position ``pos``: every
        full-attention layer's keys and values ``pos`` long, a sliding layer's its window - 1
        (``DynamicSlidingWindowLayer.update``); recurrent states as they are."""
        cache = kwargs["past_key_values"]
        with self.marks.scope("kv_cache"):
            for layer in getattr(cache, "layers", ()):
                keys = getattr(layer, "keys", None)
                if not isinstance(keys, torch.Tensor) or keys.dim() != 4:
                    continue
                window = getattr(layer, "sliding_window", None)
                length = min(pos, window - 1) if isinstance(window, int) else pos
                values = layer.values
                layer.keys = None
                layer.values = None
                layer.keys = keys.new_empty(*keys.shape[:2], length, keys.shape[3])
                layer.values = values.new_empty(*values.shape[:2], length, values.shape[3])
                del keys, values
                if hasattr(layer, "cumulative_length"):
                    layer.cumulative_length = pos
        kwargs["attention_mask"] = torch.ones(n, pos, dtype=torch.long, device=self.device)
        return self._ids(n, pos), kwargs

    # ------------------------------------------------------------- images, audio, seq2seq --

    def _compute_dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.workload.precision.compute]

    @torch.no_grad()
    def _vision(self, w: VisionWorkload, iterations: int) -> None:
        """The image model's forward (``get_image_features`` of a two-tower model such as
        CLIP / SigLIP, else the model's own forward) on a batch of images."""
        info = _vision_config(self.model)
        side = w.image_size or int(info.image_size)
        model = self.model
        for it in range(iterations):
            self.marks.iteration(it)
            self.marks.phase("forward")
            pixels = torch.zeros(
                w.batch_size, int(getattr(info, "num_channels", 3)), side, side,
                dtype=self._compute_dtype(), device=self.device,
            )  # fmt: skip
            if hasattr(model, "get_image_features"):
                out = model.get_image_features(pixel_values=pixels)  # type: ignore[operator]
            else:
                out = model(pixel_values=pixels, return_dict=True)
            first = out if isinstance(out, torch.Tensor) else next(iter(out.values()))
            self.last_output = first.detach().reshape(-1)[:8].clone()
            del out, first, pixels

    def _encoder_inputs(self, w: Seq2SeqWorkload | SpeechToTextWorkload) -> dict[str, Any]:
        if isinstance(w, SpeechToTextWorkload):
            cfg = _config(self.model)
            frames = 2 * int(cfg.max_source_positions)
            features = torch.zeros(
                w.batch_size * w.windows, int(cfg.num_mel_bins), frames,
                dtype=self._compute_dtype(), device=self.device,
            )  # fmt: skip
            return {"input_features": features}
        return {"input_ids": self._ids(w.batch_size, w.input_tokens)}

    @torch.no_grad()
    def _seq2seq(self, w: Seq2SeqWorkload | SpeechToTextWorkload, iterations: int) -> None:
        """``generate`` of an encoder-decoder: the encoder once (its output kept in
        ``model_kwargs["encoder_outputs"]``), then the decoder token by token with an
        ``EncoderDecoderCache`` (self-attention cache growing, cross-attention cache computed
        at the first step); the first decode step and the last are traced."""
        from transformers import DynamicCache, EncoderDecoderCache

        model, marks = self.model, self.marks
        for it in range(iterations):
            marks.iteration(it)
            marks.phase("encode")
            inputs = self._encoder_inputs(w)
            encoder_outputs = model.get_encoder()(**inputs, return_dict=True)  # type: ignore[operator]
            del inputs
            n = encoder_outputs.last_hidden_state.shape[0]
            if w.generated_tokens == 0:
                del encoder_outputs
                continue
            marks.phase("decode")
            cache = EncoderDecoderCache(
                DynamicCache(config=_config(model)), DynamicCache(config=_config(model))
            )
            positions = sorted({1, w.generated_tokens})
            decoded = 0
            for pos in positions:
                if decoded and pos > decoded + 1:
                    self._fast_forward_self(cache.self_attention_cache, pos - 1)
                out = model(
                    encoder_outputs=encoder_outputs,
                    decoder_input_ids=self._ids(n, 1),
                    past_key_values=cache,
                    use_cache=True,
                    return_dict=True,
                )
                decoded = pos
                with marks.scope("logits"):
                    marks.tag(out.logits, "logits")
                    logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)
                    self.last_output = logits[..., :8].clone()
                del out, logits
                self.kv_cache_bytes = self._tag_cache(cache.self_attention_cache) + (
                    self._tag_cache(cache.cross_attention_cache)
                )
            del cache, encoder_outputs

    def _fast_forward_self(self, cache: Any, length: int) -> None:
        """The self-attention cache as generate holds it after ``length`` tokens."""
        with self.marks.scope("kv_cache"):
            for layer in getattr(cache, "layers", ()):
                keys = getattr(layer, "keys", None)
                if not isinstance(keys, torch.Tensor) or keys.dim() != 4:
                    continue
                values = layer.values
                layer.keys = layer.values = None
                layer.keys = keys.new_empty(*keys.shape[:2], length, keys.shape[3])
                layer.values = values.new_empty(*values.shape[:2], length, values.shape[3])
                del keys, values

    # -------------------------------------------------------------------------- training --

    def _training(self, w: TrainingWorkload, iterations: int) -> None:
        model, marks = self.model, self.marks
        model.train()
        if self.training is None:
            self.training = training_state(model, w, marks)
        params, masters, opt = self.training.params, self.training.masters, self.training.opt
        micro_batches = min(w.gradient_accumulation_steps, 2)
        autocast = (
            torch.autocast(device_type=self.device.type, dtype=TORCH_DTYPES[w.precision.compute])
            if w.mixed_precision == "autocast"
            else contextlib.nullcontext()
        )
        for it in range(iterations):
            marks.iteration(it)
            for _ in range(micro_batches):
                marks.phase("forward")
                with autocast:
                    loss = self._loss(w)
                self.last_output = loss.detach()
                marks.phase("backward")
                # The backward starts in the loss and the LM head (the logits' gradients); it
                # leaves them when the gradient of the LM head's input exists.
                with marks.scope("logits" if self.arch.kind == "decoder" else "activations"):
                    loss.backward()
                del loss
            step(opt, params, masters, marks, max_grad_norm=_MAX_GRAD_NORM)
            model.zero_grad(set_to_none=True)  # Trainer: model.zero_grad() after the step

    _head_input: torch.Tensor | None = None

    def _leave_logits(self, grad: torch.Tensor) -> None:
        self.marks.pop_scope()
        self.marks.push_scope("activations")

    def watch_head(self) -> None:
        """Keep the LM head's input of each forward (to switch scope in the backward)."""
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model  # type: ignore[operator]
        head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None  # type: ignore[operator]
        if head is None:
            return

        def hook(module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
            self._head_input = args[0] if args else None

        head.register_forward_hook(hook)

    def _loss(self, w: TrainingWorkload) -> torch.Tensor:
        """``Trainer.compute_loss``: the forward without labels, then the model's own
        ``loss_function`` on its logits (the same ops ``forward(labels=...)`` runs, outside it
        so the logits' bytes are attributed)."""
        model = self.model
        ids = self._ids(w.micro_batch_size, w.sequence_length)
        out = model(input_ids=ids, use_cache=False, return_dict=True)
        if self.arch.kind == "encoder":
            first: torch.Tensor = out[0] if isinstance(out, tuple) else next(iter(out.values()))
            return first.float().pow(2).mean()
        with self.marks.scope("logits"):
            logits = out.logits
            self.marks.tag(logits, "logits")
            hidden = self._head_input
            self._head_input = None
            if hidden is not None and hidden.requires_grad:
                hidden.register_hook(self._leave_logits)
            del out
            base: nn.Module = model.get_base_model() if hasattr(model, "get_base_model") else model  # type: ignore[operator]
            loss: torch.Tensor = base.loss_function(  # type: ignore[operator]
                logits=logits, labels=ids, vocab_size=_config(base).vocab_size
            )
        return loss


def _config(model: nn.Module) -> PreTrainedConfig:
    """A transformers model's config (``Module.__getattr__`` types it as a tensor or module)."""
    return cast("PreTrainedConfig", model.config)


def _vision_config(model: nn.Module) -> Any:
    cfg = _config(model)
    return getattr(cfg, "vision_config", None) or cfg


def _cache_tensors(cache: Any) -> Iterator[torch.Tensor]:
    for layer in getattr(cache, "layers", ()):
        for value in vars(layer).values():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                yield value
            elif isinstance(value, list | tuple):
                for v in value:
                    if isinstance(v, torch.Tensor) and v.dim() > 0:
                        yield v


# ---------------------------------------------------------------------------------- build --


def _quantization_keep(model: nn.Module, w: ModelWorkload | EncoderWorkload) -> Any:
    """Which linear layers stay unquantized: the output embedding (unless the scheme says
    otherwise), the checkpoint's ``modules_to_not_convert`` / ``ignore``, MoE routers and the
    vision/audio towers (transformers ``get_keys_to_not_convert`` and the quantizers'
    defaults)."""
    q = effective_precision(w).quantization
    ckpt = checkpoint_of(w.model)
    stored = ckpt.quantization if ckpt is not None else None
    outputs = _output_names(model)

    def keep(name: str, module: nn.Linear) -> bool:
        if name in outputs and not getattr(q, "quantize_lm_head", False):
            return True
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("gate", "router") and module.out_features < 1024:
            return True
        if any(k in name for k in ("vision", "visual", "audio", "multi_modal_projector")):
            return True
        return stored is not None and stored.leaves_unquantized(name)

    return keep


def prepare_framework(
    w: ModelWorkload | EncoderWorkload,
    arch: Arch,
    marks: Marks,
    device: torch.device,
    *,
    emulate: bool,
    checkpoint: str | None = None,
) -> FrameworkProgram:
    """Build the model with the framework (phase ``load``) and return the program.

    ``checkpoint``: a directory of the real weights (unquantized deployments only), loaded by
    ``from_pretrained`` onto ``device`` (real runs; otherwise the parameters are allocated
    uninitialized, in module order, for the caller to fill)."""
    w = deploy(w)
    reason = framework_unsupported(w)
    if reason is not None:
        raise InvalidWorkload("model", f"the framework program cannot run this: {reason}")
    config = framework_config(w.model)
    assert config is not None
    cfg = build_config(config, "model.config")
    cls = model_class(cfg, config)
    cfg._attn_implementation = attn_implementation(w.attention, emulate)
    fallback: str | None = None
    param_dtype = TORCH_DTYPES[w.precision.weights]
    training = isinstance(w, TrainingWorkload)
    from .config import _quiet

    quant = deployed_quantization(effective_precision(w).quantization)
    # Built on the meta device outside any fake-tensor mode (no memory, no recording), quantized
    # and wrapped there, then allocated in module order: as from_pretrained loads tensor by
    # tensor, nothing full-precision is ever allocated for a quantized layer.
    with _disable_current_modes(), _quiet(), torch.device("meta"):
        try:
            model = cls._from_config(cfg, dtype=param_dtype)
        except ValueError as exc:  # the class refuses this attention (Gemma 2 has no SDPA)
            if "attention implementation" not in str(exc):
                raise
            cfg._attn_implementation = None
            model = cls._from_config(cfg, dtype=param_dtype)
            fallback = f"{cls.__name__} does not run attention {w.attention!r}: " + (
                f"transformers' default {model.config._attn_implementation!r} ran"
            )
        if quant is not None:
            quantize_linears(model, quant, _quantization_keep(model, w), param_dtype)
            qlora = isinstance(w, TrainingWorkload) and isinstance(w.method, QLoRA)
            model.is_loaded_in_4bit = qlora
        if training:
            model = _prepare_training(model, w)  # type: ignore[arg-type]
        else:
            model.eval()
    marks.phase("load")
    if checkpoint is not None:
        if quant is not None:
            raise InvalidWorkload(
                "model", "real weights of a quantized deployment need the format's kernels"
            )
        with marks.scope("weights"), _quiet():
            model = _from_pretrained(cls, checkpoint, cfg, param_dtype, device)
        if training:
            model = _prepare_training(model, w)  # type: ignore[arg-type]
        else:
            model.eval()
    else:
        with marks.scope("weights"):
            _materialize(model, device)
    for name, p in model.named_parameters():
        trained = "lora_" in name or ".modules_to_save." in name
        marks.tag(p, "adapters" if trained else "weights", name)
    for name, b in model.named_buffers():
        marks.tag(b, "quantization_metadata" if name.endswith("quant_meta") else "weights", name)
    program = FrameworkProgram(w, arch, model, marks, device, emulate)
    if fallback:
        program.notes.append(fallback)
    if training:
        program.watch_head()
    return program


def _from_pretrained(
    cls: Any, path: str, cfg: Any, dtype: torch.dtype, device: torch.device
) -> nn.Module:
    """The real weights, loaded as transformers loads them (straight onto a CUDA device)."""
    kwargs: dict[str, Any] = {"config": cfg, "dtype": dtype}
    if device.type == "cuda":
        kwargs["device_map"] = {"": device}
    model = cls.from_pretrained(path, **kwargs)
    if device.type != "cuda":
        # On the CPU transformers leaves the tensors in the safetensors files' memory maps,
        # which no allocator sees; copied into owned memory, as a GPU holds them.
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                t.data = t.data.to(device).clone()
    return cast(nn.Module, model)


def _prepare_training(model: nn.Module, w: TrainingWorkload) -> nn.Module:
    """What a fine-tuning script does before ``Trainer``: gradient checkpointing, and for
    LoRA / QLoRA the PEFT recipe; the model to train (PEFT's wrapper for LoRA)."""
    method = w.method
    if w.checkpointing == "full":
        model.activation_checkpointing_enable(  # type: ignore[operator]
            activation_checkpointing_kwargs={"use_reentrant": False}
        )
    if not isinstance(method, LoRA):
        for p in model.parameters():
            p.requires_grad_(p.dtype.is_floating_point)
        return model
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if isinstance(method, QLoRA):
        with warnings.catch_warnings():  # PEFT calls transformers' deprecated spellings
            warnings.simplefilter("ignore", FutureWarning)
            prepare_model_for_kbit_training(
                model,
                use_gradient_checkpointing=w.checkpointing == "full",
                gradient_checkpointing_kwargs={"use_reentrant": False},
            )
    lora = LoraConfig(
        r=method.rank,
        lora_alpha=2 * method.rank,
        # PEFT reads its shorthand only as the whole string
        target_modules=ALL_LINEAR
        if ALL_LINEAR in method.target_modules
        else list(method.target_modules),
        lora_dropout=method.dropout,
        bias="none",
        modules_to_save=list(method.modules_to_save) or None,
        ensure_weight_tying=method.ensure_weight_tying,
    )
    with warnings.catch_warnings():  # PEFT calls transformers' deprecated spellings
        warnings.simplefilter("ignore", FutureWarning)
        # null: as the installed PEFT leaves them (its autocast_adapter_dtype default)
        peft_model = get_peft_model(
            model, lora, autocast_adapter_dtype=method.adapter_dtype in ("fp32", None)
        )
    if method.adapter_dtype not in ("fp32", None):
        dtype = TORCH_DTYPES[method.adapter_dtype]
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.data = p.data.to(dtype)
    return peft_model
