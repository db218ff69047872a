"""Record every storage a workload allocates and releases, with its size and component.

A ``TorchDispatchMode`` sees each ATen op's outputs; a storage not seen before is an allocation
(views share their base's storage and are not). A weak reference on the storage reports its
release: PyTorch keeps one Python object per live storage, so the reference dies exactly when
the storage does -- the same mechanism as ``torch.distributed._tools.mem_tracker``. It works on
fake tensors (no memory) and on real ones (the CPU validation against ``torch.profiler``).

Components come from the workload's ``Marks`` calls: the scope active at allocation, revised
later by ``tag`` (a backward buffer becomes a gradient when autograd hands it to ``.grad``).
Tensors tagged ``host`` are kept off the device stream.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from vrambudget.workloads.marks import Marks

from .events import ALLOC, EMPTY_CACHE, FREE, Trace

__all__ = ["Recorder"]

# Ops that create a cuBLAS handle's workspace on first use (at::cuda::getCurrentCUDABlasHandle
# and the cuBLASLt path): every dense GEMM.
_GEMM_OPS = frozenset(
    {"mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "addbmm", "_addmm_activation"}
)


class _Mode(TorchDispatchMode):
    def __init__(self, recorder: Recorder) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # unannotated in torch
        self.recorder = recorder

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        rec = self.recorder
        if rec.gemm_hook is not None and func._overloadpacket.__name__ in _GEMM_OPS:
            hook, rec.gemm_hook = rec.gemm_hook, None
            hook()
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                rec.see(t)
        return out


class Recorder(Marks):
    """``Marks`` that records; use ``with recorder.recording():`` around the program."""

    def __init__(
        self,
        *,
        gemm_workspaces: tuple[tuple[str, int], ...] = (),
        limit_bytes: int | None = None,
        sources: bool = False,
        addresses: bool = False,
    ) -> None:
        self.trace = Trace()
        self.sources = sources
        """Keep the source line of each allocation (the first frame in the model's code)."""
        self.addresses: dict[int, int] | None = {} if addresses else None
        """handle -> the storage's ``data_ptr()`` (real tensors only: the probe's memory
        snapshot on the CPU), when asked for."""
        self.limit_bytes = limit_bytes
        """Raise ``torch.OutOfMemoryError`` when live bytes would exceed this (the CPU path's
        simulated device capacity)."""
        self.live_bytes = 0
        self.peak_bytes = 0
        self._sizes: dict[int, int] = {}
        self._live: dict[int, int] = {}
        self._next = 0
        self._scopes: list[str] = ["activations"]
        self._modules: list[str] = []
        self._iteration = 0
        self._phase_index = -1
        self.phase("setup")
        self._workspaces = gemm_workspaces
        self.gemm_hook = self._allocate_workspaces if gemm_workspaces else None

    # ------------------------------------------------------------------------- recording --

    def recording(self) -> _Mode:
        return _Mode(self)

    def _new_handle(self) -> int:
        self._next += 1
        return self._next

    def _allocate_workspaces(self) -> None:
        """The cuBLAS and cuBLASLt workspaces: allocated through the caching allocator at the
        first GEMM and kept for the process (aten/src/ATen/cuda/CublasHandlePool.cpp)."""
        for name, nbytes in self._workspaces:
            h = self._new_handle()
            self._record(h, nbytes, "runtime_workspace")
            self.trace.parts[h] = name
            self._sizes[h] = nbytes
            self.live_bytes += nbytes

    def _record(self, handle: int, nbytes: int, tag: str) -> None:
        t = self.trace
        t.events.append((ALLOC, handle, nbytes, self._phase_index))
        t.tags[handle] = tag
        if self._modules:
            t.modules[handle] = self._modules[-1]

    def see(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self._live:
            return
        handle = self._new_handle()
        nbytes = storage.nbytes()
        self._live[key] = handle
        self._record(handle, nbytes, self._scopes[-1])
        if self.sources:
            self.trace.sources[handle] = allocation_site()
        if self.addresses is not None:
            self.addresses[handle] = storage.data_ptr()
        weakref.finalize(storage, self._release, key, handle)
        self._sizes[handle] = nbytes
        self.live_bytes += nbytes
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes
        if self.limit_bytes is not None and self.live_bytes > self.limit_bytes:
            raise torch.OutOfMemoryError(
                f"tracker limit: tried to allocate {nbytes} bytes with {self.live_bytes - nbytes}"
                f" live of a {self.limit_bytes}-byte limit"
            )

    def _release(self, key: int, handle: int) -> None:
        if self._live.get(key) == handle:
            del self._live[key]
        self.live_bytes -= self._sizes.pop(handle, 0)
        self.trace.events.append((FREE, handle, 0, self._phase_index))

    # ----------------------------------------------------------------------------- marks --

    def iteration(self, index: int) -> None:
        self._iteration = index

    def reset_peak(self) -> None:
        """Like ``torch.cuda.reset_peak_memory_stats``: the peak restarts from what is live."""
        self.peak_bytes = self.live_bytes

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``: the replay releases the cached free segments."""
        self.trace.events.append((EMPTY_CACHE, 0, 0, self._phase_index))

    def phase(self, name: str) -> None:
        self.trace.phases.append((self._iteration, name))
        self._phase_index = len(self.trace.phases) - 1

    def push_scope(self, tag: str) -> None:
        self._scopes.append(tag)

    def pop_scope(self) -> None:
        self._scopes.pop()

    def module(self, name: str) -> Any:
        return _ModuleScope(self._modules, name)

    def tag(self, tensor: torch.Tensor, tag: str, part: str | None = None) -> None:
        handle = self._live.get(tensor.untyped_storage()._cdata)
        if handle is None:
            return
        self.trace.tags[handle] = tag
        if part is not None:
            self.trace.parts[handle] = part


_SITE_PACKAGES = ("transformers", "peft", "diffusers", "vrambudget")
_SKIPPED = ("vrambudget/trace/", "torch/")


def allocation_site() -> str:
    """``package/path.py:line function`` of the innermost frame in the model's code (the
    frameworks' or the workload programs'), skipping torch and the recorder itself."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename.replace("\\", "/")
        for package in _SITE_PACKAGES:
            marker = f"/{package}/"
            at = path.rfind(marker)
            if at >= 0 and not any(skip in path[at:] for skip in _SKIPPED):
                return f"{path[at + 1 :]}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back  # type: ignore[assignment]
    return "?"


class _ModuleScope:
    __slots__ = ("name", "stack")

    def __init__(self, stack: list[str], name: str) -> None:
        self.stack, self.name = stack, name

    def __enter__(self) -> None:
        self.stack.append(self.name)

    def __exit__(self, *exc: object) -> None:
        self.stack.pop()
