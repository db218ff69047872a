"""The answer for a ``llama_cpp`` / ``ollama`` deployment: one device budget per GPU (its model,
KV and compute buffers, the backend's context), the host buffers and the GGUF file, and the
engine summary with llama.cpp's own numbers."""

from __future__ import annotations

from collections import Counter

from ...components import Component
from ...device import DeviceContext
from ...host import DEFAULT_DISK, file_copies
from ...result import (
    DeviceBudget,
    DiskBudget,
    GGUFDetails,
    GGUFDeviceBuffers,
    HostBudget,
    InputValue,
    Item,
    Line,
    OllamaPeer,
    Part,
    Phase,
)
from ...spec import DiskOptions, LLMServingWorkload
from .engine import GGUFAccount

__all__ = ["gguf_details", "gguf_devices", "gguf_host_and_disk"]

C = Component
_SRC = "llama.cpp src/llama-model.cpp load_tensors, src/llama-kv-cache.cpp, src/llama-context.cpp"
_FORMULAS: dict[Component, tuple[str, str, tuple[str, ...]]] = {
    C.WEIGHTS: (
        "model buffer: the GGUF tensors of the layers on this GPU (each tensor's ggml type "
        "from the file type's recipe: blocks x bytes per block), the output layer's norm and "
        "head (or a duplicate of the tied token embeddings)",
        "llama.cpp src/llama-quant.cpp llama_tensor_get_type; src/llama-model.cpp:1556-1612",
        ("file_type", "n_gpu_layers", "tensor_split"),
    ),
    C.KV_CACHE: (
        "KV buffer: cells x (row(type_k, n_embd_k_gqa) + row(type_v, n_embd_v_gqa)) per layer "
        "on this GPU; cells = n_ctx padded (sliding-window layers: min(n_ctx, window x slots "
        "+ n_ubatch) padded to 256)",
        "llama.cpp src/llama-kv-cache.cpp, src/llama-kv-cache-iswa.cpp:73, "
        "src/llama-context.cpp:290",
        ("n_ctx", "n_parallel", "cache_type_k", "cache_type_v"),
    ),
    C.ACTIVATIONS: (
        "compute buffer: the graph allocator's peak at n_ubatch tokens: max(attention scores "
        "n_head x n_kv x n_ubatch x 4 B without flash attention + 4 activations, FFN 2 x n_ff "
        "x n_ubatch x 4 B + 2, logits n_vocab x n_ubatch x 4 B + 1 on the output GPU)",
        "llama.cpp graph_reserve (src/llama-context.cpp:896); checked against llama.cpp's own "
        "buffer lines (docs/SERVING.md)",
        ("n_ubatch", "flash_attn", "n_ctx"),
    ),
    C.CUDA_CONTEXT: (
        "the backend's own device memory: the CUDA context and cuBLAS handles of the process "
        "(not in llama.cpp's buffer lines; nvidia-smi shows it)",
        "the device type's CUDA context (docs/COMPONENTS.md); not calibrated on ggml-cuda",
        (),
    ),
    C.HEADROOM: (
        "device total - everything above (llama.cpp keeps no reserve; --fit leaves 1 GiB)",
        "llama.cpp common/fit.cpp margins",
        (),
    ),
}
_UNUSED = ("0 (not used by llama.cpp)", "-", ())


def gguf_devices(
    w: LLMServingWorkload, g: GGUFAccount, ctx: DeviceContext
) -> tuple[DeviceBudget, ...]:
    s = g.settings
    out = []
    inputs: dict[str, InputValue] = {
        "engine_version": g.release.version,
        "file_type": (w.gguf.file_type if w.gguf is not None else "Q4_K_M"),
        "n_gpu_layers": s.n_gpu_layers,
        "n_ctx": s.n_ctx,
        "n_parallel": s.n_parallel,
        "n_ubatch": s.n_ubatch,
        "flash_attn": s.flash_attn,
        "cache_type_k": s.type_k,
        "cache_type_v": s.type_v,
        "tensor_split": ",".join(f"{x:g}" for x in s.splits),
    }
    for d in g.account.devices:
        values = {
            C.WEIGHTS: d.weights_bytes,
            C.KV_CACHE: d.kv_bytes,
            C.ACTIVATIONS: d.compute_bytes,
            C.CUDA_CONTEXT: g.context_bytes,
        }
        used = sum(values.values())
        values[C.HEADROOM] = max(ctx.capacity_bytes - used, 0)
        lines = []
        for c in Component:
            formula, source, names = _FORMULAS.get(c, _UNUSED)
            parts: tuple[Part, ...] = ()
            if c is C.WEIGHTS and d.output:
                parts = (
                    Part(
                        name=f"{len(d.layers)} repeating layers",
                        bytes=d.weights_bytes - g.account.layer_weights[-1],
                    ),
                    Part(name="output layer", bytes=g.account.layer_weights[-1]),
                )
            lines.append(Line(c, values.get(c, 0), formula, names, source, parts))
        span = f"layers {d.layers[0]}-{d.layers[-1]}" if d.layers else "no repeating layers"
        label = f"GPU {d.index} ({span}{', output' if d.output else ''})"
        if len(g.account.devices) == 1:
            label = "every device" if d.layers or d.output else "GPU 0 (nothing offloaded)"
        total = used + values[C.HEADROOM]
        out.append(
            DeviceBudget(
                label=label,
                pipeline_stage=d.index if len(g.account.devices) > 1 else None,
                num_devices=1,
                peak_phase="serving",
                lines=tuple(lines),
                total_bytes=total,
                inputs=inputs,
                phases=(Phase(name="serving", total_bytes=total),),
            )
        )
    return tuple(out)


def gguf_host_and_disk(
    g: GGUFAccount, disk: DiskOptions = DEFAULT_DISK
) -> tuple[HostBudget, DiskBudget]:
    """Host RAM and disk of a GGUF model; the disk counts the file once unless the request's
    ``disk`` options ask for its extra copies."""
    a = g.account
    items = [
        Item(
            item="CPU model buffer (memory-mapped GGUF: token embeddings and layers not offloaded)",
            bytes=a.host_weights_bytes,
            formula="tensors of the input layer and of the layers on the CPU",
            source="llama.cpp load_tensors: the input layer always on the CPU (CPU_Mapped)",
        ),
        Item(
            item="CPU KV buffer (layers not offloaded)",
            bytes=a.host_kv_bytes,
            formula="cells x K+V row bytes per CPU layer",
            source="llama.cpp src/llama-kv-cache.cpp",
        ),
        Item(
            item="host compute buffer (CPU layers' graph, or CUDA_Host transfers)",
            bytes=a.host_compute_bytes,
            formula="graph peak of the CPU part at n_ubatch (3 activations when fully offloaded)",
            source="llama.cpp graph_reserve",
        ),
        Item(
            item="output buffer (logits of the slots)",
            bytes=a.output_buffer_bytes,
            formula="n_vocab x 4 B x n_parallel",
            source="llama.cpp src/llama-context.cpp output_reserve",
        ),
    ]
    host = HostBudget(num_processes=1, items=tuple(items), total_bytes=sum(i.bytes for i in items))
    disk_items = [
        Item(
            item="GGUF file (tensor data; the header and tokenizer add a few MB)",
            bytes=a.file_bytes,
            formula="sum of tensor bytes",
            source="GGUF tensor types from the file type's recipe",
        ),
        *file_copies("GGUF file", a.file_bytes, disk, by_default=False),
    ]
    return host, DiskBudget(items=tuple(disk_items), total_bytes=sum(i.bytes for i in disk_items))


def gguf_details(w: LLMServingWorkload, g: GGUFAccount) -> GGUFDetails:
    s = g.settings
    a = g.account
    buffers = [
        GGUFDeviceBuffers(
            device=f"CUDA{d.index}",
            model_buffer_bytes=d.weights_bytes,
            kv_buffer_bytes=d.kv_bytes,
            compute_buffer_bytes=d.compute_bytes,
            layers=len(d.layers),
            output_layer=d.output,
        )
        for d in a.devices
    ]
    n_layer = len(a.layer_weights) - 1
    cpu_layers = n_layer - sum(len(d.layers) for d in a.devices)
    buffers.append(
        GGUFDeviceBuffers(
            device="CPU",
            model_buffer_bytes=a.host_weights_bytes,
            kv_buffer_bytes=a.host_kv_bytes,
            compute_buffer_bytes=a.host_compute_bytes,
            layers=cpu_layers,
            output_layer=not any(d.output for d in a.devices),
        )
    )
    est = g.ollama
    return GGUFDetails(
        file_type=w.gguf.file_type if w.gguf is not None else "Q4_K_M",
        file_bytes=a.file_bytes,
        tensor_types=dict(sorted(Counter(t.type for t in a.tensors).items())),
        n_ctx=s.n_ctx,
        n_ctx_per_slot=s.n_ctx_seq,
        n_parallel=s.n_parallel,
        kv_unified=s.kv_unified,
        n_gpu_layers=s.n_gpu_layers,
        n_layer=n_layer,
        flash_attn=s.flash_attn,
        n_ubatch=s.n_ubatch,
        cache_type_k=s.type_k,
        cache_type_v=s.type_v,
        buffers=tuple(buffers),
        fitted=g.fitted,
        ollama_estimate=None
        if est is None
        else OllamaPeer(
            layers_offload=est.layers,
            memory_required_full_bytes=est.required_full,
            memory_required_partial_bytes=est.required_partial,
            memory_required_kv_bytes=est.kv,
            memory_graph_full_bytes=est.graph_full,
            memory_graph_partial_bytes=est.graph_partial,
        ),
    )
