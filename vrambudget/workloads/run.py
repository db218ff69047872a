"""The workload programs: inference (prefill, then decode with a preallocated KV cache) and
training (forward, backward, optimizer step), driven by the same wire spec the service takes.

Both are written once and run two ways: on fake tensors by the trace tier and for real by the
probe agent. They report phases and component tags to a ``Marks`` observer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vrambudget.core.arch import Arch
from vrambudget.core.deployed import adapter_dtype_of, deploy, deployed_quantization
from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.spec import (
    Adafactor,
    InferenceWorkload,
    LoRA,
    QLoRA,
    TrainingWorkload,
)
from vrambudget.core.stack import Stack, resolve_stack
from vrambudget.core.statics import effective_precision

from .marks import Marks
from .model import BuildPlan, TransformerModel, component_of
from .step import TrainingState, step, training_state

__all__ = [
    "TORCH_DTYPES",
    "Program",
    "build_plan",
    "check_traceable",
    "initialize",
    "prepare",
]

TORCH_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


def check_traceable(w: InferenceWorkload | TrainingWorkload, field: str) -> None:
    """What the workload programs run: one device of a tensor-parallel group (no pipeline,
    expert or ZeRO sharding, no offload), whole-prompt prefill."""
    par = w.parallelism
    unsupported = [
        (par.pipeline > 1, "parallelism.pipeline", "must be 1 (one pipeline stage is traced)"),
        (par.expert > 1, "parallelism.expert", "must be 1"),
        (par.zero_stage > 0, "parallelism.zero_stage", "must be 0"),
        (par.sequence_parallel, "parallelism.sequence_parallel", "must be false"),
    ]
    if isinstance(w, TrainingWorkload):
        unsupported.append(
            (
                w.checkpointing == "offloaded",
                "checkpointing",
                "must not be 'offloaded' (the trace runs on fake CPU tensors, where host and "
                "device memory are one)",
            )
        )
    if isinstance(w, InferenceWorkload):
        unsupported.append(
            (
                w.prefill_chunk_tokens is not None,
                "prefill_chunk_tokens",
                "must be null (chunked prefill is not traced)",
            )
        )
    else:
        unsupported.append(
            (
                isinstance(w.optimizer, Adafactor),
                "optimizer.name",
                "must not be 'adafactor' (torch.optim.Adafactor reads tensor "
                "values, which fake tensors do not have)",
            )
        )
    for bad, name, message in unsupported:
        if bad:
            raise InvalidWorkload(f"{field}.{name}", f"{message} with method 'trace'")
    if w.precision.weights == "fp8":
        raise InvalidWorkload(
            f"{field}.precision.weights", "'fp8' is not traced: use quantization {scheme: fp8}"
        )


def build_plan(
    w: InferenceWorkload | TrainingWorkload,
    device: torch.device,
    stack: Stack | None = None,
) -> BuildPlan:
    """What the builders need, under the request's ``stack`` (None: the default stack, as an
    estimate that names no software assumes): the framework's norm a training program imitates
    (:attr:`Stack.rms_norm`; inference programs run the fused norm, as the inference formulas
    count it), and whether routed experts are modules that LoRA targets and bitsandbytes reach
    (:attr:`Stack.lora_reaches_experts`, through :func:`effective_precision`)."""
    p = w.precision
    st = stack or resolve_stack(None)
    plan = BuildPlan(
        tensor_parallel=w.parallelism.tensor,
        param_dtype=TORCH_DTYPES[p.weights],
        compute_dtype=TORCH_DTYPES[p.compute],
        quantization=deployed_quantization(effective_precision(w, stack).quantization),
        attention=w.attention,
        device=device,
    )
    if isinstance(w, InferenceWorkload):
        return plan
    m = w.method
    lora = isinstance(m, LoRA)
    return dataclasses.replace(
        plan,
        trainable="lora" if lora else "full",
        lora_rank=m.rank if isinstance(m, LoRA) else 0,
        lora_targets=tuple(m.target_modules) if isinstance(m, LoRA) else (),
        lora_experts=st.lora_reaches_experts,
        saved_modules=tuple(m.modules_to_save) if isinstance(m, LoRA) else (),
        saved_fp16_to_fp32=st.saved_fp16_to_fp32,
        tie_saved_head=isinstance(m, LoRA) and m.ensure_weight_tying,
        adapter_dtype=TORCH_DTYPES[adapter_dtype_of(w, st)]
        if isinstance(m, LoRA)
        else torch.float32,
        autocast=w.mixed_precision == "autocast",
        dropout=0.1 if w.dropout else 0.0,
        # offloading is refused by check_traceable; a caller that skips it gets the layer
        # inputs on the device (full recomputation): an upper bound
        checkpointing="full" if w.checkpointing == "offloaded" else w.checkpointing,
        kbit_fp32=isinstance(m, QLoRA),
        rms_norm=st.rms_norm,
        composed_activations=st.transformers_modules,
    )


def _tag_model(model: TransformerModel, marks: Marks) -> None:
    for name, p in model.named_parameters():
        marks.tag(p, component_of(name), name)
    for name, b in model.named_buffers():
        marks.tag(b, component_of(name), name)


@dataclass
class Program:
    """A built workload ready to run ``iterations`` times."""

    workload: InferenceWorkload | TrainingWorkload
    arch: Arch
    model: TransformerModel
    marks: Marks
    device: torch.device
    every_decode_step: bool = False
    """Real runs decode every token; the trace runs the first and the last decode step (the
    steps between differ only in the attended length)."""
    last_output: torch.Tensor | None = None
    """The last logits (inference) or loss (training), for the output sanity check."""
    kv_cache_bytes: int | None = None
    """Bytes of the KV cache tensors the last inference run allocated, each rounded up to
    ``kv_rounding`` (512 on CUDA: the caching allocator's block size)."""
    kv_rounding: int = 1
    training: TrainingState | None = None
    """The training loop's parameters, masters and optimizer, built at the first training
    iteration and kept across ``run`` calls (as a training loop keeps them)."""

    def outputs_finite(self) -> bool:
        out = self.last_output
        return out is None or bool(torch.isfinite(out.float()).all().item())

    def run(self, iterations: int) -> None:
        if isinstance(self.workload, InferenceWorkload):
            self._inference(self.workload, iterations)
        else:
            self._training(self.workload, iterations)

    # ------------------------------------------------------------------------- inference --

    def _ids(self, n: int, s: int) -> torch.Tensor:
        return torch.zeros(n, s, dtype=torch.long, device=self.device)

    def _logits(self, h: torch.Tensor, every_position: bool) -> torch.Tensor:
        with self.marks.scope("logits"):
            rows = h if every_position else h[:, -1:]
            logits = self.model.lm_head(rows)
            # Sampling takes fp32 logits of the full vocabulary (vLLM gathers the
            # tensor-parallel slices on the first rank).
            vocab = self.arch.vocab_size
            full = (
                logits.new_empty(*logits.shape[:-1], vocab, dtype=torch.float32)
                if (logits.shape[-1] != vocab)
                else logits.float()
            )
            return full

    @torch.no_grad()
    def _inference(self, w: InferenceWorkload, iterations: int) -> None:
        model, marks = self.model, self.marks
        n = w.num_sequences
        kv_name = w.precision.kv_cache
        kv_dtype = TORCH_DTYPES[w.precision.compute if kv_name == "auto" else kv_name]
        cache = None
        if self.arch.kind == "decoder":
            with marks.scope("kv_cache"):
                cache = model.allocate_cache(n, w.context_tokens, kv_dtype)
            r = self.kv_rounding
            self.kv_cache_bytes = sum(
                -(-t.untyped_storage().nbytes() // r) * r
                for t in (*cache.keys, *cache.values)
                if t is not None
            )
        for it in range(iterations):
            marks.iteration(it)
            if self.arch.kind == "encoder":
                marks.phase("forward")
                h = model.hidden_states(self._ids(n, w.prompt_tokens))
                self.last_output = h.detach()[:, :1, :8].clone()
                del h
                continue
            marks.phase("prefill")
            h = model.hidden_states(self._ids(n, w.prompt_tokens), cache=cache)
            logits = self._logits(h, w.logits == "all")
            self.last_output = logits.detach()[..., :8].clone()  # not a view: frees the logits
            del h, logits
            if w.generated_tokens == 0:
                continue
            marks.phase("decode")
            last = w.context_tokens - 1
            steps = (
                range(w.prompt_tokens, last + 1)
                if self.every_decode_step
                else sorted({w.prompt_tokens, last})
            )
            for pos in steps:
                h = model.hidden_states(self._ids(n, 1), start=pos, cache=cache)
                logits = self._logits(h, False)
                self.last_output = logits.detach()[..., :8].clone()  # not a view: frees the logits
                del h, logits

    # -------------------------------------------------------------------------- training --

    def _loss(self, w: TrainingWorkload) -> torch.Tensor:
        model = self.model
        ids = self._ids(w.micro_batch_size, w.sequence_length)
        h = model.hidden_states(ids, training=True)
        if self.arch.kind == "encoder":
            return model.pooled(h).float().pow(2).mean()
        # The backward starts in the loss and the LM head (logits' gradients); it leaves them
        # when the gradient of the LM head's input exists.
        if h.requires_grad:
            h.register_hook(self._leave_logits)
        with self.marks.scope("logits"), self.marks.module("lm_head"):
            logits = model.lm_head(h)
            del h
            return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids.reshape(-1))

    def _leave_logits(self, grad: torch.Tensor) -> None:
        self.marks.pop_scope()
        self.marks.push_scope("activations")

    def _training(self, w: TrainingWorkload, iterations: int) -> None:
        marks = self.marks
        if self.training is None:
            self.training = training_state(self.model, w, marks)
        params, masters, opt = self.training.params, self.training.masters, self.training.opt
        micro_batches = min(w.gradient_accumulation_steps, 2)
        for it in range(iterations):
            marks.iteration(it)
            for _ in range(micro_batches):
                marks.phase("forward")
                loss = self._loss(w)
                self.last_output = loss.detach()
                marks.phase("backward")
                with marks.scope("logits" if self.arch.kind == "decoder" else "activations"):
                    loss.backward()
                del loss
            step(opt, params, masters, marks)


@torch.no_grad()
def initialize(model: torch.nn.Module, seed: int = 0) -> None:
    """Real runs: weights drawn N(0, 0.02), norms at one, packed payloads zero -- values that
    keep a forward pass finite (the trace tier never initializes: fake tensors have no values).
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for name, p in model.named_parameters():
        if not p.dtype.is_floating_point:
            continue
        if "norm" in name.lower() or name.startswith("ln_") or "__ln_" in name:
            p.fill_(1.0)
        else:
            cpu = torch.empty(p.shape, dtype=torch.float32).normal_(0.0, 0.02, generator=gen)
            p.copy_(cpu)
    for _, b in model.named_buffers():
        b.zero_()


def prepare(
    w: InferenceWorkload | TrainingWorkload,
    arch: Arch,
    marks: Marks,
    device: torch.device,
    stack: Stack | None = None,
) -> Program:
    """Build the model (phase ``load``) and return the program (``stack``: the request's,
    :func:`build_plan`)."""
    w = deploy(w)
    plan = build_plan(w, device, stack)
    marks.phase("load")
    with marks.scope("weights"):
        model = TransformerModel(arch, plan, marks)
    _tag_model(model, marks)
    return Program(w, arch, model, marks, device)
