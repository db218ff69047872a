"""The corpus of published real measurements (``research/data/corpus/*.json``): each record is one
number a person or a project measured on a real GPU and published, with its conditions, the
memory view it reports, a verbatim quote and a source a reader can open; and the request that
reproduces it, so the estimate can be compared with it.

Records are grouped by source (``group``: one README table, one issue thread, one log): a
group lands wholly in one split, and so do groups that quote the same document (one group per
model of one table), so a table's rows never calibrate the band they are judged by. The split is
fixed by the source's name alone (:func:`split_of`, a hash), chosen before any fit: about 35% of
the groups are held out.

Run from the repository root:
    python -m research.corpus check [FILE...]   # validate, estimate and print every record
    python -m research.corpus splits            # file new groups' splits in data/splits.json
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from statistics import median
from typing import Any, Literal

import msgspec

from research.releases import first_release, version_at
from vrambudget.core.budget.views import outside_allocator_bytes
from vrambudget.core.components import Component
from vrambudget.core.errors import InvalidWorkload
from vrambudget.core.estimate import estimate
from vrambudget.core.resolve import needs_resolution
from vrambudget.core.result import Budget
from vrambudget.core.spec import BudgetRequest
from vrambudget.core.stack import HF_MODEL_FRAMEWORKS, PINNED

__all__ = [
    "CORPUS",
    "Prediction",
    "Record",
    "document_of",
    "load",
    "predict",
    "split_for",
    "split_of",
]

CORPUS = Path(__file__).parent / "data" / "corpus"
CONFIGS = Path(__file__).parent / "data" / "configs"

Framework = Literal[
    "transformers",  # transformers' Trainer / generate (PEFT, TRL, accelerate ride on it)
    "peft",
    "trl",
    "accelerate",
    "unsloth",
    "axolotl",
    "torchtune",
    "litgpt",
    "deepspeed",
    "fsdp",
    "megatron",
    "nemo",
    "pytorch",  # a hand-written loop over plain torch
    "bitsandbytes",
    "vllm",
    "sglang",
    "tgi",
    "llama.cpp",
    "ollama",
    "diffusers",
    "other",
]

View = Literal[
    "nvidia_smi",  # the device's used memory (nvidia-smi, NVML, rocm-smi, a cloud monitor)
    "torch_max_allocated",  # torch.cuda.max_memory_allocated
    "torch_max_reserved",  # torch.cuda.max_memory_reserved
    # max allocated + the device's memory outside the allocator (nvidia-smi - reserved): the
    # process's need without the allocator's cached segments (optimum's GPTQ benchmark)
    "torch_allocated_plus_context",
    "engine_log",  # a serving engine's own startup line
    "unspecified",  # "peak memory" without saying how: compared as nvidia_smi
    # one of torch's allocator statistics (peak allocated, active or reserved) without saying
    # which, where the only memory report of the code that ran prints those (torchtune's
    # recipes, training/memory.py get_memory_stats): none counts the CUDA context or NCCL, so
    # compared as torch_max_reserved, the largest of them
    "torch_unspecified",
    # the device's used memory read through NVML's v1 memory info (pynvml / py3nvml
    # nvmlDeviceGetMemoryInfo(handle).used without version=2), which counts the memory the
    # driver reserves as used; nvidia-smi since R510 (and v2) leaves it out
    "nvml_v1_used",
]

NVML_RESERVED: dict[str, tuple[int, str]] = {
    # "FB Memory Usage / Total: 81920 MiB / Reserved: 763 MiB / Used: 1 MiB / Free: 81158 MiB"
    # (nvidia-smi -q, driver 555.42.02, four idle A100-SXM4-80GB; the free 81,158 MiB is the
    # runtime total of the catalog). "the results of device.memory_info()?.used would produce
    # 912MB on our A100s before the change, and now show 7.8MB with the v2 version"
    # (rust-nvml/nvml-wrapper#57, driver not stated) puts another driver's reservation at
    # about 0.9 GB.
    "a100-sxm4-80gb": (
        763 * 1024 * 1024,
        "thamada/nvidia-smi gls/A100SXMx4_smi.py at b09ef139 (nvidia-smi -q, Reserved 763 MiB)",
    ),
}
"""The driver's reserved device memory per GPU type, which NVML's v1 ``used`` includes (the
NVML API reference, nvmlMemory_t: "used -- Sum of Reserved and Allocated device memory")."""

Quantity = Literal[
    "peak_device_bytes",  # the peak of one device (the most loaded one)
    "weights_bytes",
    "kv_cache_bytes",
    "kv_cache_tokens",
    "max_concurrency",
]

Unit = Literal["B", "KiB", "MiB", "GiB", "KB", "MB", "GB", "tokens", "x"]

_UNITS = {
    "B": 1,
    "KiB": 1 << 10,
    "MiB": 1 << 20,
    "GiB": 1 << 30,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "tokens": 1,
    "x": 1,
}


class Record(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    id: str
    """Unique, kebab-case: ``<source>-<model>-<setting>``."""
    group: str
    """The source it came from (one README table, one thread): the unit of the split."""
    kind: Literal["training", "fine_tuning", "inference", "serving"]
    framework: Framework
    framework_version: str | None = None
    torch_version: str | None = None
    cuda_version: str | None = None
    gpu: str
    """The GPU as the source names it, verbatim."""
    gpu_id: str | None
    """Its catalog id (``vrambudget/core/data/gpus.json``), or None when the catalog lacks it."""
    num_gpus: int = 1
    view: View
    quantity: Quantity
    value: float
    unit: Unit
    conditions: str
    """Everything the source says about the run that memory depends on, in plain words."""
    quote: str
    """The source's own words carrying the number, verbatim."""
    url: str
    """Where a reader opens it (a permalink where the source has one)."""
    title: str = ""
    published: str | None = None
    workload: dict[str, Any] | None
    """The vrambudget workload that reproduces the run (a ``workloads[]`` item of
    ``/v1/budgets``); its model may be ``{"source": "corpus", "id": "org/name"}``, read from
    ``research/data/configs``. None: not reproducible (``excluded`` says why)."""
    software: dict[str, Any] | None = None
    """More of the stack the source states, as the request's ``software`` takes it (e.g.
    ``{"libraries": {"bitsandbytes": "0.41.1"}}``, or a transformers version under a PEFT
    record)."""
    excluded: str | None = None
    """Why the record is not compared (kept for the record, never silently dropped)."""
    notes: str | None = None

    @property
    def measured(self) -> float:
        return self.value * _UNITS[self.unit]


class _File(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    schema: Literal["vrambudget.corpus/1"]
    records: tuple[Record, ...]
    about: str = ""


def document_of(url: str) -> str:
    """The document a URL opens, whatever the anchor or the commit of a permalink."""
    url = url.split("#", 1)[0]
    return re.sub(r"/(blob|tree|raw)/[0-9a-f]{7,40}/", r"/\1/-/", url)


@cache
def _split_groups() -> dict[str, str]:
    """Each group's split key: the group filed first (files in name order, records in file
    order) among those that share a document with it (transitively), so the rows of one
    document never straddle the split even where they were filed under several groups (one per
    model of a table), and a group filed later on a document already in the corpus takes that
    document's split instead of moving the earlier rows (new sources go at the end of the last
    file, or in a new file whose name sorts after the others; ``data/splits.json`` holds every
    filed group's split, and the tests fail when one would move). Over the groups filed until
    2026-12-05 this is the same split as keying by the alphabetically first group, the rule it
    replaced."""
    parent: dict[str, str] = {}
    filed: dict[str, int] = {}

    def find(g: str) -> str:
        while parent.setdefault(g, g) != g:
            g = parent[g]
        return g

    first: dict[str, str] = {}
    for i, r in enumerate(load()):
        filed.setdefault(r.group, i)
        find(r.group)
        doc = document_of(r.url)
        if doc in first:
            a, b = sorted((find(first[doc]), find(r.group)), key=filed.__getitem__)
            if a != b:
                parent[b] = a
        else:
            first[doc] = r.group
    return {g: find(g) for g in parent}


def split_for(r: Record) -> Literal["calibrate", "held_out"]:
    """A record's split: its source's (:func:`split_of` of the group that keys its documents)."""
    return split_of(_split_groups().get(r.group, r.group))


def split_of(group: str) -> Literal["calibrate", "held_out"]:
    """The split of a source group, fixed by its name before any fit: held out when the first
    byte of SHA-256(group) is below 90 (35%)."""
    return "held_out" if hashlib.sha256(group.encode()).digest()[0] < 90 else "calibrate"


@cache
def _config(repo: str) -> dict[str, Any]:
    path = CONFIGS / (repo.replace("/", "--") + ".json")
    data = json.loads(path.read_text())
    return {"source": "hf_config", "config": data["config"], "name": repo.split("/")[-1]}


def load(paths: list[Path] | None = None) -> tuple[Record, ...]:
    """Every record of the corpus (or of ``paths``), ids checked unique."""
    records: list[Record] = []
    for path in paths or sorted(CORPUS.glob("*.json")):
        records += msgspec.json.decode(path.read_bytes(), type=_File).records
    seen: set[str] = set()
    for r in records:
        if r.id in seen:
            raise ValueError(f"duplicate record id {r.id}")
        seen.add(r.id)
    return tuple(records)


def _resolve_models(obj: Any) -> Any:
    if isinstance(obj, dict):
        if obj.get("source") == "corpus":
            return _config(obj["id"])
        return {k: _resolve_models(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_resolve_models(v) for v in obj]
    return obj


# The corpus's framework -> the request's ``software.framework`` (PEFT, TRL, accelerate and
# bitsandbytes run on transformers: their version goes to ``software.libraries``).
_STACK_FRAMEWORK = {
    "transformers": "transformers",
    "peft": "transformers",
    "trl": "transformers",
    "accelerate": "transformers",
    "bitsandbytes": "transformers",
    "torchtune": "torchtune",
    "litgpt": "litgpt",
    "deepspeed": "deepspeed",
    "fsdp": "fsdp",
    "unsloth": "unsloth",
    "axolotl": "axolotl",
    "vllm": "vllm",
    "sglang": "sglang",
    "diffusers": "diffusers",
}
_LIBRARY = {"peft", "trl", "accelerate", "bitsandbytes", "deepspeed"}


def _version(v: str | None) -> str | None:
    """A version as the request takes it (``v0.6.3`` -> ``0.6.3``), or None if it is none."""
    if not v:
        return None
    v = v.strip().lstrip("vV")
    return v if re.fullmatch(r"[0-9][0-9A-Za-z.+_-]*", v) else None


# A measurement that states no version ran on the last release before its publication
# (research/releases.py, PyPI's upload dates); a library the framework pins is left to the
# stack's pin (vrambudget.core.stack.PINNED). PEFT's release decides a LoRA adapter's dtype
# where the record leaves it null (vrambudget.core.stack, lora_adapter_dtype).
_DATED_LIBRARIES = ("bitsandbytes", "peft")


def software_of(r: Record) -> dict[str, Any]:
    """The request's ``software`` for what the record says of its stack."""
    sw: dict[str, Any] = {}
    version = _version(r.framework_version)
    framework = _STACK_FRAMEWORK.get(r.framework)
    if framework is not None:
        sw["framework"] = framework
        if version and r.framework not in _LIBRARY:
            sw["framework_version"] = version
    if version and r.framework in _LIBRARY:
        sw["libraries"] = {r.framework: version}
    for key in ("torch_version", "cuda_version"):
        v = _version(getattr(r, key))
        if v:
            sw[key] = v
    for key, value in (r.software or {}).items():
        if isinstance(value, dict) and isinstance(sw.get(key), dict):
            sw[key] = {**sw[key], **value}
        else:
            sw[key] = value
    if r.published:
        _dated(sw, r)
    return sw


LIT_GPT_PR_667 = "2023-10-24"
"""lit-gpt commit 50b1974b (PR #667): from it on, one K/V head is repeated for training."""


def _dated(sw: dict[str, Any], r: Record) -> None:
    """Versions the source does not state, from its publication date."""
    assert r.published is not None
    when = r.published
    framework = sw.get("framework")
    if framework is not None and "framework_version" not in sw:
        package = {"fsdp": "torch"}.get(framework, framework)
        found = None
        if package == "litgpt" and when < LIT_GPT_PR_667:
            # lit-gpt's commits before PR #667, which no release holds (the stack reads
            # litgpt < 0.2 as that code).
            found = "0.1.0"
        elif package != "torch":
            # Before the first release the code that ran is closest to the first release.
            found = version_at(package, when) or first_release(package)
        if found:
            sw["framework_version"] = found
    if "torch_version" not in sw:
        found = version_at("torch", when)
        if found:
            sw["torch_version"] = found
    libraries = sw.setdefault("libraries", {})
    if r.framework in _LIBRARY and r.framework not in libraries:
        found = version_at(r.framework, when)
        if found:
            libraries[r.framework] = found
    if framework in HF_MODEL_FRAMEWORKS and "transformers" not in libraries:
        # The model classes (and their loss) of the release current when the run was published.
        found = version_at("transformers", when)
        if found:
            libraries["transformers"] = found
    for library in _DATED_LIBRARIES:
        if library not in libraries and library not in PINNED.get(framework or "", {}):
            found = version_at(library, when)
            if found:
                libraries[library] = found


def request_of(r: Record) -> BudgetRequest:
    """The budget request that reproduces a record: its workload on its GPU with its software
    stack, no headroom."""
    assert r.workload is not None
    body: dict[str, Any] = {
        "workloads": [_resolve_models(r.workload)],
        "headroom": {"fraction": 0.0},
        "software": software_of(r),
    }
    if r.gpu_id is not None:
        body["device"] = {"source": "catalog", "id": r.gpu_id}
    return msgspec.convert(body, BudgetRequest)


@dataclass(frozen=True, slots=True)
class Prediction:
    record: Record
    predicted: float
    split: str
    counted: float = 0.0
    """The band's floor (``ErrorBand.counted_bytes``: weights, quantization metadata and
    adapters counted from the model's tensors); 0 where the answer has no band."""

    @property
    def error(self) -> float:
        """Signed relative error of the prediction: (predicted - measured) / measured."""
        return (self.predicted - self.record.measured) / self.record.measured


def _device_view(b: Budget, view: View) -> int:
    d = b.devices[b.most_loaded]
    cache = d.allocator_cache
    if cache is not None and view == "nvidia_smi":
        return cache.device_used_bytes
    if cache is not None and view in ("torch_max_reserved", "torch_unspecified"):
        return cache.reserved_bytes
    lines = {line.component: line.bytes for line in d.lines}
    total = d.total_bytes - lines.get(Component.HEADROOM, 0)
    if view in ("nvidia_smi", "unspecified", "engine_log"):
        return total
    if view == "torch_allocated_plus_context":
        # torch's allocated peak plus everything outside the allocator (context, NCCL)
        return total - lines.get(Component.ALLOCATOR_OVERHEAD, 0)
    reserved = total - outside_allocator_bytes(d)
    if view in ("torch_max_reserved", "torch_unspecified"):
        return reserved
    return reserved - lines.get(Component.ALLOCATOR_OVERHEAD, 0)


_POOL = ("kv_cache_tokens", "max_concurrency", "kv_cache_bytes")
"""The quantities of a started engine's KV pool."""


def value_of(b: Budget, r: Record) -> float:
    """The budget's number for what the record measured."""
    if r.quantity == "peak_device_bytes" and r.view == "nvml_v1_used":
        if r.gpu_id not in NVML_RESERVED:
            raise ValueError(
                f"{r.id}: view nvml_v1_used needs the driver's reserved memory of {r.gpu_id} "
                "in NVML_RESERVED (nvidia-smi -q 'FB Memory Usage / Reserved', with its source)"
            )
        return _device_view(b, "nvidia_smi") + NVML_RESERVED[r.gpu_id or ""][0]
    if r.quantity == "peak_device_bytes":
        return _device_view(b, r.view)
    s = b.serving
    if s is not None and not s.would_start and r.quantity in _POOL:
        # a measured pool is a started engine: an answer that says it would not start (a
        # setting the record got wrong) has nothing to compare
        raise InvalidWorkload(
            "workload", f"{r.id}: the answer says the engine would not start: {s.reason}"
        )
    if r.quantity == "kv_cache_tokens" and s is not None:
        return s.kv_cache_tokens
    if r.quantity == "max_concurrency" and s is not None:
        return s.max_concurrency
    if r.quantity == "kv_cache_bytes" and s is not None:
        return s.kv_cache_pool_bytes
    d = b.devices[b.most_loaded]
    lines = {line.component: line.bytes for line in d.lines}
    if r.quantity == "weights_bytes":
        return lines[Component.WEIGHTS] + lines.get(Component.QUANTIZATION_METADATA, 0)
    return lines[Component.KV_CACHE]


def predict(r: Record) -> Prediction:
    req = request_of(r)
    workloads = req.workloads
    if any(needs_resolution(m) for m in (getattr(w, "model", None) for w in workloads) if m):
        # A family without a closed form: built by transformers here, as the service's trace
        # workers build it.
        from vrambudget.trace.models import resolve_models

        workloads = resolve_models(workloads)
    b = estimate(workloads, req.device, req.headroom, software=req.software, allocator_replay=True)
    band = b.devices[b.most_loaded].band
    counted = float(band.counted_bytes) if band is not None else 0.0
    return Prediction(r, float(value_of(b, r)), split_for(r), counted)


def _check(paths: list[Path]) -> int:
    bad = 0
    errors: list[float] = []
    for r in load(paths or None):
        if r.workload is None or r.excluded:
            print(f"- {r.id}: excluded ({r.excluded})")
            continue
        try:
            p = predict(r)
        except (InvalidWorkload, msgspec.ValidationError, KeyError, OSError) as e:
            bad += 1
            print(f"! {r.id}: {type(e).__name__}: {e}")
            continue
        errors.append(abs(p.error))
        print(
            f"  {r.id} [{p.split}] measured {r.measured:,.0f} predicted {p.predicted:,.0f} "
            f"({100 * p.error:+.1f}%)"
        )
    if errors:
        print(f"{len(errors)} compared, median |error| {100 * median(errors):.1f}%, {bad} failed")
    return 1 if bad else 0


SPLITS = CORPUS.parent / "splits.json"
"""Every filed group's split (``tests/research/test_corpus.py`` holds the corpus to it)."""


def _file_new_splits() -> int:
    """Add the groups not yet in :data:`SPLITS` with the split they get; a filed group that
    would change split is reported, not rewritten."""
    data = json.loads(SPLITS.read_text())
    groups: dict[str, str] = data["groups"]
    now = {r.group: split_for(r) for r in load()}
    moved = sorted(g for g in groups if now.get(g) not in (None, groups[g]))
    for g in moved:
        print(f"! {g}: filed {groups[g]}, now {now[g]}")
    new = sorted(now.keys() - groups.keys())
    for g in new:
        groups[g] = now[g]
        print(f"+ {g}: {now[g]}")
    data["groups"] = dict(sorted(groups.items()))
    SPLITS.write_text(json.dumps(data, indent=1) + "\n")
    return 1 if moved else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["splits"]:
        raise SystemExit(_file_new_splits())
    if sys.argv[1:2] != ["check"]:
        print(__doc__)
        raise SystemExit(2)
    raise SystemExit(_check([Path(a) for a in sys.argv[2:]]))
