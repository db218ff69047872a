"""Logits: the output layer's activations.

Shown in answers::

    rows x vocab_per_device x bytes (training: + fp32 copy + fp32 log-softmax)

(training: no fp32 copy of fp32 logits; with ``cross_entropy_no_upcast`` the log-softmax is in
the compute dtype.)
"""

from __future__ import annotations

__all__ = [
    "FORMULA",
    "LITGPT_HELD_PART",
    "LOOP_HELD_PART",
    "SOFTCAP_PART",
    "SOURCE",
    "fused_loss_parts",
    "inference_logits",
    "loop_held_parts",
    "training_backward_parts",
    "training_forward_parts",
    "training_recompute_parts",
]

SOFTCAP_PART = "soft-capped logits saved by tanh (final_logit_softcapping)"
LITGPT_HELD_PART = "fp32 logits (the training loop still holds them)"
LOOP_HELD_PART = "the model output's logits, which the training loop holds until the step"

FORMULA = "rows x vocab_per_device x bytes (training: + fp32 copy + fp32 log-softmax)"
SOURCE = "transformers ForCausalLMLoss (logits.float()); torch cross_entropy"

FP32 = 4


def inference_logits(rows: int, vocab: int, vocab_full: int, e: int) -> int:
    """The LM head's output in the compute dtype on this device's vocabulary slice, plus the
    fp32 copy of the full vocabulary that sampling takes (vLLM gathers logits on the first
    rank): ``rows x (vocab_per_device x e + vocab x 4)``.

    Worked number: Llama 3.1 8B (vocab 128,256), 8 rows in bf16 on one device:
    8 x (128,256 x 2 + 128,256 x 4) = 6,156,288 B."""
    return rows * (vocab * e + vocab_full * FP32)


def loop_held_parts(
    tokens: int, vocab: int, e: int, head_freed: bool
) -> tuple[tuple[str, int], ...]:
    """The logits a training loop holding the model's output keeps through the backward and
    the optimizer step: ``tokens x vocab x 4`` where the model's forward returned them upcast
    (``head_freed``: :func:`vrambudget.core.stack.upcast_rebound`), else ``tokens x vocab x e``.

    Worked number: 4,096 tokens, vocab 128,256: 2,101,346,304 B upcast, 1,050,673,152 B in
    bf16."""
    return ((LOOP_HELD_PART, tokens * vocab * (FP32 if head_freed else e)),)


_CHUNK_BYTES = {
    # per chunk element, e the compute dtype's bytes (LigerLoss.chunks)
    "fp32_copy": (2, 4, "the previous chunk's logits and scaled copy, the current one in fp32"),
    "scaled_copy": (3, 0, "the previous chunk's logits and scaled copy, the current one's"),
    "aliased": (2, 0, "two chunks' logits (the previous one still bound)"),
    "deleted": (1, 0, "one chunk's logits"),
}


def fused_loss_parts(
    tokens: int,
    vocab: int,
    hidden: int,
    e: int,
    input_e: int,
    head_gradient: int,
    chunks: str,
    head_upcast: bool,
) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]:
    """Liger's fused linear cross-entropy (what it saves, what its forward works in): its
    forward fills the hidden states' gradient, ``tokens x hidden x input_e`` (the head's input
    dtype), and a trainable head's weight gradient (``head_gradient`` bytes; 0 for a frozen
    head), and saves both for the backward, which hands them on; it computes the logits a chunk
    of ``chunk = next_pow2(ceil(tokens / ceil(vocab / hidden)))`` rows (at most ``tokens``) at a
    time, with the copies its release keeps (``chunks``: ``chunk x vocab x (2e + 4)``, ``3e``,
    ``2e`` or ``e``); ``head_upcast``: each chunk adds its head-gradient product through a
    head-sized temporary in the compute dtype and its fp32 copy, ``vocab x hidden x (e + 4)``,
    while a head is trained. The forward holds both, the backward's start what is saved.

    Worked number: Llama 3.1 8B (vocab 128,256, hidden 4,096) full fine-tune in bf16, 8,192
    tokens, liger 0.8.0 (``aliased``, ``head_upcast``): chunk 256; saved 8,192 x 4,096 x 2 +
    128,256 x 4,096 x 2 = 1,117,782,016 B; work 256 x 128,256 x 4 + 128,256 x 4,096 x 6 =
    3,283,353,600 B."""
    inc = -(-vocab // hidden)
    chunk = min(1 << max(0, (-(-tokens // inc) - 1).bit_length()), tokens)
    saved: tuple[tuple[str, int], ...] = (
        (
            "hidden states' gradient, computed by the fused loss in its forward",
            tokens * hidden * input_e,
        ),
    )
    if head_gradient:
        saved += (
            ("LM head's weight gradient, computed by the fused loss in its forward", head_gradient),
        )
    times_e, plus, name = _CHUNK_BYTES[chunks]
    work: tuple[tuple[str, int], ...] = ((name, chunk * vocab * (times_e * e + plus)),)
    if head_upcast and head_gradient:
        work += (
            ("one chunk's head-gradient product", vocab * hidden * e),
            ("its fp32 copy", vocab * hidden * FP32),
        )
    return saved, work


def training_forward_parts(
    tokens: int,
    vocab: int,
    e: int,
    loss: str = "cross_entropy",
    chunks: int = 1,
    shift_copy: bool = False,
    compiled: bool = False,
    softcap: bool = False,
    shift_first: bool = False,
    head_freed: bool = False,
) -> tuple[tuple[str, int], ...]:
    """Forward: the LM head's output, its fp32 copy and the fp32 log-softmax live together:
    ``tokens x vocab x (e + 4 + 4)`` (``x 8`` for fp32 logits, which ``.float()`` returns);
    ``head_freed`` (transformers < 4.46 for most families, whose model forward rebinds ``logits =
    logits.float()``): the LM head's low-precision output is freed by the upcast, so only the
    fp32 tensors are live at the loss, ``tokens x vocab x 8`` (``x 12`` with the shifted copy);
    without the upcast (``cross_entropy_no_upcast``) ``tokens x vocab x 2e`` (``3e`` with a
    ``shift_copy``: the shifted logits' contiguous copy). ``shift_first``: the copy is made in
    the compute dtype before the upcast (Qwen (v1)'s own code shifts its logits and autocast
    runs the loss in fp32): ``tokens x vocab x (2e + 8)``. A chunked loss
    (torchtune) upcasts one of ``chunks``
    slices at a time and keeps every slice's log-softmax: ``tokens x vocab x (e + 4) +
    ceil(tokens / chunks) x vocab x 4``; a fused linear cross-entropy (Liger) materializes no
    logits. A chunked loss compiled by inductor (``compiled``) saves the low-precision chunks
    and an fp32 max and log-sum-exp per token: ``tokens x vocab x e + tokens x 8``. A loss in
    LitGPT's loss (Fabric returns fp32 logits, the loop holds the previous micro-batch's until
    the new ones are assigned): ``tokens x vocab x (e + 8)``; with ``shift_copy`` (a full
    fine-tune's reshaped copy of the shifted fp32 logits) ``tokens x vocab x 12``.

    Worked number: 4,096 tokens, vocab 128,256, bf16: 4,096 x 128,256 x 10 = 5,253,365,760 B;
    chunked in 8: 4,096 x 128,256 x 6 + 512 x 128,256 x 4 = 3,414,687,744 B; chunked and
    compiled: 4,096 x 128,256 x 2 + 4,096 x 8 = 1,050,705,920 B; LitGPT's:
    4,096 x 128,256 x 10 = 5,253,365,760 B.

    Soft-capped logits (``softcap``: Gemma 2's ``final_logit_softcapping``, ``tanh(logits /
    cap) x cap``) add tanh's saved output, ``tokens x vocab x e``, live until its backward
    (after the loss's); a fused linear cross-entropy caps inside its kernel."""
    parts = _forward(tokens, vocab, e, loss, chunks, shift_copy, compiled, shift_first, head_freed)
    return parts + _capped(tokens * vocab * e, loss, softcap)


def _capped(nbytes: int, loss: str, softcap: bool) -> tuple[tuple[str, int], ...]:
    return ((SOFTCAP_PART, nbytes),) if softcap and loss != "fused_linear_cross_entropy" else ()


def _forward(
    tokens: int,
    vocab: int,
    e: int,
    loss: str,
    chunks: int,
    shift_copy: bool,
    compiled: bool,
    shift_first: bool = False,
    head_freed: bool = False,
) -> tuple[tuple[str, int], ...]:
    v = tokens * vocab
    if loss == "fused_linear_cross_entropy":
        return ()
    if loss == "litgpt_chunked_cross_entropy":
        if shift_copy:  # at the loss: the fp32 logits, their reshaped copy, the log-softmax
            return (
                ("fp32 logits (Fabric's output conversion)", v * FP32),
                ("shifted fp32 logits (reshape copy)", v * FP32),
                ("fp32 log-softmax saved by cross-entropy, every chunk", v * FP32),
            )
        # As the LM head returns: its output, the fp32 copy (none when it is fp32 already), the
        # previous micro-batch's.
        own = (("lm_head output (until Fabric converts it)", v * e),) if e != FP32 else ()
        return (
            *own,
            ("fp32 logits (Fabric's output conversion)", v * FP32),
            (
                "previous micro-batch's fp32 logits, then the fp32 log-softmax saved by "
                "cross-entropy",
                v * FP32,
            ),
        )
    if loss == "chunked_cross_entropy" and compiled:
        return (
            ("lm_head output (saved by the compiled loss)", v * e),
            ("fp32 max and log-sum-exp per token", tokens * 2 * FP32),
        )
    if loss == "chunked_cross_entropy":
        return (
            ("lm_head output", v * e),
            ("log-softmax saved by cross-entropy, every chunk", v * FP32),
            ("fp32 upcast of one chunk", -(-tokens // chunks) * vocab * FP32),
        )
    if loss == "cross_entropy_no_upcast":
        copy = (("shifted logits (contiguous copy)", v * e),) if shift_copy else ()
        return (
            ("lm_head output", v * e),
            *copy,
            ("log-softmax saved by cross-entropy (compute dtype)", v * e),
        )
    shifted = (("shifted fp32 logits (contiguous copy)", v * FP32),) if shift_copy else ()
    if shift_copy and shift_first:
        shifted = (("shifted logits (contiguous copy, before the upcast)", v * e),)
    # logits.float() of fp32 logits returns them: no copy
    upcast = (("fp32 upcast for the loss", v * FP32),) if e != FP32 else ()
    # The upcast rebinding the model's own name frees the low-precision output (its peak, e + 4
    # per element during the cast, lies below the loss's).
    head = () if head_freed and upcast else (("lm_head output", v * e),)
    return (
        *head,
        *upcast,
        *shifted,
        ("log-softmax saved by cross-entropy", v * FP32),
    )


def training_backward_parts(
    tokens: int,
    vocab: int,
    loss: str = "cross_entropy",
    chunks: int = 1,
    e: int = 2,
    compiled: bool = False,
    joined: bool = False,
    softcap: bool = False,
) -> tuple[tuple[str, int], ...]:
    """Backward start: the saved log-softmax, the loss's fp32 gradient and log-softmax's fp32
    input gradient (the forward's low-precision logits and fp32 copy are freed by then):
    ``tokens x vocab x 12``; without the upcast ``tokens x vocab x 3e``; chunked, the two
    gradients of one chunk at a time; fused, none.
    Chunked and compiled: the saved low-precision chunks, each replaced by its gradient in the
    compute dtype (every chunk's loss backward runs before the LM head's), one chunk's
    gradient on top: ``tokens x vocab x e + ceil(tokens / chunks) x vocab x e``. LitGPT's: the
    fp32 logits its loop holds, the saved fp32 log-softmax (each chunk's replaced by its logits
    gradient, all of which precede the LM head's backward) and one chunk's two fp32 gradients:
    ``tokens x vocab x 8 + 2 x ceil(tokens / chunks) x vocab x 4``; ``joined`` (a full
    fine-tune, whose chunks are ``split`` views of one tensor): the chunks' gradients are
    joined into one full-size gradient, ``tokens x vocab x 12``. Soft-capped logits
    (``softcap``) keep tanh's output beside them."""
    parts = _backward(tokens, vocab, loss, chunks, e, compiled, joined)
    return parts + _capped(tokens * vocab * e, loss, softcap)


def _backward(
    tokens: int, vocab: int, loss: str, chunks: int, e: int, compiled: bool, joined: bool
) -> tuple[tuple[str, int], ...]:
    v = tokens * vocab
    if loss == "fused_linear_cross_entropy":
        return ()
    if loss == "litgpt_chunked_cross_entropy":
        held = (
            (LITGPT_HELD_PART, v * FP32),
            ("fp32 log-softmax saved by cross-entropy, then the logits' gradients", v * FP32),
        )
        if joined:  # SplitBackward's cat, then SliceBackward's full-size buffer
            return (*held, ("the chunks' gradients joined into one (fp32)", v * FP32))
        one = -(-tokens // chunks) * vocab * FP32
        return (
            *held,
            ("loss gradient of one chunk (fp32)", one),
            ("log-softmax input gradient of one chunk (fp32)", one),
        )
    if loss == "chunked_cross_entropy" and compiled:
        return (
            ("lm_head output saved, then its gradients", v * e),
            ("gradient of one chunk", -(-tokens // chunks) * vocab * e),
        )
    if loss == "cross_entropy_no_upcast":
        return (
            ("log-softmax saved by cross-entropy (compute dtype)", v * e),
            ("loss gradient (compute dtype)", v * e),
            ("log-softmax input gradient (compute dtype)", v * e),
        )
    chunk = v if loss != "chunked_cross_entropy" else -(-tokens // chunks) * vocab
    return (
        ("log-softmax saved by cross-entropy (fp32)", v * FP32),
        ("loss gradient (fp32)", chunk * FP32),
        ("log-softmax input gradient (fp32)", chunk * FP32),
    )


def training_recompute_parts(
    tokens: int, vocab: int, loss: str = "cross_entropy"
) -> tuple[tuple[str, int], ...]:
    """Full recomputation, while the layers are recomputed (after the LM head's backward):
    nothing of the loss, except LitGPT's fp32 logits, which its loop keeps referenced through
    ``fabric.backward`` (litgpt 0.4.5 finetune/full.py lines 254-257, lora.py lines 304-308):
    ``tokens x vocab x 4``."""
    if loss == "litgpt_chunked_cross_entropy":
        return ((LITGPT_HELD_PART, tokens * vocab * FP32),)
    return ()
