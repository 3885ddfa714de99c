"""gpt-oss's attention: biased q, k, v and o projections, rotary on half-width tables, and a
learned "sink" logit per head that joins each row of scores before the softmax and is dropped
after it (transformers' eager attention, the one gpt-oss trains with: it has no SDPA path).

Sliding-window and full-attention layers save the same tensors here: the eager path adds the
mask of its layer's type to the scores and keeps nothing of it for backward.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..models.spec import ModelSpec, ParamTensor
from .activations import Flow, Saved, StepContext, linear

INDEX_BYTES = 8  # int64: the row maximum's indices, kept by max() for its backward


@dataclass(frozen=True)
class SinkAttention:
    """Eager attention with sinks: the scores with one sink column per row, less their row
    maximum, a softmax over them (in the compute dtype; fp32 under autocast, with a 16-bit
    copy of the probabilities for the product with v), the sink column dropped. Each product
    keeps what the gradients of its inputs that need one require."""

    def parameters(self, spec: ModelSpec) -> tuple[ParamTensor, ...]:
        return tuple(t for t in spec.parameter_tensors().layer if t.name.startswith("self_attn."))

    def forward(
        self, saved: Saved, ctx: StepContext, spec: ModelSpec, layer: int, flow: Flow
    ) -> Flow:
        hidden, compute, residual = spec.hidden_size, ctx.compute_bytes, ctx.residual_bytes
        batch, seq, tokens = ctx.batch_size, ctx.seq_len, ctx.tokens
        q_size, kv_size, heads, prefix = spec.q_size, spec.kv_size, spec.n_heads, f"L{layer}"
        q_grad = linear(saved, ctx, f"{prefix}.q_proj", flow, hidden, q_size, ctx.qlora)
        k_grad = linear(saved, ctx, f"{prefix}.k_proj", flow, hidden, kv_size, ctx.qlora)
        v_grad = linear(saved, ctx, f"{prefix}.v_proj", flow, hidden, kv_size, ctx.qlora)
        # the sinks are trained with the rest: the scores need a gradient then too
        scores_grad = q_grad or k_grad or ctx.trains_base
        repeated = spec.n_heads > spec.n_kv_heads  # repeat_kv copies k and v to every head
        if q_grad or k_grad:
            # cos and sin of half the head's width, made once per forward, shared by every layer
            saved.add("rope.cos", residual * seq * spec.head_width // 2)
            saved.add("rope.sin", residual * seq * spec.head_width // 2)
        # q @ k^T keeps k for q's gradient and q for k's (the first layer under LoRA on q and
        # v: k needs none)
        if q_grad:
            saved.add(f"{prefix}.attn.k", compute * tokens * (q_size if repeated else kv_size))
        if k_grad:
            saved.add(f"{prefix}.attn.q", compute * tokens * q_size)
        scores = batch * heads * seq
        if scores_grad:  # the row maximum's indices and the softmax's output
            saved.add(f"{prefix}.attn.max_index", INDEX_BYTES * scores)
            saved.add(f"{prefix}.attn.probs", (4 if ctx.autocast else compute) * scores * (seq + 1))
        if v_grad:  # probs @ v keeps the probabilities (a 16-bit copy under autocast) for v's
            if ctx.autocast and compute != 4:
                saved.add(f"{prefix}.attn.probs16", compute * scores * seq)
            else:
                saved.add(f"{prefix}.attn.probs", compute * scores * (seq + 1))
        if scores_grad:  # and v for the probabilities' gradient
            v_key = f"{prefix}.attn.v" if repeated else f"{prefix}.v_proj.out"
            saved.add(v_key, compute * tokens * (q_size if repeated else kv_size))
        any_grad = scores_grad or v_grad
        out_grad = linear(
            saved,
            ctx,
            f"{prefix}.o_proj",
            Flow(f"{prefix}.attn.out", compute, any_grad),
            q_size,
            hidden,
            ctx.qlora,
            held=saved.held_unless_saved(flow.key, residual * tokens * hidden),
        )
        return Flow(f"{prefix}.o_proj.out", compute, out_grad)
