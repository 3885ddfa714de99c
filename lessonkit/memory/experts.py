"""The mixture-of-experts MLP blocks (qwen3_moe and mixtral: MoEMLP; gpt_oss, with biases and
its clamped SwiGLU: BiasedMoEMLP): what their weights are and what one forward saves for
backward, as transformers 5's grouped-GEMM experts allocate it.

A token's hidden state goes through the router (a linear layer to one logit per expert, a
softmax in fp32, the top-k), is copied once per chosen expert and sorted by expert
(``hidden_states[perm // top_k]``), runs through the experts' gate_up and down projections as
two grouped matrix multiplications over all the chosen rows, is weighted by its routing
weight, put back in token order and summed over its k experts.

Every tensor of that path has ``tokens x top_k`` rows whatever the routing: the saved bytes
do not depend on how evenly the router spreads the tokens (the estimate assumes even routing;
with the grouped GEMM an uneven one changes the time, not these bytes). The per-expert loop of
transformers' "eager" experts instead copies each expert's tokens in turn, so its peak grows
with the busiest expert's share.
"""

from __future__ import annotations

from dataclasses import dataclass

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
        if not (trains or flow.needs_grad):
            return Flow(f"L{layer}.moe_out", ctx.residual_bytes, False)
        tokens, hidden = ctx.tokens, spec.hidden_size
        experts, top_k = spec.n_experts, spec.experts_per_token
        width, compute = spec.expert_intermediate_size, ctx.compute_bytes
        rows = tokens * top_k  # one row per (token, chosen expert)
        prefix = f"L{layer}.moe"
        if trains:  # the router's input, for its weight's gradient
            saved.add(flow.key, compute * tokens * hidden)
        saved.add(f"{prefix}.router_probs", ROUTER_BYTES * tokens * experts)
        saved.add(f"{prefix}.top_k_index", INDEX_BYTES * tokens * top_k)
        if self.normalize_top_k:  # the division's inputs: the top-k values and their sum
            saved.add(f"{prefix}.top_k_values", ROUTER_BYTES * tokens * top_k)
            saved.add(f"{prefix}.top_k_sum", ROUTER_BYTES * tokens)
        # the gather's token index (perm // top_k) and the weights' permutation
        saved.add(f"{prefix}.token_index", INDEX_BYTES * rows)
        saved.add(f"{prefix}.perm", INDEX_BYTES * rows)
        saved.add(f"{prefix}.offsets", OFFSET_BYTES * experts)
        if trains:  # the grouped gate_up's input, for the experts' weight gradients
            saved.add(f"{prefix}.gathered", compute * rows * hidden)
        saved.add(f"{prefix}.gate_up", compute * rows * 2 * width)  # gate and up: views
        saved.add(f"{prefix}.act", compute * rows * width)  # act(gate), for the product
        if trains:  # act(gate) * up: the grouped down's input
            saved.add(f"{prefix}.gated", compute * rows * width)
        before = saved.activations
        weight_bytes = ROUTER_BYTES if self.float_weights else compute
        saved.add(f"{prefix}.routing_weights", weight_bytes * rows)
        saved.add(f"{prefix}.down_out", compute * rows * hidden)  # for the weighting
        saved.add(f"{prefix}.inverse_perm", INDEX_BYTES * rows)
        if trains:
            saved.freed_first = saved.activations - before + compute * rows * width
        else:
            saved.freed_first = saved.activations - before
        # the backward's own: the weighted output's gradient per row, then the grouped down's
        # input gradient and the gate and up gradients it makes
        saved.mlp_grads = compute * rows * (hidden + 3 * width)
        return Flow(f"L{layer}.moe_out", ctx.residual_bytes, True)


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
        if not (trains or flow.needs_grad):
            return Flow(f"L{layer}.moe_out", ctx.residual_bytes, False)
        tokens, hidden = ctx.tokens, spec.hidden_size
        experts, top_k = spec.n_experts, spec.experts_per_token
        width, compute = spec.expert_intermediate_size, ctx.compute_bytes
        rows = tokens * top_k
        prefix = f"L{layer}.moe"
        if trains:  # the router's input, for its weight's gradient
            saved.add(flow.key, compute * tokens * hidden)
        saved.add(f"{prefix}.top_k_index", INDEX_BYTES * tokens * top_k)
        saved.add(f"{prefix}.top_k_probs", compute * tokens * top_k)  # the softmax's output
        saved.add(f"{prefix}.token_index", INDEX_BYTES * rows)
        saved.add(f"{prefix}.perm", INDEX_BYTES * rows)
        if trains:  # each row's expert, to gather the biases' gradients
            saved.add(f"{prefix}.expert_ids", INDEX_BYTES * rows)
        saved.add(f"{prefix}.offsets", OFFSET_BYTES * experts)
        if trains:
            saved.add(f"{prefix}.gathered", compute * rows * hidden)
        saved.add(f"{prefix}.gate_up", compute * rows * 2 * width)  # both clamps' input
        # the activation: sigmoid's output, the clamped gate, up + 1 and the gated product
        for part in ("sigmoid", "gate", "up_plus_one", "glu"):
            saved.add(f"{prefix}.{part}", compute * rows * width)
        if trains:  # the grouped down's input
            saved.add(f"{prefix}.gated", compute * rows * width)
        before = saved.activations
        saved.add(f"{prefix}.routing_weights", compute * rows)
        saved.add(f"{prefix}.down_out", compute * rows * hidden)
        saved.add(f"{prefix}.inverse_perm", INDEX_BYTES * rows)
        saved.freed_first = saved.activations - before + (compute * rows * width if trains else 0)
        # the backward's own: the rows' output gradient, the down's input gradient and the
        # activation's (up + 1, glu, the clamped gate's) before the gate_up gradient
        saved.mlp_grads = compute * rows * (hidden + 4 * width)
        return Flow(f"L{layer}.moe_out", ctx.residual_bytes, True)
