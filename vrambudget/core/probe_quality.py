"""Wire types of an output-quality check: a reference precision and candidates run over one
evaluation set, teacher-forced, compared position by position (top-1 agreement, the KL
divergence of the next-token distributions, perplexity), with pass/fail thresholds the request
sets."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from .spec import Precision

__all__ = ["QualityCandidate", "QualityCheck", "QualityReport", "QualityResult"]


class _Wire(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


Label = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.+-]+$")]


class QualityCandidate(_Wire, frozen=True, kw_only=True):
    label: Annotated[Label, Meta(description="Name in the report (`fp8`, `nf4`, `fp8-kv`).")]
    precision: Annotated[
        Precision,
        Meta(description="The candidate's precision, as the calculation service takes it."),
    ]


class QualityCheck(_Wire, frozen=True, kw_only=True):
    reference: Annotated[
        Precision,
        Meta(description='The reference precision (e.g. `{"weights": "bf16"}`).'),
    ]
    candidates: Annotated[
        tuple[QualityCandidate, ...],
        Meta(min_length=1, max_length=8, description="1 .. 8 candidates compared with it."),
    ]
    eval_set: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=128,
            pattern=r"^[A-Za-z0-9_.-]+$",
            description="`builtin` (default): the evaluation passages shipped with the agent; "
            "otherwise the name of a text file (one passage per paragraph) in the agent's "
            "evaluation directory (`VRAMBUDGET_AGENT_EVAL_DIR`).",
        ),
    ] = "builtin"
    max_sequences: Annotated[
        int, Meta(ge=1, le=1024, description="Passages evaluated, at most (1 .. 1024).")
    ] = 16
    sequence_tokens: Annotated[
        int, Meta(ge=8, le=8192, description="Tokens per passage, at most (8 .. 8192).")
    ] = 256
    max_mean_kl: Annotated[
        float,
        Meta(
            ge=0.0,
            le=100.0,
            description="Pass only if the mean KL(reference || candidate) of the next-token "
            "distributions, nats per token, is at most this.",
        ),
    ] = 0.05
    min_token_agreement: Annotated[
        float,
        Meta(
            ge=0.0,
            le=1.0,
            description="Pass only if the candidate's top-1 token equals the reference's at "
            "least this fraction of positions.",
        ),
    ] = 0.9
    max_perplexity_increase: Annotated[
        Annotated[float, Meta(ge=0.0, le=100.0)] | None,
        Meta(
            description="Pass only if the candidate's perplexity on the passages exceeds the "
            "reference's by at most this fraction (0.02: 2 %); null: not checked. Only "
            "meaningful with the real checkpoint's weights.",
        ),
    ] = None


class QualityResult(_Wire, frozen=True, kw_only=True):
    label: str
    token_agreement: float
    """Fraction of positions where the candidate's top-1 next token equals the reference's."""
    mean_kl: float
    """Mean KL(reference || candidate) over positions, nats."""
    p99_kl: float
    perplexity: float
    perplexity_increase: float
    """candidate / reference perplexity - 1."""
    passed: bool
    reasons: tuple[str, ...] = ()
    """Each threshold the candidate missed, in words."""
    emulated: str | None = None
    """How the format was applied where the host lacks its kernel (e.g. "nf4 quantize -> dequantize
    of every linear weight, blocksize 64, computed in bf16"); null when run natively."""


class QualityReport(_Wire, frozen=True, kw_only=True):
    eval_set: str
    sequences: int
    tokens: int
    """Positions compared per candidate."""
    weights: str
    """`checkpoint` or `synthetic`: with synthetic weights the numbers measure numerical
    divergence only, not the quality of a trained model."""
    reference_perplexity: float
    candidates: tuple[QualityResult, ...]
    passed: bool
    """Every candidate passed."""
