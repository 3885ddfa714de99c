"""Causal language models transformers knows and lessonkit has no blocks for ("traced").

Their parameters come from the model transformers builds on the meta device (no weights are
made, and the count is exact to the element); their activations from a short traced step
(``lessonkit/memory/tracing.py``). A ModelSpec of the "traced" family keeps the config's
fields in ``extra["config"]`` and its ``model_type`` in ``extra["model_type"]``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from ..errors import LessonkitError
from ..safe_repr import short_repr, short_str
from .experts import expert_fields

TRACED = "traced"


def causal_lm_types() -> tuple[str, ...]:
    """The model_type values transformers builds with AutoModelForCausalLM."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return tuple(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def traced_fields(
    model_type: object, data: Mapping[str, Any], name: str, known: tuple[str, ...]
) -> dict[str, Any]:
    """The fields of a traced ModelSpec for a config of ``model_type``; a LessonkitError
    saying what is accepted when it is not a causal LM transformers knows."""
    try:
        import transformers
    except ImportError:
        raise LessonkitError(
            f"Unsupported model_type {short_repr(model_type)} in the config; lessonkit reads "
            f"{', '.join(known)}, and any causal LM transformers knows once transformers is "
            "installed (pip install 'lessonkit[measure]')."
        ) from None
    types = causal_lm_types()
    if not isinstance(model_type, str) or model_type not in types:
        raise LessonkitError(
            f"Unsupported model_type {short_repr(model_type)} in the config: not a causal "
            f"language model transformers {transformers.__version__} builds with "
            f"AutoModelForCausalLM. lessonkit reads {', '.join(known)} block by block, and "
            f"traces any other of the {len(types)} model types AutoModelForCausalLM builds "
            "(stablelm, mamba, ...)."
        )
    fields = {k: v for k, v in data.items() if k != "model_type"}
    try:
        config = transformers.AutoConfig.for_model(model_type, **fields)
    except Exception as err:  # transformers' own checks of the fields
        raise LessonkitError(
            f"transformers cannot read this {model_type} config: {short_str(err, 200)}"
        ) from None
    text = config.get_text_config()

    def whole(*keys: str, default: int = 1) -> int:
        for key in keys:
            value = getattr(text, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
                return value
        return default

    hidden = whole("hidden_size", "n_embd", "d_model")
    heads = whole("num_attention_heads", "n_head")
    kv_heads = whole("num_key_value_heads", default=heads)
    head_dim = whole("head_dim", default=max(1, hidden // heads))
    full = config.to_dict()
    layers = whole("num_hidden_layers", "n_layer")
    return dict(
        name=name,
        family=TRACED,
        n_layers=layers,
        hidden_size=hidden,
        n_heads=heads,
        n_kv_heads=kv_heads if heads % kv_heads == 0 else heads,
        head_dim=head_dim,
        intermediate_size=whole("intermediate_size", "n_inner", default=4 * hidden),
        vocab_size=whole("vocab_size"),
        tie_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        **expert_fields(model_type, text, layers),
        note=f"{model_type}: weights, gradients and optimizer states from the model "
        "transformers builds on the meta device; activations traced on a short step.",
        extra={"model_type": model_type, "config": json.dumps(full, sort_keys=True, default=str)},
    )


def traced_config(config_json: str, model_type: str, layers: int) -> Any:
    """The transformers config of a traced spec (its ``extra``), with ``layers`` decoder
    layers."""
    import transformers

    fields = json.loads(config_json)
    fields.pop("model_type", None)
    config = transformers.AutoConfig.for_model(model_type, **fields)
    config.use_cache = False
    text = config.get_text_config()
    for key in ("num_hidden_layers", "n_layer"):
        if hasattr(text, key):
            setattr(text, key, layers)
    for key in ("layer_types", "mlp_layer_types", "no_rope_layers"):  # per-layer lists
        value = getattr(text, key, None)
        if isinstance(value, list) and len(value) != layers:
            setattr(text, key, (value * layers)[:layers] if value else value)
    return config


@lru_cache(maxsize=32)
def meta_inventory(config_json: str, model_type: str, n_layers: int) -> dict[str, Any]:
    """The parameter tensors (name, shape, kind) and buffer bytes of the model transformers
    builds for this config on the meta device."""
    import torch
    import transformers

    auto: Any = transformers.AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(
            traced_config(config_json, model_type, n_layers), dtype=torch.float32
        )
    kinds: dict[str, str] = {}
    for module_name, module in model.named_modules():
        for param_name, _ in module.named_parameters(recurse=False):
            full = f"{module_name}.{param_name}" if module_name else param_name
            if isinstance(module, torch.nn.Embedding):
                kinds[full] = "embed"
            elif module is model.get_output_embeddings():
                kinds[full] = "head"
            elif isinstance(module, torch.nn.Linear) and param_name == "weight":
                kinds[full] = (
                    "linear" if ".layers." in f".{full}" or ".h." in f".{full}" else "head"
                )
            elif param_name == "bias":
                kinds[full] = "bias"
            else:
                kinds[full] = (
                    "norm" if len(tuple(getattr(module, param_name).shape)) == 1 else "other"
                )
    tensors = [
        (name, tuple(p.shape), kinds.get(name, "other")) for name, p in model.named_parameters()
    ]
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    # what transformers keeps in fp32 when the model is loaded in 16 bits (DeepSeek-V3's router)
    strict = tuple(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    kept_fp32 = tuple(name for name, _, _ in tensors if any(key in name for key in strict))
    return {"tensors": tensors, "buffer_bytes": int(buffers), "kept_fp32": kept_fp32}


# a decoder layer's parameters: "model.layers.3.mlp.experts.gate_up_proj", GPT-2's "h.3.attn"
_LAYER_PARAMETER = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)\.(.+)$")
# per-layer lists of a config (sliding or full attention, dense or MoE MLP, with or without RoPE)
PER_LAYER_KEYS = ("layer_types", "mlp_layer_types", "no_rope_layers")


@lru_cache(maxsize=32)
def layer_kinds(config_json: str, model_type: str, n_layers: int) -> tuple[int, ...]:
    """For each decoder layer, the number of its kind: layers of one kind have the same
    parameter tensors (names and shapes) and the same entries in the config's per-layer lists,
    so they save the same tensors for backward (DeepSeek-V3's dense first layers and its MoE
    layers are two kinds; Gemma 3's sliding and full-attention layers two more)."""
    shapes: dict[int, list[tuple[str, tuple[int, ...]]]] = {i: [] for i in range(n_layers)}
    for name, shape, _ in meta_inventory(config_json, model_type, n_layers)["tensors"]:
        match = _LAYER_PARAMETER.search(name)
        if match and int(match.group(1)) < n_layers:
            shapes[int(match.group(1))].append((match.group(2), tuple(shape)))
    fields = json.loads(config_json)
    text = fields.get("text_config") if isinstance(fields.get("text_config"), dict) else fields
    lists = [text.get(key) for key in PER_LAYER_KEYS]
    lists = [value for value in lists if isinstance(value, list) and len(value) == n_layers]
    signatures = [
        (tuple(sorted(shapes[i])), tuple(str(value[i]) for value in lists)) for i in range(n_layers)
    ]
    numbers: dict[Any, int] = {}
    return tuple(numbers.setdefault(signature, len(numbers)) for signature in signatures)


# a config's number of routed experts and experts per token, under the names families use
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
EXPERTS_PER_TOKEN_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k")


@lru_cache(maxsize=32)
def traced_experts(config_json: str, model_type: str, n_layers: int) -> tuple[int, int, int]:
    """(routed experts, experts per token, parameters a token does not use) of a traced
    model: its routed experts' weights are the decoder layers' parameters named "experts"
    whose first dimension is the number of experts (transformers 5's grouped 3D tensors and
    their biases); a token uses ``per_token`` of them. (0, 0, 0) without experts."""
    fields = json.loads(config_json)
    text = fields.get("text_config") if isinstance(fields.get("text_config"), dict) else fields

    def count(keys: tuple[str, ...]) -> int:
        for key in keys:
            value = text.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return 0

    experts, per_token = count(EXPERT_COUNT_KEYS), count(EXPERTS_PER_TOKEN_KEYS)
    if not experts or not per_token or per_token >= experts:
        return 0, 0, 0
    routed = 0
    for name, shape, _ in meta_inventory(config_json, model_type, n_layers)["tensors"]:
        match = _LAYER_PARAMETER.search(name)
        part = match.group(2) if match else ""
        if "experts." in part and "shared" not in part and len(shape) >= 2 and shape[0] == experts:
            routed += math.prod(shape)
    if not routed:
        return 0, 0, 0
    return experts, per_token, routed - routed * per_token // experts
