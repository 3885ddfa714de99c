"""The mixture-of-experts MLP blocks (qwen3_moe and mixtral: MoEMLP; gpt_oss, with biases and
its clamped SwiGLU: BiasedMoEMLP): what their weights are and what one forward saves for
backward, as transformers 5's grouped-GEMM experts allocate it.

A token's hidden state goes through the router (a linear layer to one logit per expert, a
softmax in fp32, the top-k), is copied once per chosen expert and sorted by expert
(``hidden_states[perm // top_k]``), runs through the experts' gate_up and down projections as
two grouped matrix multiplications over all the chosen rows, is weighted by its routing
weight, put back in token order and summed over its k experts.

Every tensor of that path has ``tokens x top_k`` rows whatever the routing: the saved bytes
do not depend on how evenly the router spreads the tokens. The estimate assumes balanced top-k
routing; a real step with every token sent to the same k experts peaks where a balanced one
does (tests/memory/test_moe_block.py). transformers' "eager" experts (a loop over the experts)
keep more and are not modelled.

With gradient checkpointing the backward of the sum over the k experts makes the per-row
gradient before the un-permutation asks for its saved index, which starts the recomputation:
the recomputed layer's peak is its forward up to that index, beside that gradient, with what
the forward's frames hold then (the gathered rows, the weighted rows, the router's logits).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..models.experts import EXPERT_TARGETS
from ..models.spec import ModelSpec, ParamTensor
from .activations import Flow, Saved, StepContext

INDEX_BYTES = 8  # int64 indices (top-k, the sort's permutation and its inverse)
OFFSET_BYTES = 4  # int32 offsets of each expert's rows for the grouped GEMM
ROUTER_BYTES = 4  # the router's softmax runs in fp32


@dataclass(frozen=True)
class MoEMLP:
    """A sparse MoE MLP: a router and ``n_experts`` gated experts, ``experts_per_token`` of
    them per token. ``normalize_top_k``: the top-k probabilities divided by their sum
    (Mixtral always; Qwen3-MoE when ``norm_topk_prob``). ``float_weights``: the routing
    weights stay fp32 (Mixtral) instead of being cast to the compute dtype (Qwen3-MoE)."""

    normalize_top_k: bool = False
    float_weights: bool = False

    def parameters(self, spec: ModelSpec) -> tuple[ParamTensor, ...]:
        """The router and every expert's weights, as transformers stores them (3D tensors)."""
        experts, hidden, width = spec.n_experts, spec.hidden_size, spec.expert_intermediate_size
        return (
            ParamTensor("mlp.gate.weight", (experts, hidden), "other"),
            ParamTensor("mlp.experts.gate_up_proj", (experts, 2 * width, hidden), "other"),
            ParamTensor("mlp.experts.down_proj", (experts, hidden, width), "other"),
        )

    def forward(
        self, saved: Saved, ctx: StepContext, spec: ModelSpec, layer: int, flow: Flow
    ) -> Flow:
        """Add what the block saves for backward (16-bit compute: the grouped GEMM runs in
        the weights' dtype, bf16 in training) and return its output."""
        trains = ctx.trains_base
        lora_gate_up, lora_down = (name in ctx.lora_targets for name in EXPERT_TARGETS)
        if not (trains or flow.needs_grad or lora_gate_up or lora_down):
            return Flow(f"L{layer}.moe_out", ctx.residual_bytes, False)
        tokens, hidden = ctx.tokens, spec.hidden_size
        experts, top_k = spec.n_experts, spec.experts_per_token
        width, compute = spec.expert_intermediate_size, ctx.compute_bytes
        rows = tokens * top_k  # one row per (token, chosen expert)
        prefix = f"L{layer}.moe"
        # which tensors of the path need a gradient: the router's (and the gathered rows'),
        # the gate_up output's, the down output's (LoRA on a weight makes its output need one)
        routed = trains or flow.needs_grad
        up_grad = routed or lora_gate_up
        if trains:  # the router's input, for its weight's gradient
            saved.add(flow.key, compute * tokens * hidden)
        if routed:
            saved.add(f"{prefix}.router_probs", ROUTER_BYTES * tokens * experts)
            saved.add(f"{prefix}.top_k_index", INDEX_BYTES * tokens * top_k)
            if self.normalize_top_k:  # the division's inputs: the top-k values and their sum
                saved.add(f"{prefix}.top_k_values", ROUTER_BYTES * tokens * top_k)
                saved.add(f"{prefix}.top_k_sum", ROUTER_BYTES * tokens)
            # the gather's token index (perm // top_k) and the weights' permutation
            saved.add(f"{prefix}.token_index", INDEX_BYTES * rows)
            saved.add(f"{prefix}.perm", INDEX_BYTES * rows)
        saved.add(f"{prefix}.offsets", OFFSET_BYTES * experts)
        if trains or lora_gate_up:  # the grouped gate_up's input, for its weight's gradient
            saved.add(f"{prefix}.gathered", compute * rows * hidden)
        if lora_gate_up:
            expert_lora(saved, ctx, spec, f"{prefix}.gate_up_proj", 2 * width, hidden, routed)
        if up_grad:
            saved.add(f"{prefix}.gate_up", compute * rows * 2 * width)  # gate and up: views
            saved.add(f"{prefix}.act", compute * rows * width)  # act(gate), for the product
        if trains or lora_down:  # act(gate) * up: the grouped down's input
            saved.add(f"{prefix}.gated", compute * rows * width)
        if lora_down:
            expert_lora(saved, ctx, spec, f"{prefix}.down_proj", hidden, width, up_grad)
        before = saved.activations
        weight_bytes = ROUTER_BYTES if self.float_weights else compute
        # the weighted rows: fp32 routing weights (Mixtral) promote the product to fp32
        row_bytes = max(weight_bytes, compute)
        saved.add(f"{prefix}.routing_weights", weight_bytes * rows)
        if routed:  # for the routing weights' gradient
            saved.add(f"{prefix}.down_out", compute * rows * hidden)
        saved.add(f"{prefix}.inverse_perm", INDEX_BYTES * rows)
        weighting = saved.activations - before
        saved.freed_first = weighting + (compute * rows * width if trains or lora_down else 0)
        # inside the backward, once the grouped down's is done: its input gradient, the gate
        # and up gradients the product makes from it, and the routing weights' gradient
        saved.mlp_grads = (compute * rows * 3 * width + weight_bytes * rows) if up_grad else 0
        if lora_gate_up or lora_down:
            saved.weight_grad_moments = expert_weight_grads(
                ctx,
                spec,
                (lora_gate_up, lora_down),
                routed=routed,
                weighting=weighting,
                activation=compute * rows * 3 * width,
                weight_bytes=weight_bytes,
            )
        # with checkpointing, the backward of the sum over the k experts makes the per-row
        # gradient (contiguous, rows x hidden) before the un-permutation asks for its saved
        # index and so starts the recomputation: it is alive while the layer is made again
        saved.incoming = row_bytes * rows * hidden
        # then the weighting's backward, once the un-permutation has put that gradient back in
        # row order (into zeros, in place): the row-order gradient, the down output's gradient
        # and the product with the down output that becomes the routing weights' gradient
        saved.unsort_grads = 3 * row_bytes * rows * hidden
        saved.forward_held = self._held_at_last_save(saved, ctx, spec, layer, flow, row_bytes)
        # the forward's top, once the arange is gone: the rows put back in token order
        saved.forward_extra = saved.forward_held - INDEX_BYTES * rows + row_bytes * rows * hidden
        return Flow(f"L{layer}.moe_out", ctx.residual_bytes, True)

    def _held_at_last_save(
        self,
        saved: Saved,
        ctx: StepContext,
        spec: ModelSpec,
        layer: int,
        flow: Flow,
        row_bytes: int,
    ) -> int:
        """What the forward's frames hold, besides the saved tensors, when a recomputation
        stops at the block's last saved tensor (the un-permutation's index): the residual and
        the block's input, the router's logits and routing weights, the sorted expert ids, the
        histogram's input and counts, the gathered rows (saved only when the experts train),
        the weighted rows and the index being built."""
        tokens, hidden, compute = ctx.tokens, spec.hidden_size, ctx.compute_bytes
        experts, rows = spec.n_experts, ctx.tokens * spec.experts_per_token
        weight_bytes = ROUTER_BYTES if self.float_weights else compute
        prefix = f"L{layer}.moe"
        return (
            saved.held_unless_saved(f"L{layer}.mid", ctx.residual_bytes * tokens * hidden)
            + saved.held_unless_saved(flow.key, flow.element_bytes * tokens * hidden)
            + compute * tokens * experts  # the router's logits
            + weight_bytes * rows  # the top-k weights before the sort
            + 2 * INDEX_BYTES * rows  # the sorted expert ids; the arange of the inverse
            + ROUTER_BYTES * (rows + experts)  # histc's fp32 input and its counts
            + saved.held_unless_saved(f"{prefix}.gathered", compute * rows * hidden)
            + row_bytes * rows * hidden
            + saved.cached_folds
        )


@dataclass(frozen=True)
class BiasedMoEMLP:
    """gpt-oss's MoE MLP: a router with a bias (top-k of its logits, then a softmax over those
    k, in the compute dtype), and experts whose gate_up and down projections have a bias each
    (gathered per row by expert) and whose activation is gpt-oss's clamped SwiGLU on the
    interleaved gate and up columns: ``(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)``
    with ``g = clamp(gate, max=limit)``; grouped-GEMM experts, as transformers 5 runs them."""

    def parameters(self, spec: ModelSpec) -> tuple[ParamTensor, ...]:
        return tuple(t for t in spec.parameter_tensors().layer if t.name.startswith("mlp."))

    def forward(
        self, saved: Saved, ctx: StepContext, spec: ModelSpec, layer: int, flow: Flow
    ) -> Flow:
        """Add what the block saves for backward and return its output (16-bit compute, as
        MoEMLP)."""
        trains = ctx.trains_base
        lora_gate_up, lora_down = (name in ctx.lora_targets for name in EXPERT_TARGETS)
        if not (trains or flow.needs_grad or lora_gate_up or lora_down):
            return Flow(f"L{layer}.moe_out", ctx.residual_bytes, False)
        tokens, hidden = ctx.tokens, spec.hidden_size
        experts, top_k = spec.n_experts, spec.experts_per_token
        width, compute = spec.expert_intermediate_size, ctx.compute_bytes
        rows = tokens * top_k
        prefix = f"L{layer}.moe"
        routed = trains or flow.needs_grad  # as MoEMLP
        up_grad = routed or lora_gate_up
        if trains:  # the router's input, for its weight's gradient
            saved.add(flow.key, compute * tokens * hidden)
        if routed:
            saved.add(f"{prefix}.top_k_index", INDEX_BYTES * tokens * top_k)
            saved.add(f"{prefix}.top_k_probs", compute * tokens * top_k)  # the softmax's output
            saved.add(f"{prefix}.token_index", INDEX_BYTES * rows)
            saved.add(f"{prefix}.perm", INDEX_BYTES * rows)
        if trains:  # each row's expert, to gather the biases' gradients
            saved.add(f"{prefix}.expert_ids", INDEX_BYTES * rows)
        saved.add(f"{prefix}.offsets", OFFSET_BYTES * experts)
        if trains or lora_gate_up:
            saved.add(f"{prefix}.gathered", compute * rows * hidden)
        if lora_gate_up:
            expert_lora(saved, ctx, spec, f"{prefix}.gate_up_proj", 2 * width, hidden, routed)
        if up_grad:
            saved.add(f"{prefix}.gate_up", compute * rows * 2 * width)  # both clamps' input
            # the activation: sigmoid's output, the clamped gate, up + 1 and the gated product
            for part in ("sigmoid", "gate", "up_plus_one", "glu"):
                saved.add(f"{prefix}.{part}", compute * rows * width)
        if trains or lora_down:  # the grouped down's input
            saved.add(f"{prefix}.gated", compute * rows * width)
        if lora_down:
            expert_lora(saved, ctx, spec, f"{prefix}.down_proj", hidden, width, up_grad)
        before = saved.activations
        saved.add(f"{prefix}.routing_weights", compute * rows)
        if routed:
            saved.add(f"{prefix}.down_out", compute * rows * hidden)
        saved.add(f"{prefix}.inverse_perm", INDEX_BYTES * rows)
        weighting = saved.activations - before
        saved.freed_first = weighting + (compute * rows * width if trains or lora_down else 0)
        if lora_gate_up or lora_down:
            saved.weight_grad_moments = expert_weight_grads(
                ctx,
                spec,
                (lora_gate_up, lora_down),
                routed=routed,
                weighting=weighting,
                activation=compute * rows * 6 * width,
                weight_bytes=compute,
            )
        # the backward's own: the rows' output gradient, the down's input gradient and the
        # activation's (up + 1, glu, the clamped gate's) before the gate_up gradient
        saved.mlp_grads = compute * rows * (hidden + 4 * width)
        return Flow(f"L{layer}.moe_out", ctx.residual_bytes, True)


def expert_lora(
    saved: Saved,
    ctx: StepContext,
    spec: ModelSpec,
    name: str,
    n_out: int,
    n_in: int,
    input_grad: bool,
) -> None:
    """What peft's LoRA on one 3D expert weight (its ParamWrapper, ``target_parameters``)
    saves: the forward folds the factors into a full copy of the expert stack,
    ``baddbmm(W, B, A)`` in the weights' dtype, which saves both factors (cast to that dtype
    when the adapters are in another, views of them otherwise), and the grouped GEMM keeps the
    folded copy for its input's gradient when the input needs one."""
    experts, rank, compute = spec.n_experts, ctx.lora_rank, ctx.compute_bytes
    if ctx.adapter_bytes != compute:
        saved.add(f"{name}.lora_factors", compute * rank * experts * (n_in + n_out))
    folded = compute * experts * n_out * n_in
    if input_grad:
        saved.add(f"{name}.folded", folded)
    else:  # parametrize's cache holds it until the experts' forward returns
        saved.cached_folds += folded


def expert_weight_grads(
    ctx: StepContext,
    spec: ModelSpec,
    lora: tuple[bool, bool],
    *,
    routed: bool,
    weighting: int,
    activation: int,
    weight_bytes: int,
) -> list[int]:
    """The backward's moments of LoRA on the experts' weights, beside the layer's saved tensors
    and the gradient from above: each targeted grouped GEMM's backward makes the gradient of
    the whole folded expert stack (and its input's gradient), then the fold's backward turns
    it into the factors' gradients. ``lora``: (gate_up, down) targeted; ``weighting``: bytes
    the weighting and un-permutation saved; ``activation``: what the activation saved."""
    lora_gate_up, lora_down = lora
    tokens, hidden, compute = ctx.tokens, spec.hidden_size, ctx.compute_bytes
    experts, rank, adapter = spec.n_experts, ctx.lora_rank, ctx.adapter_bytes
    width, rows = spec.expert_intermediate_size, tokens * spec.experts_per_token
    up_grad = routed or lora_gate_up
    routing_grad = weight_bytes * rows if routed else 0  # the routing weights' gradient
    factor_bytes = compute if adapter != compute else 0  # the factors' casts, saved
    moments: list[int] = []
    freed = weighting
    if lora_down:
        folded, factors = compute * experts * hidden * width, rank * experts * (hidden + width)
        gated = compute * rows * width
        grads = compute * rows * hidden + routing_grad + (gated if up_grad else 0)
        moments.append(-freed + grads + folded)
        kept = folded if up_grad else 0
        moments.append(-freed - kept - gated + grads + folded + (compute + adapter) * factors)
        freed += gated + kept + factor_bytes * factors
    if lora_gate_up:
        folded, factors = (
            compute * experts * 2 * width * hidden,
            rank * experts * (hidden + 2 * width),
        )
        gathered = compute * rows * hidden
        freed += activation
        grads = compute * rows * 2 * width + (gathered if routed else 0) + routing_grad
        if lora_down:  # the down factors' gradients, made already in the weights' dtype
            grads += compute * rank * experts * (hidden + width)
        moments.append(-freed + grads + folded)
        kept = folded if routed else 0
        moments.append(-freed - kept - gathered + grads + folded + (compute + adapter) * factors)
    return moments
