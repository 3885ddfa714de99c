"""The output head's backward under a chunked loss with activation offloading.

A chunked loss (torchtune's CEWithChunkedOutputLoss) applies lm_head to every chunk of the
sequence first, then computes each chunk's loss. Autograd runs the nodes made last first, so
in backward the loss of every chunk is differentiated before lm_head's backward of any: the
gradients of all the chunks' logits (the logits' dtype, ``tokens x vocab`` in all) wait
together, and lm_head's backward then takes them one chunk at a time, each with the weight it
saved. With activation offloading that saved weight was copied to host memory in forward and
comes back to the device for that chunk's backward.

Which weight a chunk saves depends on its input (torch.matmul's ``should_fold``). A chunk is a
slice of the sequence, a non-contiguous view when the batch holds more than one sequence. With
a trained lm_head (full fine-tuning), or under autocast (whose cast makes a contiguous copy of
the input), the matmul folds the batch into rows and saves the weight as it is, ``vocab x
hidden``. A frozen head in pure bf16 (or fp32) LoRA/QLoRA does not fold: the weight is
expanded over the batch for a batched matmul and that expanded view is saved; offloading's
copy of it is a full tensor, ``batch`` times the weight.

Private to estimate() (memory/estimating.py): pure arithmetic, no torch.
"""

from __future__ import annotations

from typing import Any

from .compiled import compiled_cross_entropy_bytes
from .settings import outer_lora_targets


def folds(step: Any) -> bool:
    """Whether lm_head's matmul on a chunk folds the batch into rows (see the module doc)."""
    s, ctx = step.settings, step.ctx
    sliced = s.loss == "chunked" and s.loss_chunks > 1 and s.batch_size > 1
    return bool(ctx.trains_base or step.autocast or not sliced)


def saved_head_weight_bytes(step: Any) -> int:
    """Bytes of the weight lm_head's matmul saves for one chunk, as offloading copies it."""
    spec, batch = step.spec, int(step.settings.batch_size)
    weight: int = step.compute_bytes * spec.vocab_size * spec.hidden_size
    return weight if folds(step) else weight * batch


def backward_moments(step: Any, bw_start: dict[str, int]) -> list[dict[str, int]]:
    """Two moments of the backward after its start (``bw_start``, the loss's backward on the
    first chunk it takes, the sequence's last), with the label of each: the loss's backward
    on its last chunk (the sequence's first, the largest of tensor_split), with every other
    chunk's logit gradient waiting; then lm_head's backward on its first chunk, with all the
    chunks' logit gradients, that chunk's saved weight back on the device and the gradient of
    its slice of the hidden states. None apply to a standard loss, without offloading, or to
    full fine-tuning (whose head's own gradient is modelled at the start of backward)."""
    s, spec = step.settings, step.spec
    if s.loss != "chunked" or not s.activation_offload or step.ctx.trains_base:
        return []
    tokens, vocab = step.ctx.tokens, spec.vocab_size
    chunk_tokens = s.batch_size * -(-s.seq_len // s.loss_chunks)
    waiting = step.compute_bytes * (tokens - chunk_tokens) * vocab
    logits = bw_start["logits"]
    if s.compile:
        # each chunk's compiled backward has run and its saved logits are released: of what the
        # compiled loss keeps, only this chunk's (back from the host) is left
        loss = compiled_cross_entropy_bytes(
            chunk_tokens, vocab, step.compute_bytes, chunk_tokens * vocab
        )
        logits = loss.kept + loss.gradient
    last_loss_chunk = dict(bw_start, logits=logits + waiting)
    logit_gradients = step.compute_bytes * tokens * vocab
    if "lm_head" in outer_lora_targets(s.lora_targets):
        # a LoRA lm_head: the scaled adapter output's gradient, one chunk's logits in size
        logit_gradients += step.compute_bytes * chunk_tokens * vocab
    first_head_chunk = dict(
        bw_start,
        logits=logit_gradients + saved_head_weight_bytes(step),
        activations=bw_start["activations"] + step.residual_bytes * chunk_tokens * spec.hidden_size,
    )
    return [last_loss_chunk, first_head_chunk]


LABELS = ("backward, the loss's last chunk", "backward, lm_head's first chunk")


def chunk_tokens(step: Any) -> list[int]:
    """Tokens of each chunk of a chunked loss in the order lm_head's backward takes them (the
    sequence's last first), as tensor_split cuts the sequence (its first chunks one longer)."""
    s = step.settings
    size, longer = divmod(s.seq_len, s.loss_chunks)
    lengths = [size + (1 if i < longer else 0) for i in range(s.loss_chunks)]
    return [s.batch_size * n for n in reversed(lengths) if n]


def accumulation_moments(step: Any, bw_start: dict[str, int]) -> list[dict[str, int]]:
    """Full fine-tuning with a chunked loss: once the loss of every chunk is differentiated,
    their logit gradients wait together and lm_head's backward takes them one chunk at a
    time, each making a weight gradient that autograd adds to the others' sum out of place.
    Two moments: the first chunk's weight gradient made beside every logit gradient; then the
    second chunk's. Without offloading the second moment is that chunk's sum, with the first
    two chunks' logit gradients freed and three weight gradients (the sum, the new gradient
    and the new sum). With offloading each chunk's saved weight comes back from the host
    (``saved_head_weight_bytes``) as that chunk's backward starts, while only the first
    chunk's logit gradient is freed: the second chunk's gradient is made beside the first's,
    the weight back on the device and every later chunk's logit gradient still waiting."""
    s, spec = step.settings, step.spec
    if s.loss != "chunked" or not step.ctx.trains_base:
        return []
    vocab, hidden = spec.vocab_size, spec.hidden_size
    chunks = chunk_tokens(step)
    # in the compute dtype: under autocast the chunks share one cached cast of the weight,
    # whose gradient is summed before it is cast back
    weight_grad = step.compute_bytes * vocab * hidden
    logit_grads = step.compute_bytes * vocab * step.ctx.tokens
    weight_back = saved_head_weight_bytes(step) if s.activation_offload else 0

    def moment(done: int, weight_grads: int) -> dict[str, int]:
        return dict(
            bw_start,
            logits=logit_grads - step.compute_bytes * vocab * sum(chunks[:done]) + weight_back,
            activations=bw_start["activations"]
            + step.residual_bytes * hidden * sum(chunks[: max(done, 1)]),
            temporaries=bw_start["temporaries"] + weight_grads * weight_grad,
        )

    moments = [moment(0, 1)]
    if len(chunks) > 1:
        moments.append(moment(1, 2) if s.activation_offload else moment(2, 3))
    return moments


ACCUMULATION_LABELS = ("backward, lm_head's first chunk", "backward, lm_head's second chunk")
