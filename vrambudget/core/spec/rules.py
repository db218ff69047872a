"""Cross-field rules of the wire types, each declared once: the runtime check (run in the
struct's ``__post_init__``, so it fails while decoding, with the field's path) and the JSON
Schema published for it (``allOf`` of the struct's component) are both generated from the
declaration, so a schema-valid request never fails validation and the other way round.

A condition reads a (nested) field of the struct. In JSON Schema an absent field takes its
default, so a condition lists a field as ``required`` exactly when its default would not satisfy
it; a field without a default is never absent (the struct requires it), and is listed as
required in an ``if`` and not in a ``then``, so that absence leaves the rule vacuous.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import msgspec

__all__ = ["SCHEMA_RULES", "Cond", "Rule", "check", "rules_of"]

Op = Literal[
    "eq",
    "ne",
    "in",
    "ge",
    "null",
    "null_or_absent",
    "not_null",
    "max_items",
    "alone_if_present",
    "contains_kind",
    "contains_kind_in",
]


_TAG = object()

NO_LATENCY_KINDS: tuple[str, ...] = (
    "training",
    "generic",
    "vision",
    "seq2seq",
    "speech_to_text",
    "image_generation",
)
"""The workload kinds a latency target does not apply to (docs/LATENCY.md)."""


@dataclass(frozen=True, slots=True)
class Cond:
    """``path`` (field names from the struct) compared by ``op`` with ``value``."""

    path: tuple[str, ...]
    op: Op
    value: Any = None

    def holds(self, obj: Any) -> bool:
        v = obj
        for name in self.path:
            field = getattr(v, name, _TAG)
            # a struct's tag (``kind``, ``engine`` of a union member) is not an attribute
            v = v.__struct_config__.tag if field is _TAG else field
        return _OPS[self.op](v, self.value)

    def schema(
        self, owner: type[msgspec.Struct], position: Literal["if", "then"]
    ) -> dict[str, Any]:
        return _schema(owner, self.path, self._leaf(), self, position)

    def _leaf(self) -> dict[str, Any]:
        match self.op:
            case "eq":
                return {"const": self.value}
            case "ne":
                return {"not": {"const": self.value}}
            case "in":
                return {"enum": list(self.value)}
            case "ge":
                return {"minimum": self.value}
            case "null" | "null_or_absent":
                return {"type": "null"}
            case "not_null":
                return {"not": {"type": "null"}}
            case "max_items":
                return {"maxItems": self.value}
            case "alone_if_present":
                return {"anyOf": [{"not": {"contains": {"const": self.value}}}, {"maxItems": 1}]}
            case "contains_kind":
                return {
                    "contains": {
                        "type": "object",
                        "properties": {"kind": {"const": self.value}},
                        "required": ["kind"],
                    }
                }
            case "contains_kind_in":
                return {
                    "contains": {
                        "type": "object",
                        "properties": {"kind": {"enum": list(self.value)}},
                        "required": ["kind"],
                    }
                }


def _contains_kind(v: Any, kind: Any) -> bool:
    return any(getattr(getattr(w, "__struct_config__", None), "tag", None) == kind for w in v)


_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "eq": lambda v, x: v == x,
    "ne": lambda v, x: v != x,
    "in": lambda v, x: v in x,
    "ge": lambda v, x: v >= x,
    "null": lambda v, _: v is None,
    "null_or_absent": lambda v, _: v is None or v is msgspec.UNSET,
    "not_null": lambda v, _: v is not None,
    "max_items": lambda v, x: len(v) <= x,
    "alone_if_present": lambda v, x: x not in v or len(v) == 1,
    "contains_kind": _contains_kind,
    "contains_kind_in": lambda v, kinds: any(_contains_kind(v, k) for k in kinds),
}


def _schema(
    owner: Any, path: tuple[str, ...], leaf: dict[str, Any], cond: Cond, position: str
) -> dict[str, Any]:
    name, rest = path[0], path[1:]
    structs = _structs(owner)
    tag_fields = {s.__struct_config__.tag_field for s in structs}
    if name in tag_fields:  # a tagged union's tag: always present in the JSON
        return {"properties": {name: leaf}, "required": [name]}
    # the first member of a union that has the field (LoRA's target_modules, not FullFineTune)
    field = next(f for s in structs for f in msgspec.structs.fields(s) if f.name == name)
    inner = (
        _schema(field.type, rest, leaf, Cond(rest, cond.op, cond.value), position)
        if (rest)
        else leaf
    )
    out: dict[str, Any] = {"properties": {field.encode_name: inner}}
    if _required(field, path, cond, position):
        out["required"] = [field.encode_name]
    return out


def _structs(t: Any) -> list[Any]:
    """The struct types of an annotation (``Annotated`` and unions unwrapped)."""
    if get_origin(t) is Annotated:
        return _structs(get_args(t)[0])
    if get_origin(t) in (Union, UnionType):
        return [s for a in get_args(t) for s in _structs(a)]
    return [t] if isinstance(t, type) and issubclass(t, msgspec.Struct) else []


def _required(
    field: msgspec.structs.FieldInfo, path: tuple[str, ...], cond: Cond, position: str
) -> bool:
    """Whether the condition needs the field present: its default does not satisfy the rest
    of the condition (a field without default: in an ``if`` only)."""
    if field.required:
        return position == "if"
    default = field.default if field.default is not msgspec.NODEFAULT else field.default_factory()
    return (
        not Cond(path[1:], cond.op, cond.value).holds(default)
        if len(path) > 1
        else (not _OPS[cond.op](default, cond.value))
    )


@dataclass(frozen=True, slots=True)
class Rule:
    """``then`` must hold (whenever ``when`` holds); else ``message`` is the 422."""

    then: Cond
    message: str
    when: Cond | None = None

    def check(self, obj: Any) -> None:
        if (self.when is None or self.when.holds(obj)) and not self.then.holds(obj):
            raise ValueError(self.message)

    def schema(self, owner: type[msgspec.Struct]) -> dict[str, Any]:
        if self.when is None:
            return self.then.schema(owner, "then")
        return {"if": self.when.schema(owner, "if"), "then": self.then.schema(owner, "then")}


_GROUP_SIZE = Rule(Cond(("group_size",), "ne", 0), "group_size must be -1 or >= 1")
_SERVING = Cond(("workloads",), "contains_kind", "llm_serving")
_SERVING_ALONE = Rule(
    Cond(("workloads",), "max_items", 1),
    "an llm_serving workload must be the only workload (the engine hands all "
    "memory it may use to its KV cache)",
    _SERVING,
)

_SGLANG_NOT_VLLM: tuple[tuple[str, Op, Any, str], ...] = (
    ("gpu_memory_utilization", "null", None, "sglang.mem_fraction_static"),
    ("max_num_seqs", "null", None, "sglang.max_running_requests"),
    ("max_num_batched_tokens", "null", None, "sglang.chunked_prefill_size"),
    ("block_size", "null", None, "sglang.page_size"),
    ("enforce_eager", "eq", False, "sglang.disable_cuda_graph"),
    ("flashinfer_sampler", "null", None, "the defaults"),
    ("kv_cache_memory_bytes", "null", None, "sglang.max_total_tokens"),
    ("entrypoint", "eq", "api_server", "the server (launch_server)"),
    ("disable_hybrid_kv_cache_manager", "eq", False, "the default"),
    ("parallelism.enable_expert_parallel", "eq", False, "tensor parallelism"),
)
"""vLLM settings that engine ``sglang`` does not take (with the SGLang setting to use)."""

_GGUF_NOT_VLLM: tuple[tuple[tuple[str, ...], Op, Any, str], ...] = (
    (("gpu_memory_utilization",), "null", None, "gguf.n_gpu_layers"),
    (("max_model_len",), "null", None, "gguf.n_ctx"),
    (("max_num_seqs",), "null", None, "gguf.n_parallel"),
    (("max_num_batched_tokens",), "null", None, "gguf.n_batch"),
    (("block_size",), "null", None, "the defaults"),
    (("enforce_eager",), "eq", False, "the defaults"),
    (("flashinfer_sampler",), "null", None, "the defaults"),
    (("kv_cache_memory_bytes",), "null", None, "gguf.n_ctx"),
    (("kv_cache_dtype",), "eq", "auto", "gguf.cache_type_k and gguf.cache_type_v"),
    (("dtype",), "eq", "auto", "gguf.file_type"),
    (("quantization",), "null_or_absent", None, "gguf.file_type"),
    (("entrypoint",), "eq", "api_server", "the defaults"),
    (("disable_hybrid_kv_cache_manager",), "eq", False, "the defaults"),
    (("parallelism", "tensor"), "eq", 1, "gguf.devices and gguf.tensor_split"),
    (("parallelism", "pipeline"), "eq", 1, "gguf.devices and gguf.tensor_split"),
    (("parallelism", "data"), "eq", 1, "one budget per server"),
    (("parallelism", "enable_expert_parallel"), "eq", False, "gguf.devices"),
    (("parallelism", "peer_access"), "null", None, "gguf.devices and gguf.tensor_split"),
)
"""vLLM settings that the GGUF engines do not take (with their setting to use)."""

RULES: dict[str, tuple[Rule, ...]] = {
    "GPTQ": (_GROUP_SIZE,),
    "AWQ": (_GROUP_SIZE,),
    "CompressedTensors": (
        Rule(
            Cond(("group_size",), "not_null"),
            "strategy 'group' and 'tensor_group' need a group_size",
            Cond(("strategy",), "in", ("group", "tensor_group")),
        ),
        Rule(
            Cond(("block_structure",), "not_null"),
            "strategy 'block' needs a block_structure [rows, cols]",
            Cond(("strategy",), "eq", "block"),
        ),
        Rule(
            Cond(("type",), "eq", "int"),
            "format 'pack-quantized' packs integer weights: type must be 'int'",
            Cond(("format",), "eq", "pack-quantized"),
        ),
        Rule(
            Cond(("type",), "eq", "int"),
            "format 'int-quantized' stores integer weights: type must be 'int'",
            Cond(("format",), "eq", "int-quantized"),
        ),
        Rule(
            Cond(("type",), "eq", "float"),
            "format 'float-quantized' stores fp8 weights: type must be 'float'",
            Cond(("format",), "eq", "float-quantized"),
        ),
        Rule(
            Cond(("num_bits",), "eq", 8),
            "float weights are fp8 (num_bits 8); fp4 checkpoints are the schemes 'nvfp4' "
            "and 'mxfp4'",
            Cond(("type",), "eq", "float"),
        ),
    ),
    "Precision": (
        Rule(
            Cond(("quantization",), "null_or_absent"),
            "weights 'fp8' already implies fp8 quantization; set weights to the dtype of the "
            "unquantized layers instead",
            Cond(("weights",), "eq", "fp8"),
        ),
    ),
    "Parallelism": (
        Rule(
            Cond(("zero_stage",), "eq", 3),
            "offload_parameters needs zero_stage 3",
            Cond(("offload_parameters",), "eq", True),
        ),
        Rule(
            Cond(("zero_stage",), "ge", 1),
            "offload_optimizer needs zero_stage >= 1 (ZeRO-Offload)",
            Cond(("offload_optimizer",), "eq", True),
        ),
        Rule(
            Cond(("pipeline_schedule",), "eq", "interleaved_1f1b"),
            "virtual_stages > 1 needs pipeline_schedule 'interleaved_1f1b'",
            Cond(("virtual_stages",), "ge", 2),
        ),
    ),
    "TrainingWorkload": (
        Rule(
            Cond(("precision", "weights"), "in", ("fp32", "auto")),
            "mixed_precision 'autocast' keeps fp32 parameters: set precision.weights to 'fp32' "
            "(or leave it 'auto')",
            Cond(("mixed_precision",), "eq", "autocast"),
        ),
        Rule(
            Cond(("precision", "quantization"), "null_or_absent"),
            "QLoRA sets the base quantization itself (method.quant_type, ...); leave "
            "precision.quantization empty",
            Cond(("method", "kind"), "eq", "qlora"),
        ),
        Rule(
            Cond(("method", "target_modules"), "alone_if_present", "all-linear"),
            "method.target_modules: 'all-linear' stands alone (PEFT reads the shorthand only "
            "as the whole target_modules string); list module names instead to add others",
            Cond(("method", "kind"), "in", ("lora", "qlora")),
        ),
    ),
    "ServingQuantization": (
        _GROUP_SIZE,
        Rule(
            Cond(("method",), "eq", "fp8"),
            "applied_at_load needs method 'fp8' (vLLM quantizes only to fp8 while loading)",
            Cond(("applied_at_load",), "eq", True),
        ),
    ),
    "GGUFOptions": (
        Rule(
            Cond(("flash_attn",), "ne", "off"),
            "a quantized V cache (cache_type_v other than f32/f16/bf16) needs flash attention: "
            "flash_attn 'auto' or 'on'",
            Cond(("cache_type_v",), "in", ("q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")),
        ),
    ),
    "SpeculativeOptions": (
        Rule(
            Cond(("model",), "null"),
            "method 'ngram' drafts from the prompt's own n-grams: it takes no draft model",
            Cond(("method",), "eq", "ngram"),
        ),
        Rule(
            Cond(("model",), "null"),
            "method 'mtp' runs the target's own multi-token-prediction module: it takes no "
            "draft model",
            Cond(("method",), "eq", "mtp"),
        ),
        Rule(
            Cond(("method",), "eq", "eagle3"),
            "draft_vocab_size is the vocabulary of an EAGLE-3 head's own LM head: method "
            "'eagle3' only",
            Cond(("draft_vocab_size",), "not_null"),
        ),
    ),
    "LLMServingWorkload": (
        Rule(
            Cond(("sglang",), "null"),
            "sglang settings apply only to engine 'sglang'",
            Cond(("engine",), "ne", "sglang"),
        ),
        Rule(
            Cond(("gguf",), "null"),
            "gguf settings apply only to engines 'llama_cpp' and 'ollama'",
            Cond(("engine",), "in", ("vllm", "sglang")),
        ),
        *(
            Rule(
                Cond(tuple(name.split(".")), op, value),
                f"{name} is a vLLM setting; for engine 'sglang' use {instead}",
                Cond(("engine",), "eq", "sglang"),
            )
            for name, op, value, instead in _SGLANG_NOT_VLLM
        ),
        *(
            Rule(
                Cond(path, op, value),
                f"{'.'.join(path)} is not a setting of a GGUF engine; for engines "
                f"'llama_cpp' and 'ollama' use {instead}",
                Cond(("engine",), "in", ("llama_cpp", "ollama")),
            )
            for path, op, value, instead in _GGUF_NOT_VLLM
        ),
        Rule(
            Cond(("speculative",), "null"),
            "speculative decoding is modelled for engine 'vllm' only",
            Cond(("engine",), "ne", "vllm"),
        ),
    ),
    "BudgetRequest": (
        _SERVING_ALONE,
        Rule(
            Cond(("device",), "not_null"),
            "an llm_serving workload needs a device (the engine sizes its KV cache from the "
            "GPU's total memory)",
            _SERVING,
        ),
        Rule(
            Cond(("method",), "eq", "analytic"),
            "an llm_serving workload is budgeted by method 'analytic' only",
            _SERVING,
        ),
        Rule(
            Cond(("method",), "eq", "analytic"),
            "allocator_replay belongs to method 'analytic': a trace replays the allocator "
            "already (its trace.peak_reserved_bytes)",
            Cond(("allocator_replay",), "eq", True),
        ),
    ),
    "FitRequest": (
        _SERVING_ALONE,
        # One rule, not one per kind: an if/then per kind made the schema too branched for
        # schemathesis' canonical form (it gave up on POST /v1/fits and /v1/cluster-requests).
        Rule(
            Cond(("latency_target",), "null"),
            "a latency target applies to inference and llm_serving workloads only, not "
            "training, generic, vision, seq2seq, speech_to_text or image_generation: remove "
            "latency_target",
            Cond(("workloads",), "contains_kind_in", NO_LATENCY_KINDS),
        ),
    ),
    "Software": (
        Rule(
            Cond(("libraries", "transformers"), "null"),
            "libraries.transformers names the transformers release whose models run under "
            "fsdp, deepspeed or axolotl; where transformers is the framework (the default), "
            "name its release in framework_version",
            Cond(("framework",), "in", (None, "transformers")),
        ),
    ),
    "ProbeRequest": (
        Rule(
            Cond(("workload", "kind"), "ne", "training"),
            "concurrency > 1 needs an inference workload",
            Cond(("concurrency",), "ge", 2),
        ),
        Rule(
            Cond(("workload", "kind"), "ne", "llm_serving"),
            "an llm_serving probe's load is engine.concurrency (concurrency must be 1)",
            Cond(("concurrency",), "ge", 2),
        ),
        Rule(
            Cond(("workload", "kind"), "eq", "llm_serving"),
            "engine (the load of an engine probe) needs an llm_serving workload",
            Cond(("engine",), "not_null"),
        ),
        Rule(
            Cond(("workload", "kind"), "eq", "llm_serving"),
            "recipe_gpu needs an llm_serving workload",
            Cond(("recipe_gpu",), "not_null"),
        ),
        Rule(
            Cond(("workload", "kind"), "eq", "inference"),
            "quality needs an inference workload",
            Cond(("quality",), "not_null"),
        ),
        Rule(
            Cond(("overlap",), "max_items", 0),
            "overlap is for PyTorch probes (an engine probe's engine is its own process)",
            Cond(("workload", "kind"), "eq", "llm_serving"),
        ),
        Rule(
            Cond(("memory_snapshot",), "eq", False),
            "memory_snapshot records PyTorch's allocator in the probe's process: not "
            "available for an llm_serving probe",
            Cond(("workload", "kind"), "eq", "llm_serving"),
        ),
        Rule(
            Cond(("expandable_segments",), "eq", None),
            "expandable_segments sets PyTorch's allocator in the probe's process: an "
            "llm_serving probe's engine keeps its launcher's environment (must be null)",
            Cond(("workload", "kind"), "eq", "llm_serving"),
        ),
    ),
}
"""The rules of each wire type, in the order they are checked."""


def rules_of(obj: Any) -> tuple[Rule, ...]:
    return RULES.get(type(obj).__name__, ())


@cache
def _runs(name: str) -> tuple[tuple[Cond | None, tuple[Cond, ...], tuple[str, ...]], ...]:
    """The struct's rules as runs of consecutive rules sharing one ``when``: each condition is
    evaluated once per run (a serving workload's per-engine rules come in runs of 9 and 16,
    and the fits' bisections decode it tens of thousands of times)."""
    out: list[tuple[Cond | None, list[Cond], list[str]]] = []
    for rule in RULES[name]:
        if out and out[-1][0] == rule.when:
            out[-1][1].append(rule.then)
            out[-1][2].append(rule.message)
        else:
            out.append((rule.when, [rule.then], [rule.message]))
    return tuple((when, tuple(thens), tuple(msgs)) for when, thens, msgs in out)


def check(obj: Any) -> None:
    """Run the struct's rules (from its ``__post_init__``), in order; the first that fails
    raises."""
    for when, thens, messages in _runs(type(obj).__name__):
        if when is not None and not when.holds(obj):
            continue
        for then, message in zip(thens, messages, strict=True):
            if not then.holds(obj):
                raise ValueError(message)


def schema_rules(types: dict[str, type[msgspec.Struct]]) -> dict[str, list[dict[str, Any]]]:
    """The ``allOf`` of each given struct's published schema, generated from ``RULES``."""
    return {
        name: [r.schema(types[name]) for r in rules]
        for name, rules in RULES.items()
        if name in types
    }


SCHEMA_RULES: dict[str, list[dict[str, Any]]] = {}
"""Filled by :mod:`vrambudget.core.spec` once the types exist (``schema_rules``)."""
