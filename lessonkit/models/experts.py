"""Mixture-of-experts fields of a config: how many experts, how many each token uses.

qwen3_moe and mixtral keep their experts' weights as two 3D tensors per MoE layer
(``mlp.experts.gate_up_proj`` of shape (experts, 2 x expert width, hidden) and
``mlp.experts.down_proj`` of shape (experts, hidden, expert width)) and a router
(``mlp.gate.weight``, (experts, hidden)); gpt_oss stores them transposed, each with a bias
(``gate_up_proj_bias``, ``down_proj_bias``), and its router (``mlp.router``) has a bias too.
Every expert's weights sit on the GPU; a token's computation passes through
``experts_per_token`` of them, which is what "active" parameters count.
"""

from __future__ import annotations

from typing import Any

from ..errors import LessonkitError
from ..safe_repr import short_repr

# The config fields of each family with experts: the number of experts, experts per token and
# the width of one expert's MLP.
MOE_CONFIG_KEYS = {
    "qwen3_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
    "mixtral": ("num_local_experts", "num_experts_per_tok", "intermediate_size"),
    "gpt_oss": ("num_local_experts", "num_experts_per_tok", "intermediate_size"),
}
NO_EXPERTS = {
    "n_experts": 0,
    "experts_per_token": 0,
    "expert_intermediate_size": 0,
    "n_shared_experts": 0,
    "moe_layers": 0,
}


def expert_fields(model_type: object, config: Any, n_layers: int) -> dict[str, int]:
    """The ModelSpec fields of the experts of a transformers ``config`` (its text config):
    zeros for a model without experts or a family lessonkit does not read experts of."""
    if not isinstance(model_type, str) or model_type not in MOE_CONFIG_KEYS:
        return dict(NO_EXPERTS)
    experts_key, per_token_key, width_key = MOE_CONFIG_KEYS[model_type]
    values = {}
    for key in (experts_key, per_token_key, width_key):
        value = getattr(config, key, None)
        if value is None and key == "num_experts":  # stored as num_local_experts (attribute_map)
            value = getattr(config, "num_local_experts", None)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise LessonkitError(
                f"{key} in the {model_type} config must be a whole number >= 0, "
                f"got {short_repr(value)}."
            )
        values[key] = value
    n_experts = values[experts_key]
    if n_experts == 0:
        return dict(NO_EXPERTS)
    moe_layers = n_layers
    if model_type == "qwen3_moe":  # dense MLPs in mlp_only_layers and between sparse steps
        step = getattr(config, "decoder_sparse_step", 1) or 1
        dense = set(getattr(config, "mlp_only_layers", None) or ())
        moe_layers = sum(
            1 for layer in range(n_layers) if layer not in dense and (layer + 1) % step == 0
        )
    return {
        "n_experts": n_experts,
        "experts_per_token": values[per_token_key],
        "expert_intermediate_size": values[width_key],
        "n_shared_experts": 0,  # neither family has an always-used expert
        "moe_layers": moe_layers,
    }


def check_expert_fields(
    n_experts: int, per_token: int, width: int, shared: int, moe_layers: int, n_layers: int
) -> None:
    """A LessonkitError naming the field when the experts' fields do not fit together."""
    for name, value in (
        ("n_experts", n_experts),
        ("experts_per_token", per_token),
        ("expert_intermediate_size", width),
        ("n_shared_experts", shared),
        ("moe_layers", moe_layers),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise LessonkitError(
                f"ModelSpec.{name} must be a whole number >= 0, got {short_repr(value)}."
            )
    if n_experts == 0:
        if per_token or width or shared or moe_layers:
            raise LessonkitError(
                "A ModelSpec without experts (n_experts=0) takes experts_per_token, "
                "expert_intermediate_size, n_shared_experts and moe_layers of 0."
            )
        return
    if not 1 <= per_token <= n_experts:
        raise LessonkitError(
            f"experts_per_token must be from 1 to n_experts ({n_experts}), got {per_token}."
        )
    if width < 1:
        raise LessonkitError("expert_intermediate_size must be at least 1 with experts.")
    if not 1 <= moe_layers <= n_layers:
        raise LessonkitError(
            f"moe_layers must be from 1 to n_layers ({n_layers}) with experts, got {moe_layers}."
        )


def inactive_expert_params(
    hidden: int,
    n_experts: int,
    per_token: int,
    width: int,
    moe_layers: int,
    gated: bool,
    biased: bool = False,
) -> int:
    """Parameters of the experts a token does not use: (experts - top-k) x one expert's MLP
    (with its biases where ``biased``: gpt_oss), in every MoE layer."""
    per_expert = (3 if gated else 2) * hidden * width
    if biased:  # gate_up_proj_bias and down_proj_bias
        per_expert += (2 if gated else 1) * width + hidden
    return moe_layers * (n_experts - per_token) * per_expert


# LoRA on the experts: peft's target_parameters wraps each 3D weight (its ParamWrapper); the
# names lessonkit accepts for them, each for one weight or "experts" for both
EXPERT_TARGETS = ("experts.gate_up_proj", "experts.down_proj")
_EXPERT_ALIASES = {
    "experts": EXPERT_TARGETS,
    "mlp.experts": EXPERT_TARGETS,
    **{name: (name,) for name in EXPERT_TARGETS},
    **{f"mlp.{name}": (name,) for name in EXPERT_TARGETS},
}
# names that look like the experts' weights or the router but are neither a linear layer nor
# a target lessonkit models
_NOT_TARGETS = ("gate_up_proj", "down_proj", "gate", "mlp.gate", "router", "mlp.router")


def expert_targets(target: str) -> tuple[str, ...] | None:
    """The experts' weights a LoRA target names (EXPERT_TARGETS), None if it names none."""
    return _EXPERT_ALIASES.get(target)


def expert_target_error(target: str, allowed: tuple[str, ...]) -> LessonkitError | None:
    """The error for a name of a MoE model's experts or router that is not a target lessonkit
    models ("gate_up_proj" alone, the router), None for any other name."""
    if target not in _NOT_TARGETS:
        return None
    if target in ("gate_up_proj", "down_proj"):
        what = (
            f"the experts' weights are 3D nn.Parameters (mlp.experts.{target}), not linear "
            f"layers, so peft's target_modules does not reach them: name them "
            f"'experts.{target}' (peft's target_parameters), or 'experts' for both."
        )
    else:
        what = (
            "the router (a plain nn.Parameter that picks each token's experts) is not a "
            "LoRA target lessonkit models."
        )
    return LessonkitError(f"LoRA target {target!r}: {what} Allowed: {', '.join(allowed)}.")
