"""One pipeline call as the analytic tier walks it: the weights placed as the offload mode
places them, the cuBLAS workspaces at the first GEMM, the prompt encoding, the denoising steps
and the VAE decode, each phase's tensors from :mod:`.text`, :mod:`.unet`, :mod:`.dit` and
:mod:`.vae`.

The pipeline code followed is listed in :mod:`vrambudget.core.diffusion.pipeline` (what each
``__call__`` encodes, keeps and batches); the offload hooks are accelerate 1.15.0's
(``hooks.py`` ``CpuOffload.pre_forward``, lines 748-765): with ``enable_model_cpu_offload`` a
component's first call offloads its predecessor in ``model_cpu_offload_seq`` and empties the
CUDA cache (``clear_device_cache``), then moves the component to the GPU, where it stays until
its successor runs; the VAE's ``decode`` runs the hook through ``apply_forward_hook``. With
``enable_sequential_cpu_offload`` every module's own parameters are on the GPU only during its
forward; the walk counts the largest module of the running component for the whole of its
forward (an upper bound; buffers stay on the GPU).
"""

from __future__ import annotations

from ..dtypes import bytes_of
from ..spec.diffusion import ImageGenerationWorkload
from .dit import flux_forward, sd3_forward
from .pipeline import CLIP_TOKENS, Component, Pipeline
from .text import clip_forward, t5_forward
from .unet import unet_forward
from .vae import vae_decode
from .walk import Walk

__all__ = ["DENOISE_STEPS", "walk_call"]

DENOISE_STEPS = 2
"""Steps walked: the second shows the steady state (the previous step's outputs are alive)."""


class _Placement:
    """Which components' weights are on the device, as the offload mode decides."""

    def __init__(self, w: Walk, p: Pipeline, mode: str) -> None:
        self.w, self.p, self.mode = w, p, mode
        self.handles: dict[str, list[int]] = {}
        self.dtype: dict[str, str] = {c.role: p.dtype for c in p.components}
        self.order = [c.role for c in p.components]

    def load(self, role: str) -> None:
        inv = self.p.component(role).inventory
        self.handles[role] = [
            self.w.alloc(n, "weights", role) for n in inv.tensor_sizes(self.dtype[role])
        ]

    def unload(self, role: str) -> None:
        self.w.free(*self.handles.pop(role))

    def setup(self) -> None:
        if self.mode == "none":
            for role in self.order:
                self.load(role)
        elif self.mode == "sequential":
            for c in self.p.components:  # buffers stay on the device (offload_buffers False)
                inv = c.inventory
                self.handles[c.role] = [
                    self.w.alloc(b.numel * (bytes_of(self.p.dtype) if b.dtype == "float" else 8),
                                 "weights", c.role)
                    for b in inv.buffers
                ]  # fmt: skip

    def call(self, role: str) -> list[int]:
        """Before ``role``'s forward; returns what to free after it (sequential offload)."""
        if self.mode == "model":
            i = self.order.index(role)
            prev = self.order[i - 1] if i else None
            if prev is not None and prev in self.handles:
                self.unload(prev)
                self.w.empty_cache()
            if role not in self.handles:
                self.load(role)
        elif self.mode == "sequential":
            inv = self.p.component(role).inventory
            return [self.w.alloc(inv.largest_module_bytes(self.dtype[role]), "weights", role)]
        return []

    def done(self, scratch: list[int]) -> None:
        self.w.free(*scratch)

    def cast(self, role: str, dtype: str) -> None:
        """``module.to(dtype)``: on the device, per tensor the new copy then the old freed."""
        if self.dtype[role] == dtype:
            return
        old, self.dtype[role] = self.dtype[role], dtype
        if self.mode != "none" and not (self.mode == "model" and role in self.handles):
            return
        inv = self.p.component(role).inventory
        new_sizes = inv.tensor_sizes(dtype)
        handles = self.handles[role]
        fresh = []
        for h, n in zip(handles, new_sizes, strict=False):
            fresh.append(self.w.alloc(n, "weights", role))
            self.w.free(h)
        del old
        self.handles[role] = fresh

    def release(self) -> None:
        for role in list(self.handles):
            self.unload(role)


def _encoder(
    w: Walk, pl: _Placement, p: Pipeline, c: Component, b: int, hidden: bool
) -> tuple[int, int | None]:
    """One text encoder's forward: (the hidden states the pipeline keeps, the pooled output of
    a CLIP tower); everything else is dropped."""
    e = bytes_of(p.dtype)
    scratch = pl.call(c.role)
    w.part = c.role
    s = p.tokens(c)
    if c.class_name == "T5EncoderModel":
        fp32_wo = p.dtype == "fp16"
        out = t5_forward(w, c.config, b, s, e, fp32_wo)
        pl.done(scratch)
        return out, None
    last, kept = clip_forward(w, c.config, b, s, e, hidden)
    pooled = w.alloc(b * (c.config.projection_dim if c.class_name.endswith("Projection")
                          else c.config.hidden_size) * e)  # fmt: skip
    if hidden:
        keep = kept[-2]
        w.free(*[k for k in kept if k != keep], last)
    else:
        keep = last
    pl.done(scratch)
    return keep, pooled


def _prompt(w: Walk, pl: _Placement, p: Pipeline, b: int) -> tuple[int, list[int]]:
    """``encode_prompt`` for one prompt batch: (the denoiser's text states, the other kept
    tensors (pooled embeddings))."""
    e = bytes_of(p.dtype)
    kind = p.class_name
    if kind == "StableDiffusionPipeline":
        h, pooled = _encoder(w, pl, p, p.component("text_encoder"), b, hidden=False)
        if pooled is not None:  # computed by the model, not used (encode_prompt takes [0])
            w.free(pooled)
        return h, []
    if kind == "StableDiffusionXLPipeline":
        h1, p1 = _encoder(w, pl, p, p.component("text_encoder"), b, hidden=True)
        h2, p2 = _encoder(w, pl, p, p.component("text_encoder_2"), b, hidden=True)
        c1, c2 = p.component("text_encoder").config, p.component("text_encoder_2").config
        cat = w.alloc(b * CLIP_TOKENS * (c1.hidden_size + c2.hidden_size) * e)  # torch.concat
        w.free(h1, h2, *(x for x in (p1,) if x is not None))
        return cat, [x for x in (p2,) if x is not None]
    if kind == "StableDiffusion3Pipeline":
        h1, p1 = _encoder(w, pl, p, p.component("text_encoder"), b, hidden=True)
        h2, p2 = _encoder(w, pl, p, p.component("text_encoder_2"), b, hidden=True)
        t5c = p.component("text_encoder_3")
        t5, _ = _encoder(w, pl, p, t5c, b, hidden=False)
        d = t5c.config.d_model
        c1, c2 = p.component("text_encoder").config, p.component("text_encoder_2").config
        clip = w.alloc(b * CLIP_TOKENS * (c1.hidden_size + c2.hidden_size) * e)  # cat, dim=-1
        w.free(h1, h2)
        padded = w.alloc(b * CLIP_TOKENS * d * e)  # F.pad to the T5 width
        w.free(clip)
        joint = w.alloc(b * p.text_tokens * d * e)  # cat([clip, t5], dim=-2)
        w.free(padded, t5)
        pooled = w.alloc(b * (c1.projection_dim + c2.projection_dim) * e)
        w.free(*(x for x in (p1, p2) if x is not None))
        return joint, [pooled]
    _, pooled_clip = _encoder(w, pl, p, p.component("text_encoder"), b, hidden=False)
    t5, _ = _encoder(w, pl, p, p.component("text_encoder_2"), b, hidden=False)
    return t5, [x for x in (pooled_clip,) if x is not None]


def walk_call(
    p: Pipeline,
    wl: ImageGenerationWorkload,
    workspaces: tuple[tuple[str, int], ...],
    steps: int = DENOISE_STEPS,
    flash_hw: bool = True,
) -> Walk:
    """The events of one call of ``wl`` on pipeline ``p`` (one process), on a device with or
    without FlashAttention (``flash_hw``)."""
    w = Walk(flash_hw=flash_hw, bf16=p.dtype == "bf16")
    e = bytes_of(p.dtype)
    b = wl.batch_size
    pl = _Placement(w, p, wl.cpu_offload)
    w.phase("load")
    pl.setup()
    w.phase("text_encode")
    for name, n in workspaces:  # allocated at the first GEMM and kept (CublasHandlePool.cpp)
        w.alloc(n, "runtime_workspace", name)
    cond, extra = _prompt(w, pl, p, b)
    negative: tuple[int, list[int]] | None = None
    if p.guidance:
        if p.encodes_negative:
            negative = _prompt(w, pl, p, b)
        else:  # SDXL: torch.zeros_like of the prompt's embeddings
            negative = (w.alloc(_size(w, cond)), [w.alloc(_size(w, x)) for x in extra])
    if negative is not None and p.cfg_batch == 2:  # torch.cat([negative, positive])
        joined = w.alloc(2 * _size(w, cond))
        joined_extra = [w.alloc(2 * _size(w, x)) for x in extra]
        w.free(cond, negative[0], *extra, *negative[1])
        cond, extra, negative = joined, joined_extra, None
    ch, lh, lw = p.latent_dims(wl.height, wl.width)
    lat = b * ch * lh * lw * e
    latents = w.alloc(lat)  # prepare_latents
    held: list[int] = []
    den = p.denoiser
    for _ in range(steps):
        w.phase("denoise")
        scratch = pl.call(den.role)
        w.part = den.role
        bb = b * p.cfg_batch
        model_in = w.alloc(bb * ch * lh * lw * e) if p.cfg_batch == 2 else None
        preds = []
        for _pass in range(p.denoiser_passes):
            text = p.text_tokens
            if den.class_name == "UNet2DConditionModel":
                out = unet_forward(w, den.config, bb, lh, lw, e, text, wl.attention_slicing)
            elif den.class_name == "SD3Transformer2DModel":
                out = sd3_forward(w, den.config, bb, lh, lw, e, text)
            else:
                out = flux_forward(w, den.config, bb, lh, lw, e, text)
            preds.append(out)
        pl.done(scratch)
        w.free(*held)
        held = [*preds]
        if model_in is not None:
            held.append(model_in)
        if p.cfg_batch == 2 or p.denoiser_passes == 2:  # uncond + g * (text - uncond)
            d1 = w.alloc(lat)
            d2 = w.alloc(lat)
            w.free(d1)
            guided = w.alloc(lat)
            w.free(d2)
            held.append(guided)
        # scheduler.step: the sample in fp32, sample + derivative x dt, cast back.
        lat32 = lat // e * 4
        s32 = w.alloc(lat32)
        n32 = w.alloc(lat32)
        prev = w.alloc(lat32)
        w.free(n32, s32)
        new = w.alloc(lat)
        w.free(prev, latents)
        latents = new
    w.phase("vae_decode")
    w.free(*held, cond, *extra)
    if negative is not None:
        w.free(negative[0], *negative[1])
    vae = p.vae
    decode_dtype = p.vae_decode_dtype
    pl.cast("vae", decode_dtype)
    scratch = pl.call("vae")
    w.part = "vae"
    ed = bytes_of(decode_dtype)
    z = w.alloc(b * ch * lh * lw * ed)  # latents / scaling_factor (+ shift_factor)
    image = vae_decode(w, vae.config, b, lh, lw, ed, wl.vae_tiling, wl.vae_slicing)
    pl.done(scratch)
    w.free(z, latents)
    pl.cast("vae", p.dtype)
    pixels = b * 3 * wl.height * wl.width * ed
    half = w.alloc(pixels)  # postprocess: image / 2 + 0.5
    clamped = w.alloc(pixels)  # .clamp(0, 1), then .cpu()
    w.free(half, clamped, image)
    pl.release()
    return w


def _size(w: Walk, handle: int) -> int:
    return w._sizes[handle]
