"""Conversions between ModelSpec and Hugging Face transformers configs (offline)."""

from __future__ import annotations

from typing import Any, Mapping

from .errors import LessonkitError
from .models import FAMILIES, ModelSpec

_GELU_ACTS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast")


def spec_from_hf_dict(data: Mapping[str, Any], name: str | None = None) -> ModelSpec:
    """Read the fields of a ``config.json`` dict into a ModelSpec."""
    family = data.get("model_type")
    if family not in FAMILIES:
        raise LessonkitError(
            f"Unsupported model_type {family!r} in the config; lessonkit reads "
            f"{', '.join(FAMILIES)}. For another decoder-only model, build a ModelSpec by hand."
        )
    name = name or data.get("_name_or_path") or family
    try:
        if family == "gpt2":
            hidden = data.get("n_embd", 768)
            return ModelSpec(
                name=name, family="gpt2", n_layers=data.get("n_layer", 12), hidden_size=hidden,
                n_heads=data.get("n_head", 12), n_kv_heads=data.get("n_head", 12),
                intermediate_size=data.get("n_inner") or 4 * hidden,
                vocab_size=data.get("vocab_size", 50257), tie_embeddings=True, gated_mlp=False,
                norm="layernorm", attention_bias="all", mlp_bias=True,
                max_positions=data.get("n_positions", 1024),
                hidden_act=data.get("activation_function", "gelu_new"),
            )
        heads = data["num_attention_heads"]
        attention_bias = "none"
        if family == "qwen2":
            attention_bias = "qkv"
        elif data.get("attention_bias"):
            attention_bias = "all"
        act = data.get("hidden_act") or data.get("hidden_activation") or "silu"
        return ModelSpec(
            name=name, family=family, n_layers=data["num_hidden_layers"],
            hidden_size=data["hidden_size"], n_heads=heads,
            n_kv_heads=data.get("num_key_value_heads") or heads,
            head_dim=data.get("head_dim") or data["hidden_size"] // heads,
            intermediate_size=data["intermediate_size"], vocab_size=data["vocab_size"],
            tie_embeddings=bool(data.get("tie_word_embeddings",
                                         family in ("gemma", "gemma2"))),
            gated_mlp=True, norm="rmsnorm", attention_bias=attention_bias,
            mlp_bias=bool(data.get("mlp_bias", False)), hidden_act=act,
            extra={k: data[k] for k in ("final_logit_softcapping", "sliding_window") if k in data},
        )
    except KeyError as missing:
        raise LessonkitError(f"The {family} config lacks the field {missing}.") from None


def hf_config_from_spec(spec: ModelSpec) -> Any:
    """A transformers config that builds a model of this shape."""
    import transformers

    common = dict(vocab_size=spec.vocab_size, tie_word_embeddings=spec.tie_embeddings,
                  use_cache=False)
    if spec.family == "gpt2":
        return transformers.GPT2Config(
            n_embd=spec.hidden_size, n_layer=spec.n_layers, n_head=spec.n_heads,
            n_inner=spec.intermediate_size, n_positions=spec.max_positions,
            activation_function=spec.hidden_act if spec.hidden_act in _GELU_ACTS else "gelu_new",
            **common)
    fields = dict(hidden_size=spec.hidden_size, num_hidden_layers=spec.n_layers,
                  num_attention_heads=spec.n_heads, num_key_value_heads=spec.n_kv_heads,
                  intermediate_size=spec.intermediate_size, head_dim=spec.head_dim,
                  hidden_act=spec.hidden_act, **common)
    if spec.family in ("llama", "mistral"):
        cls = transformers.LlamaConfig if spec.family == "llama" else transformers.MistralConfig
        if spec.family == "llama":
            fields.update(attention_bias=spec.attention_bias != "none", mlp_bias=spec.mlp_bias)
        return cls(**fields)
    if spec.family == "qwen2":
        return transformers.Qwen2Config(**fields)
    if spec.family == "gemma":
        fields["hidden_activation"] = fields.pop("hidden_act")
        return transformers.GemmaConfig(**fields)
    fields["hidden_activation"] = fields.pop("hidden_act")
    fields.update({k: v for k, v in spec.extra.items()})
    return transformers.Gemma2Config(**fields)
