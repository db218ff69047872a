"""The workload: what a caller asks about. Wire types (msgspec Structs) with their constraints.

``model`` (where the model comes from), ``precision`` (dtypes, quantization), ``parallelism``,
``workloads`` (inference, training, generic), ``serving`` (an engine deployment), ``requests``
(budget and fit requests, devices, headroom, software); ``limits`` holds the numeric ranges and
the common base; ``rules`` the cross-field rules, each declared once for both the runtime check
and the published JSON Schema. Checks that depend on the model (a tensor-parallel degree that
must divide its heads) are semantic: ``InvalidWorkload``, a documented 422 of type
``invalid-workload``.

Every object but an inline ``config.json`` forbids unknown fields; the published JSON schema says
``additionalProperties: false`` for each of them. This package re-exports every wire type, so
callers import from ``vrambudget.core.spec``.
"""

from __future__ import annotations

from .encoders import Seq2SeqWorkload, SpeechToTextWorkload, VisionWorkload
from .limits import (
    MAX_TOKENS,
    Batch,
    Bytes,
    Degree,
    Dim,
    Fraction,
    Name,
    Tokens,
    TokensOrZero,
    Wire,
)
from .model import (
    CheckpointHeader,
    DimensionsModel,
    HFConfigModel,
    HubModel,
    ModelSource,
    MoESpec,
    PresetModel,
)
from .parallelism import (
    Parallelism,
)
from .precision import (
    AWQ,
    FP8,
    GPTQ,
    MXFP4,
    NVFP4,
    BitsAndBytes4bit,
    CompressedTensors,
    Int8,
    Precision,
    Quantization,
)
from .requests import (
    AnalyticWorkload,
    BudgetRequest,
    CatalogDevice,
    CustomDevice,
    DeviceRef,
    DiskOptions,
    EncoderWorkload,
    FitRequest,
    FitVariable,
    Framework,
    Headroom,
    LatencyTarget,
    Libraries,
    LossImplementation,
    ModelWorkload,
    NormImplementation,
    Software,
    TraceOptions,
    Workload,
    analytic_workloads,
)
from .rules import RULES, schema_rules
from .serving import (
    Engine,
    EngineVersion,
    GGUFFileType,
    GGUFOptions,
    GGUFTensorSpec,
    LLMServingWorkload,
    ServingParallelism,
    ServingQuantization,
    SGLangOptions,
    SpeculativeOptions,
)
from .workloads import (
    SGD,
    Adafactor,
    AdamW,
    AdamW8bit,
    Attention,
    CacheItem,
    FullFineTune,
    GenericWorkload,
    Implementation,
    InferenceWorkload,
    LoRA,
    LoRATarget,
    Method,
    Optimizer,
    QLoRA,
    SizedItem,
    TrainingWorkload,
)

__all__ = [
    "AWQ",
    "FP8",
    "GPTQ",
    "MAX_TOKENS",
    "MXFP4",
    "NVFP4",
    "SCHEMA_RULES",
    "SGD",
    "Adafactor",
    "AdamW",
    "AdamW8bit",
    "AnalyticWorkload",
    "Attention",
    "Batch",
    "BitsAndBytes4bit",
    "BudgetRequest",
    "Bytes",
    "CacheItem",
    "CatalogDevice",
    "CheckpointHeader",
    "CompressedTensors",
    "CustomDevice",
    "Degree",
    "DeviceRef",
    "Dim",
    "DimensionsModel",
    "DiskOptions",
    "EncoderWorkload",
    "Engine",
    "EngineVersion",
    "FitRequest",
    "FitVariable",
    "Fraction",
    "Framework",
    "FullFineTune",
    "GGUFFileType",
    "GGUFOptions",
    "GGUFTensorSpec",
    "GenericWorkload",
    "HFConfigModel",
    "Headroom",
    "HubModel",
    "Implementation",
    "InferenceWorkload",
    "Int8",
    "LLMServingWorkload",
    "LatencyTarget",
    "Libraries",
    "LoRA",
    "LoRATarget",
    "LossImplementation",
    "Method",
    "MoESpec",
    "ModelSource",
    "ModelWorkload",
    "Name",
    "NormImplementation",
    "Optimizer",
    "Parallelism",
    "Precision",
    "PresetModel",
    "QLoRA",
    "Quantization",
    "SGLangOptions",
    "Seq2SeqWorkload",
    "ServingParallelism",
    "ServingQuantization",
    "SizedItem",
    "Software",
    "SpeculativeOptions",
    "SpeechToTextWorkload",
    "Tokens",
    "TokensOrZero",
    "TraceOptions",
    "TrainingWorkload",
    "VisionWorkload",
    "Wire",
    "Workload",
    "analytic_workloads",
]

SCHEMA_RULES = schema_rules({name: globals()[name] for name in RULES if name in globals()})
"""The cross-field rules as JSON Schema, merged into the published components (``allOf``)."""
