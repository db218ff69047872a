"""One call of a ``diffusers`` text-to-image pipeline, run with the library's own modules: the
text encoders on token ids, the denoising steps with the pipeline's CFG batch, the VAE decode
through ``AutoencoderKL.decode`` (its own tiling and slicing), and the CPU offload of
``enable_model_cpu_offload`` / ``enable_sequential_cpu_offload`` as accelerate's hooks move
weights.

What runs is each pipeline's ``__call__`` (diffusers 0.42.1) with its tokenizers and scheduler
left out -- fake tensors have no values to tokenize or to index a sigma table with; both
allocate only latent-sized tensors:

* ``StableDiffusionPipeline.__call__`` (``stable_diffusion/pipeline_stable_diffusion.py``):
  ``encode_prompt`` (prompt, then the negative prompt ``""``), ``torch.cat([negative, positive])``
  (line 978), per step ``latent_model_input = torch.cat([latents] * 2)`` (line 1037), the UNet
  (line 1042), ``noise_pred.chunk(2)`` and the guidance sum, ``scheduler.step`` (line 1062), then
  ``vae.decode(latents / scaling_factor)`` (line 1085) and ``postprocess`` (denormalize on the
  device, then ``.cpu()``).
* ``StableDiffusionXLPipeline.__call__``: both CLIP encoders with ``output_hidden_states=True``
  keeping ``hidden_states[-2]`` and the pooled output (lines 405-419), zero negative embeddings
  (line 426), the ``text_time`` added conditions (lines 1151-1153), the VAE upcast to fp32 for
  the decode (lines 1264-1293).
* ``StableDiffusion3Pipeline.__call__``: the CLIP pair and T5 for the prompt and for ``""``
  (lines 440-525), the joint prompt ``cat([clip padded, t5], dim=-2)``, the transformer on the
  CFG batch (line 1074), ``(latents / scaling_factor) + shift_factor`` and the decode (line 1143).
* ``FluxPipeline.__call__``: CLIP pooled and T5 hidden states (lines 254, 300), packed latents
  (``_pack_latents``, line 522), ``guidance`` as an embedding for dev (line 848), a second
  transformer call for true CFG (line 918), ``_unpack_latents`` and the decode (lines 961-964).

Offload (accelerate 1.15.0 ``hooks.py``): ``enable_model_cpu_offload`` chains
``cpu_offload_with_hook`` in ``model_cpu_offload_seq`` order; a component's ``pre_forward``
offloads its predecessor in the chain, then moves itself to the GPU, where it stays until its
successor runs (``CpuOffload.pre_forward``). ``enable_sequential_cpu_offload`` attaches an
``AlignDevicesHook`` to every module that owns parameters: they are on the GPU only during that
module's forward; buffers stay on the GPU (``offload_buffers`` False).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes

from vrambudget.core.diffusion.pipeline import Component, Pipeline
from vrambudget.core.spec.diffusion import ImageGenerationWorkload

from ..marks import Marks
from ..sdpa import cuda_sdpa
from .inventory import TORCH_DTYPES, build_component

__all__ = ["DiffusionProgram", "prepare_diffusion"]

WEIGHTS = "weights"


def _params_and_buffers(module: nn.Module, recurse: bool) -> Iterator[tuple[nn.Module, str, bool]]:
    """(owner, name, is_parameter) of every tensor of ``module``."""
    mods = module.modules() if recurse else iter((module,))
    for m in mods:
        for name, p in m._parameters.items():
            if p is not None:
                yield m, name, True
        for name, b in m._buffers.items():
            if b is not None:
                yield m, name, False


@dataclass
class DiffusionProgram:
    """The pipeline's modules (built on the meta device) and the call to run."""

    workload: ImageGenerationWorkload
    pipeline: Pipeline
    modules: dict[str, nn.Module]
    marks: Marks
    device: torch.device
    emulate: bool = True
    resident: list[str] = field(default_factory=list)
    """Components whose weights are on the device (model offload)."""
    _hooks: list[Any] = field(default_factory=list)

    # ------------------------------------------------------------------ weights on device --

    def _materialize(
        self,
        role: str,
        module: nn.Module,
        recurse: bool,
        params: bool = True,
        buffers: bool = True,
    ) -> None:
        """Allocate ``module``'s tensors on the device (they are meta tensors before); tied
        tensors (T5's shared embedding) get one storage."""
        self.marks.push_scope(WEIGHTS)
        done: dict[int, Any] = {}
        try:
            for owner, name, is_param in _params_and_buffers(module, recurse):
                t = owner._parameters[name] if is_param else owner._buffers[name]
                assert t is not None
                wanted = params if is_param else buffers
                if t.device.type != "meta" or not wanted:
                    continue
                new = done.get(id(t))
                if new is None:
                    empty = torch.empty(t.shape, dtype=t.dtype, device=self.device)
                    new = nn.Parameter(empty, requires_grad=False) if is_param else empty
                    done[id(t)] = new
                    self.marks.tag(new, WEIGHTS, role)
                if is_param:
                    owner._parameters[name] = new  # type: ignore[assignment]
                else:
                    owner._buffers[name] = new
        finally:
            self.marks.pop_scope()

    @staticmethod
    def _offload(module: nn.Module, recurse: bool, buffers: bool = False) -> None:
        """Back to the meta device: the device storage is released (the CPU copy is not
        modelled on the device); tied parameters stay tied. ``buffers``: the buffers too (model
        offload moves the whole module, ``module.to("cpu")``)."""
        done: dict[int, Any] = {}
        for owner, name, is_param in _params_and_buffers(module, recurse):
            if not is_param and not buffers:
                continue
            t = owner._parameters[name] if is_param else owner._buffers[name]
            assert t is not None
            meta = done.get(id(t))
            if meta is None:
                with _disable_current_modes():  # a plain meta tensor, not a recorded fake one
                    empty = torch.empty(t.shape, dtype=t.dtype, device="meta")
                meta = nn.Parameter(empty, requires_grad=False) if is_param else empty
                done[id(t)] = meta
            if is_param:
                owner._parameters[name] = meta  # type: ignore[assignment]
            else:
                owner._buffers[name] = meta

    def _install_offload(self) -> None:
        mode = self.workload.cpu_offload
        if mode == "none":
            for c in self.pipeline.components:
                self._materialize(c.role, self.modules[c.role], recurse=True)
            self.resident = [c.role for c in self.pipeline.components]
        elif mode == "model":
            order = [c.role for c in self.pipeline.components]
            for i, role in enumerate(order):
                prev = order[i - 1] if i else None
                self._hooks.append(
                    self.modules[role].register_forward_pre_hook(self._model_hook(role, prev))
                )
        else:
            for c in self.pipeline.components:
                root = self.modules[c.role]
                self._materialize(c.role, root, recurse=True, params=False)  # buffers stay
                for m in root.modules():
                    if any(p is not None for p in m._parameters.values()):
                        self._hooks.append(m.register_forward_pre_hook(self._seq_pre(c.role)))
                        self._hooks.append(m.register_forward_hook(self._seq_post()))

    def _onload(self, role: str, prev: str | None) -> None:
        """``CpuOffload.pre_forward``: offload the predecessor if it is on the GPU and empty
        the CUDA cache (``clear_device_cache``), then move this component to the GPU."""
        if prev is not None and prev in self.resident:
            self._offload(self.modules[prev], recurse=True, buffers=True)
            self.resident.remove(prev)
            self.marks.empty_cache()
        if role not in self.resident:
            self._materialize(role, self.modules[role], recurse=True)
            self.resident.append(role)

    def _model_hook(self, role: str, prev: str | None) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            self._onload(role, prev)

        return hook

    def _seq_pre(self, role: str) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            self._materialize(role, module, recurse=False, buffers=False)

        return hook

    @staticmethod
    def _seq_post() -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            DiffusionProgram._offload(module, recurse=False)

        return hook

    def free_hooks(self) -> None:
        """``maybe_free_model_hooks``: every component offloaded after the call."""
        if self.workload.cpu_offload == "model":
            for role in list(self.resident):
                self._offload(self.modules[role], recurse=True, buffers=True)
            self.resident.clear()

    # ----------------------------------------------------------------------------- call --

    @property
    def dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.pipeline.dtype]

    def _ids(self, n: int, tokens: int) -> torch.Tensor:
        return torch.zeros(n, tokens, dtype=torch.long, device=self.device)

    def _kernels(self) -> contextlib.AbstractContextManager[None]:
        return cuda_sdpa() if self.emulate else contextlib.nullcontext()

    def run(self, steps: int) -> None:
        """Load, encode the prompt, ``steps`` denoising steps (the steady state shows from the
        second: the previous step's outputs are alive during the next), decode."""
        marks = self.marks
        with self._kernels(), torch.no_grad():
            marks.iteration(0)
            marks.phase("load")
            self._install_offload()
            marks.phase("text_encode")
            cond = self._encode()
            latents = self._latents()
            state: dict[str, Any] = {}
            for i in range(steps):
                marks.iteration(i)
                marks.phase("denoise")
                with marks.module(self.pipeline.denoiser.role):
                    latents = self._step(latents, cond, state)
            state.clear()
            del cond
            marks.phase("vae_decode")
            with marks.module("vae"):
                self._decode(latents)
            self.free_hooks()
        for h in self._hooks:
            h.remove()

    # ---------------------------------------------------------------------------- encode --

    def _clip(self, c: Component, n: int, hidden: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden states for the denoiser, pooled) of a CLIP encoder."""
        with self.marks.module(c.role):
            out = self.modules[c.role](
                self._ids(n, self.pipeline.tokens(c)), output_hidden_states=hidden
            )
        # CLIPTextModelWithProjection's first output is text_embeds (SDXL, SD3 take
        # prompt_embeds[0]); FLUX takes CLIPTextModel's pooler_output (pipeline_flux.py l. 301).
        pooled = out[0] if c.class_name.endswith("Projection") else out.pooler_output
        states = out.hidden_states[-2] if hidden else out[0]
        return states, pooled

    def _t5(self, c: Component, n: int) -> torch.Tensor:
        with self.marks.module(c.role):
            out: torch.Tensor = self.modules[c.role](self._ids(n, self.pipeline.tokens(c)))[0]
        return out.to(self.dtype)

    def _encode(self) -> dict[str, Any]:
        p, b = self.pipeline, self.workload.batch_size
        kind = p.class_name
        if kind == "StableDiffusionPipeline":
            te = p.component("text_encoder")
            embeds = self._clip_last(te, b)
            if p.guidance:
                negative = self._clip_last(te, b)
                embeds = torch.cat([negative, embeds])
            return {"encoder_hidden_states": embeds}
        if kind == "StableDiffusionXLPipeline":
            h1, _ = self._clip(p.component("text_encoder"), b, hidden=True)
            h2, pooled = self._clip(p.component("text_encoder_2"), b, hidden=True)
            embeds = torch.concat([h1, h2], dim=-1)
            time_ids = torch.zeros(b, 6, dtype=self.dtype, device=self.device)
            if p.guidance:
                embeds = torch.cat([torch.zeros_like(embeds), embeds], dim=0)
                pooled = torch.cat([torch.zeros_like(pooled), pooled], dim=0)
                time_ids = torch.cat([time_ids, time_ids], dim=0)
            return {
                "encoder_hidden_states": embeds,
                "added_cond_kwargs": {"text_embeds": pooled, "time_ids": time_ids},
            }
        if kind == "StableDiffusion3Pipeline":
            embeds, pooled = self._sd3_prompt(b)
            if p.guidance:
                neg, neg_pooled = self._sd3_prompt(b)
                embeds = torch.cat([neg, embeds], dim=0)
                pooled = torch.cat([neg_pooled, pooled], dim=0)
            return {"encoder_hidden_states": embeds, "pooled_projections": pooled}
        embeds, pooled = self._flux_prompt(b)
        out: dict[str, Any] = {"encoder_hidden_states": embeds, "pooled_projections": pooled}
        if p.guidance:
            out["negative"] = self._flux_prompt(b)
        return out

    def _clip_last(self, c: Component, n: int) -> torch.Tensor:
        with self.marks.module(c.role):
            out: torch.Tensor = self.modules[c.role](self._ids(n, self.pipeline.tokens(c)))[0]
        return out.to(self.dtype)

    def _sd3_prompt(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.pipeline
        h1, pooled1 = self._clip(p.component("text_encoder"), b, hidden=True)
        h2, pooled2 = self._clip(p.component("text_encoder_2"), b, hidden=True)
        clip = torch.cat([h1, h2], dim=-1)
        t5 = self._t5(p.component("text_encoder_3"), b)
        clip = torch.nn.functional.pad(clip, (0, t5.shape[-1] - clip.shape[-1]))
        return torch.cat([clip, t5], dim=-2), torch.cat([pooled1, pooled2], dim=-1)

    def _flux_prompt(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.pipeline
        _, pooled = self._clip(p.component("text_encoder"), b, hidden=False)
        t5 = self._t5(p.component("text_encoder_2"), b)
        return t5, pooled.to(self.dtype)

    # --------------------------------------------------------------------------- denoise --

    def _latents(self) -> torch.Tensor:
        """``prepare_latents``: (b, c, h, w), or FLUX's packed (b, tokens, c x 2 x 2)."""
        w, p = self.workload, self.pipeline
        c, h, wd = p.latent_dims(w.height, w.width)
        b = w.batch_size
        if p.class_name == "FluxPipeline":
            k = p.patch
            shape: tuple[int, ...] = (b, (h // k) * (wd // k), c * k * k)
        else:
            shape = (b, c, h, wd)
        return torch.empty(shape, dtype=self.dtype, device=self.device)

    def _step(
        self, latents: torch.Tensor, cond: dict[str, Any], state: dict[str, Any]
    ) -> torch.Tensor:
        p = self.pipeline
        model = self.modules[p.denoiser.role]
        if p.class_name == "FluxPipeline":
            b, s, _ = latents.shape
            img_ids = torch.zeros(s, 3, dtype=self.dtype, device=self.device)
            txt_ids = torch.zeros(p.text_tokens, 3, dtype=self.dtype, device=self.device)
            timestep = torch.zeros(b, dtype=self.dtype, device=self.device)
            guidance = (
                torch.full([b], 3.5, dtype=torch.float32, device=self.device)
                if p.denoiser.config.guidance_embeds
                else None
            )
            noise_pred = model(
                hidden_states=latents, timestep=timestep / 1000, guidance=guidance,
                pooled_projections=cond["pooled_projections"],
                encoder_hidden_states=cond["encoder_hidden_states"], txt_ids=txt_ids,
                img_ids=img_ids, return_dict=False,
            )[0]  # fmt: skip
            if "negative" in cond:
                neg, neg_pooled = cond["negative"]
                neg_noise_pred = model(
                    hidden_states=latents, timestep=timestep / 1000, guidance=guidance,
                    pooled_projections=neg_pooled, encoder_hidden_states=neg, txt_ids=txt_ids,
                    img_ids=img_ids, return_dict=False,
                )[0]  # fmt: skip
                noise_pred = neg_noise_pred + 3.5 * (noise_pred - neg_noise_pred)
            state["noise_pred"] = noise_pred
            return self._scheduler_step(noise_pred, latents)
        latent_model_input = torch.cat([latents] * 2) if p.cfg_batch == 2 else latents
        t = torch.zeros((), dtype=torch.long, device=self.device)
        if p.class_name == "StableDiffusion3Pipeline":
            timestep = t.expand(latent_model_input.shape[0])
            noise_pred = model(
                hidden_states=latent_model_input, timestep=timestep,
                encoder_hidden_states=cond["encoder_hidden_states"],
                pooled_projections=cond["pooled_projections"], return_dict=False,
            )[0]  # fmt: skip
        else:
            noise_pred = model(
                latent_model_input, t, encoder_hidden_states=cond["encoder_hidden_states"],
                added_cond_kwargs=cond.get("added_cond_kwargs"), return_dict=False,
            )[0]  # fmt: skip
        state["latent_model_input"] = latent_model_input
        if p.cfg_batch == 2:
            noise_pred_uncond, noise_pred_text = noise_pred.chunk(2)
            state["chunks"] = (noise_pred_uncond, noise_pred_text)
            noise_pred = noise_pred_uncond + 7.0 * (noise_pred_text - noise_pred_uncond)
        state["noise_pred"] = noise_pred
        return self._scheduler_step(noise_pred, latents)

    @staticmethod
    def _scheduler_step(noise_pred: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        """A first-order step (``EulerDiscreteScheduler.step``, ``FlowMatchEulerDiscrete
        Scheduler.step``): the sample upcast to fp32, ``sample + derivative x dt``, cast back."""
        sample = latents.to(torch.float32)
        prev = sample + noise_pred.to(torch.float32) * 0.1
        return prev.to(latents.dtype)

    # ---------------------------------------------------------------------------- decode --

    def _cast_vae(self, dtype: torch.dtype) -> None:
        """``self.vae.to(dtype)`` (SDXL's upcast, ``Module._apply``): per floating tensor a new
        storage in ``dtype``, the old one released; offloaded (meta) weights only change
        dtype."""
        self.marks.push_scope(WEIGHTS)
        try:
            for owner, name, is_param in _params_and_buffers(self.modules["vae"], recurse=True):
                t = owner._parameters[name] if is_param else owner._buffers[name]
                assert t is not None
                if not t.dtype.is_floating_point or t.dtype == dtype:
                    continue
                if t.device.type == "meta":
                    with _disable_current_modes():
                        new = torch.empty(t.shape, dtype=dtype, device="meta")
                else:
                    new = t.detach().to(dtype)
                    self.marks.tag(new, WEIGHTS, "vae")
                if is_param:
                    owner._parameters[name] = nn.Parameter(new, requires_grad=False)
                else:
                    owner._buffers[name] = new
                del t, new
        finally:
            self.marks.pop_scope()

    def _decode(self, latents: torch.Tensor) -> None:
        p, w = self.pipeline, self.workload
        vae: Any = self.modules["vae"]
        upcast = p.vae_decode_dtype != p.dtype
        if upcast:
            self._cast_vae(torch.float32)
        if w.cpu_offload == "model":  # decode is not forward: apply_forward_hook runs the hook
            order = [c.role for c in p.components]
            self._onload("vae", order[order.index("vae") - 1])
        if p.class_name == "FluxPipeline":  # _unpack_latents
            b = latents.shape[0]
            c, h, wd = p.latent_dims(w.height, w.width)
            k = p.patch
            latents = latents.view(b, h // k, wd // k, c, k, k).permute(0, 3, 1, 4, 2, 5)
            latents = latents.reshape(b, c, h, wd)
        vae_dtype = next(iter(vae.parameters())).dtype
        latents = latents.to(vae_dtype) / 0.13
        if p.class_name in ("StableDiffusion3Pipeline", "FluxPipeline"):
            latents = latents + 0.1
        image = vae.decode(latents, return_dict=False)[0]
        del latents
        if upcast:
            self._cast_vae(self.dtype)
        # VaeImageProcessor.postprocess: denormalize on the device, then .cpu().
        image = (image / 2 + 0.5).clamp(0, 1)
        del image


def prepare_diffusion(
    w: ImageGenerationWorkload,
    pipeline: Pipeline,
    marks: Marks,
    device: torch.device,
    emulate: bool = True,
) -> DiffusionProgram:
    """The components built on the meta device with the workload's memory options set (the
    pipeline's own switches: ``set_attention_slice``, ``enable_tiling``, ``enable_slicing``)."""
    modules = {
        c.role: build_component(c.class_name, c.published, pipeline.dtype)
        for c in pipeline.components
    }
    denoiser: Any = modules[pipeline.denoiser.role]
    if w.attention_slicing != "none" and hasattr(denoiser, "set_attention_slice"):
        denoiser.set_attention_slice(w.attention_slicing)  # DiffusionPipeline.set_attention_slice
    vae: Any = modules["vae"]
    if w.vae_tiling:
        vae.enable_tiling()
    if w.vae_slicing:
        vae.enable_slicing()
    return DiffusionProgram(w, pipeline, modules, marks, device, emulate)
