"""Causal language models transformers knows and lessonkit has no blocks for ("traced").

Their parameters come from the model transformers builds on the meta device (no weights are
made, and the count is exact to the element); their activations from a short traced step
(``lessonkit/memory/tracing.py``). A ModelSpec of the "traced" family keeps the config's
fields in ``extra["config"]`` and its ``model_type`` in ``extra["model_type"]``.
"""

from __future__ import annotations

import json
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
    return {"tensors": tensors, "buffer_bytes": int(buffers)}
