"""Workloads whose inputs are not a text prompt: an image model's forward pass, an
encoder-decoder's generation from an input sequence, a speech model's transcription.

Each takes a model like the text workloads do (a preset, a ``config.json`` of any family, a
Hub repository) and is run by the framework's own code in the trace tier
(``transformers``: ``ViTForImageClassification``, ``CLIPModel``, ``T5ForConditionalGeneration``,
``WhisperForConditionalGeneration`` ...)."""

from __future__ import annotations

import math
from typing import Annotated

from msgspec import Meta

from .limits import Batch, Tokens, TokensOrZero
from .workloads import Attention, _ModelWorkload

WHISPER_WINDOW_S = 30.0
"""Whisper's feature extractor pads (or splits) audio into 30 s windows (``chunk_length``)."""

__all__ = ["Seq2SeqWorkload", "SpeechToTextWorkload", "VisionWorkload"]


class VisionWorkload(_ModelWorkload, tag="vision", tag_field="kind", frozen=True, kw_only=True):
    """An image model's forward pass (ViT, the vision tower of CLIP / SigLIP, an image
    classifier): ``batch_size`` images of ``image_size`` pixels, each cut into
    ``(image_size / patch_size)^2`` patch tokens (plus a class token where the model has one)."""

    batch_size: Annotated[Batch, Meta(description="Images per forward pass.")] = 1
    image_size: Annotated[
        Annotated[int, Meta(ge=8, le=16384)] | None,
        Meta(
            description="Side of the (square) input image, pixels; default (null): the "
            "model's `image_size` (8 .. 16384)."
        ),
    ] = None
    attention: Attention = "sdpa"


class Seq2SeqWorkload(_ModelWorkload, tag="seq2seq", tag_field="kind", frozen=True, kw_only=True):
    """An encoder-decoder's generation (T5, BART, mT5 ...): the encoder reads ``input_tokens``
    once, the decoder generates ``generated_tokens`` with a self-attention cache that grows and
    a cross-attention cache of the encoder's keys and values per layer."""

    batch_size: Annotated[Batch, Meta(description="Sequences per request.")] = 1
    input_tokens: Annotated[Tokens, Meta(description="Encoder input per sequence, tokens.")] = 512
    generated_tokens: Annotated[
        TokensOrZero, Meta(description="Decoder tokens generated per sequence; 0: encode only.")
    ] = 128
    attention: Attention = "sdpa"


class SpeechToTextWorkload(
    _ModelWorkload, tag="speech_to_text", tag_field="kind", frozen=True, kw_only=True
):
    """A speech model's transcription (Whisper): ``audio_seconds`` of audio as log-mel frames
    (Whisper: 100 per second, padded to its 30 s window), the encoder over them (a stride-2
    convolution halves them: 1,500 positions), then the decoder generating
    ``generated_tokens`` with self- and cross-attention caches."""

    batch_size: Annotated[Batch, Meta(description="Audio clips per request.")] = 1
    audio_seconds: Annotated[
        float,
        Meta(
            gt=0.0,
            le=3600.0,
            description="Audio per clip, seconds (0 .. 3600); Whisper pads every clip to its "
            "30 s window and splits longer audio into 30 s windows (the batch holds them).",
        ),
    ] = 30.0
    generated_tokens: Annotated[
        TokensOrZero,
        Meta(description="Tokens generated per window (Whisper: at most 448 in all)."),
    ] = 224
    attention: Attention = "sdpa"

    @property
    def windows(self) -> int:
        """30 s windows per clip: Whisper's feature extractor pads a clip to its 30 s
        ``chunk_length`` and longer audio is split into such windows, batched together."""
        return max(1, math.ceil(self.audio_seconds / WHISPER_WINDOW_S))
