"""The output head's backward under a chunked loss (torchtune's CEWithChunkedOutputLoss).

A chunked loss applies lm_head to every chunk of the sequence first, then computes each
chunk's loss. Autograd runs the nodes made last first, so in backward the loss of every chunk
is differentiated before lm_head's backward of any: the gradients of all the chunks' logits
(the logits' dtype, ``tokens x vocab`` in all) wait together, and lm_head's backward then
takes them one chunk at a time. With LoRA (a frozen head) that is all its backward does; in
full fine-tuning each chunk also makes a gradient of the head's weight, which autograd adds
to the others' sum out of place.

Activation offloading changes none of it: the recipes that offload (torchtune's and TRL's
``get_act_offloading_ctx_manager``) leave lm_head's saved tensors on the device, and torchtune
computes the loss outside the offloading region.

Private to estimate() (memory/estimating.py): pure arithmetic, no torch.
"""

from __future__ import annotations

from typing import Any

from .compiled import compiled_cross_entropy_bytes
from .settings import outer_lora_targets


def backward_moments(step: Any, bw_start: dict[str, int]) -> list[dict[str, int]]:
    """LoRA (a frozen head) with a chunked loss: two moments of the backward after its start
    (``bw_start``, the loss's backward on the first chunk it takes, the sequence's last), with
    the label of each: the loss's backward on its last chunk (the sequence's first, the
    largest of tensor_split), with every other chunk's logit gradient waiting and only this
    chunk's log-softmax (or, compiled, its kept logits) left, the others' freed by their own
    backward; then lm_head's backward on its first chunk, with all the chunks' logit gradients
    and the gradient of its slice of the hidden states. None apply to a standard loss or to
    full fine-tuning (``accumulation_moments``)."""
    s, spec = step.settings, step.spec
    if s.loss != "chunked" or step.ctx.trains_base:
        return []
    tokens, vocab, logit_bytes = step.ctx.tokens, spec.vocab_size, step.compute_bytes
    chunk_tokens = s.batch_size * -(-s.seq_len // s.loss_chunks)
    waiting = logit_bytes * (tokens - chunk_tokens) * vocab
    if s.compile:
        loss = compiled_cross_entropy_bytes(chunk_tokens, vocab, logit_bytes, chunk_tokens * vocab)
        this_chunk = loss.kept + loss.gradient
    else:  # its fp32 log-softmax and the two fp32 gradients of its backward
        this_chunk = 12 * chunk_tokens * vocab
    last_loss_chunk = dict(bw_start, logits=this_chunk + waiting)
    logit_gradients = logit_bytes * tokens * vocab
    if "lm_head" in outer_lora_targets(s.lora_targets):
        # a LoRA lm_head: the scaled adapter output's gradient, one chunk's logits in size
        logit_gradients += logit_bytes * chunk_tokens * vocab
    first_head_chunk = dict(
        bw_start,
        logits=logit_gradients,
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
    Two moments: the first chunk's weight gradient made beside every logit gradient; the
    second's, with the sum and the new sum, once the first two chunks' logit gradients are
    freed."""
    s, spec = step.settings, step.spec
    if s.loss != "chunked" or not step.ctx.trains_base:
        return []
    vocab, hidden = spec.vocab_size, spec.hidden_size
    chunks = chunk_tokens(step)
    # in the compute dtype: under autocast the chunks share one cached cast of the weight,
    # whose gradient is summed before it is cast back
    weight_grad = step.compute_bytes * vocab * hidden
    logit_grads = step.compute_bytes * vocab * step.ctx.tokens

    def moment(done: int, weight_grads: int) -> dict[str, int]:
        return dict(
            bw_start,
            logits=logit_grads - step.compute_bytes * vocab * sum(chunks[:done]),
            activations=bw_start["activations"]
            + step.residual_bytes * hidden * sum(chunks[: max(done, 1)]),
            temporaries=bw_start["temporaries"] + weight_grads * weight_grad,
        )

    moments = [moment(0, 1)]
    if len(chunks) > 1:
        moments.append(moment(2, 3))
    return moments


ACCUMULATION_LABELS = ("backward, lm_head's first chunk", "backward, lm_head's second chunk")
