"""Hugging Face configs, offline: a ``config.json`` read and checked, and a shape written back.

This module sits below ``models``: it reads a config into the plain fields of a ModelSpec
(``spec_fields``) and builds a transformers config from any object with a ModelSpec's
attributes (``hf_config_from_spec``), so ``models`` imports it and it imports nothing above.
Every problem with a config (a folder, a loop of links, a file that is not UTF-8 JSON, a list
where fields belong, a head count of 0 or "32") is a LessonkitError that says what was wrong.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import LessonkitError
from ..safe_repr import short_repr, short_str

# The model_type values lessonkit reads: the families a ModelSpec describes.
# Families read through transformers' own config class (its defaults fill what config.json
# leaves out), with what sets each apart from Llama: QK norm (qwen3, gemma3_text, olmo2),
# norms after each sublayer (olmo2, gemma3_text), fused projections (phi3), layers without
# rotary (smollm3), multipliers (granite).
CONFIG_CLASS_FAMILIES = (
    "qwen3",
    "gemma3_text",
    "phi3",
    "olmo2",
    "smollm3",
    "granite",
    "qwen3_moe",
    "mixtral",
    "gpt_oss",
)
# Families with experts in every decoder layer (models/experts.py); a qwen3_moe config with
# dense layers among them is traced. gpt_oss: attention sinks, biased projections and experts,
# sliding-window and full attention layers in turn (config.layer_types).
MOE_FAMILIES = ("qwen3_moe", "mixtral", "gpt_oss")
FAMILIES = ("llama", "mistral", "qwen2", "gemma", "gemma2", "gpt2", *CONFIG_CLASS_FAMILIES)
# What spec.extra keeps of these configs, to build the same model again.
_EXTRA_FIELDS = (
    "final_logit_softcapping",
    "sliding_window",
    "query_pre_attn_scalar",
    "embedding_multiplier",
    "residual_multiplier",
    "attention_multiplier",
    "logits_scaling",
    "no_rope_layer_interval",
    "norm_topk_prob",
    "layer_types",
    "swiglu_alpha",
    "swiglu_limit",
)
# Families whose estimate follows each layer's attention type (config.layer_types)
LAYER_TYPE_FAMILIES = ("gemma3_text", "gpt_oss")
_GELU_ACTS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast")
# A config.json is a few kilobytes; anything this large is not one (e.g. a link to /dev/zero).
MAX_CONFIG_BYTES = 10 * 2**20
_MISSING = object()


def read_hf_config(config: object) -> tuple[dict[str, Any], str | None]:
    """The fields of a config (a path to config.json or its folder, a dict, or a transformers
    config object) and the folder's name as a default model name (None for a dict)."""
    if isinstance(config, (str, Path)):
        return _read_file(config)
    if isinstance(config, Mapping):
        return dict(config), None
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):  # a transformers PretrainedConfig
        data = to_dict()
        if not isinstance(data, dict):
            raise LessonkitError(
                f"{type(config).__name__}.to_dict() gave "
                f"{type(data).__name__}, not a dict of config fields."
            )
        return data, None
    raise LessonkitError(f"from_hf_config takes a path or a dict, got {type(config).__name__}.")


def _read_file(config: str | Path) -> tuple[dict[str, Any], str]:
    if not str(config).strip():
        raise LessonkitError(
            "The config path is empty: give a config.json or the folder holding it."
        )
    path = Path(config)
    shown = short_repr(str(path), 120)
    try:
        if path.is_dir():
            path = path / "config.json"
            shown = short_repr(str(path), 120)
        raw = _read_regular_file(path, shown)
    except LessonkitError:
        raise
    except FileNotFoundError:
        raise LessonkitError(f"No config.json at {shown}.") from None
    except IsADirectoryError:
        raise LessonkitError(f"{shown} is a folder without a config.json file.") from None
    except PermissionError:
        raise LessonkitError(f"Cannot read {shown}: permission denied.") from None
    except (OSError, ValueError) as err:  # a loop of links, a name too long, a NUL byte
        reason = getattr(err, "strerror", None) or short_str(err, 120)
        raise LessonkitError(f"Cannot read the config {shown}: {reason}.") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise LessonkitError(
            f"{shown} is over {MAX_CONFIG_BYTES // 2**20} MiB: not a config.json "
            "(those are a few kilobytes of JSON)."
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise LessonkitError(
            f"{shown} is not UTF-8 text (byte {err.start} is "
            f"{raw[err.start]:#04x}): a config.json is JSON."
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise LessonkitError(f"{shown} is not valid JSON: {err}.") from None
    except (ValueError, RecursionError) as err:  # nested too deeply, an integer too long
        raise LessonkitError(f"{shown} is not a readable config: {short_str(err, 120)}.") from None
    if not isinstance(data, dict):
        raise LessonkitError(
            f"{shown} holds a JSON {_json_kind(data)}, not an object of config "
            "fields such as model_type and hidden_size."
        )
    # a model folder's config.json is named after the folder; any other file after itself
    name = path.parent.name if path.name == "config.json" else path.stem
    return data, name or "model"


def _read_regular_file(path: Path, shown: str) -> bytes:
    """The first MAX_CONFIG_BYTES + 1 bytes of ``path``, when it is a regular file: a FIFO is
    opened without waiting for a writer and, like a device or a socket, never read."""
    not_regular = LessonkitError(
        f"{shown} is not a regular file (a FIFO, a device or a socket): a config.json is a "
        "file of JSON."
    )
    mode = os.stat(path).st_mode
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(path)
    if not stat.S_ISREG(mode):
        raise not_regular
    # checked again on what was opened, in case the path changed in between
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise not_regular
        return file.read(MAX_CONFIG_BYTES + 1)


def _json_kind(value: object) -> str:
    kinds = {list: "list", str: "string", bool: "true/false", int: "number", float: "number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


def _whole(data: Mapping[str, Any], key: str, family: str, default: Any = _MISSING) -> int:
    """A whole-number field >= 1 of the config (an error for a string, 0, a fraction, ...)."""
    value = data.get(key)
    if value is None:
        if default is _MISSING:
            raise LessonkitError(f"The {family} config lacks the field {key!r}.")
        return int(default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LessonkitError(
            f"{key} in the {family} config must be a whole number >= 1, got {short_repr(value)}."
        )
    return value


def _flag(data: Mapping[str, Any], key: str, family: str, default: bool) -> bool:
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise LessonkitError(
            f"{key} in the {family} config must be true or false, got {short_repr(value)}."
        )
    return value


def _text(data: Mapping[str, Any], keys: tuple[str, ...], family: str, default: str) -> str:
    for key in keys:
        value = data.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise LessonkitError(
                    f"{key} in the {family} config must be a string, got {short_repr(value)}."
                )
            return value
    return default


def spec_fields(data: Mapping[str, Any], name: str | None = None) -> dict[str, Any]:
    """The keyword arguments of a ModelSpec read from a ``config.json`` dict, each checked."""
    family = data.get("model_type")
    if family == "gemma3" and isinstance(data.get("text_config"), Mapping):
        # Gemma 3 with its vision tower: the language model is its text config
        text = dict(data["text_config"], model_type="gemma3_text")
        text.setdefault("_name_or_path", data.get("_name_or_path"))
        data, family = text, "gemma3_text"
    if isinstance(family, str) and family in CONFIG_CLASS_FAMILIES:
        data = _through_config_class(family, data)
    if name is None:
        given = data.get("_name_or_path")
        name = given if isinstance(given, str) and given.strip() else str(family)
    experts = {}
    if family in MOE_FAMILIES:
        from types import SimpleNamespace

        from .experts import expert_fields

        layers = _whole(data, "num_hidden_layers", str(family))
        experts = expert_fields(family, SimpleNamespace(**data), layers)
        if experts["moe_layers"] != layers:  # dense layers among the experts' ones
            family = f"{family} with dense layers"
    if not isinstance(family, str) or family not in FAMILIES:
        from .traced import traced_fields

        if family not in FAMILIES and experts:
            family = data.get("model_type")
        return traced_fields(family, data, name, FAMILIES)
    if family == "gpt2":
        hidden = _whole(data, "n_embd", family, 768)
        heads = _whole(data, "n_head", family, 12)
        return dict(
            name=name,
            family="gpt2",
            n_layers=_whole(data, "n_layer", family, 12),
            hidden_size=hidden,
            n_heads=heads,
            n_kv_heads=heads,
            intermediate_size=_whole(data, "n_inner", family, 4 * hidden),
            vocab_size=_whole(data, "vocab_size", family, 50257),
            tie_embeddings=True,
            gated_mlp=False,
            norm="layernorm",
            attention_bias="all",
            mlp_bias=True,
            max_positions=_whole(data, "n_positions", family, 1024),
            hidden_act=_text(data, ("activation_function",), family, "gelu_new"),
        )
    layers = _whole(data, "num_hidden_layers", family)
    hidden = _whole(data, "hidden_size", family)
    heads = _whole(data, "num_attention_heads", family)
    if data.get("head_dim") is None and hidden < heads:
        raise LessonkitError(
            f"hidden_size ({hidden}) in the {family} config is smaller than "
            f"num_attention_heads ({heads}), and no head_dim is given."
        )
    attention_bias = "none"
    if family == "qwen2":
        attention_bias = "qkv"
    elif _flag(data, "attention_bias", family, False):
        attention_bias = "all"
    return dict(
        name=name,
        family=family,
        n_layers=layers,
        hidden_size=hidden,
        n_heads=heads,
        n_kv_heads=_whole(data, "num_key_value_heads", family, heads),
        head_dim=_whole(data, "head_dim", family, hidden // heads),
        intermediate_size=_whole(data, "intermediate_size", family),
        vocab_size=_whole(data, "vocab_size", family),
        tie_embeddings=_flag(
            data, "tie_word_embeddings", family, family in ("gemma", "gemma2", "gemma3_text")
        ),
        gated_mlp=True,
        norm="rmsnorm",
        attention_bias=attention_bias,
        mlp_bias=_flag(data, "mlp_bias", family, False),
        hidden_act=_text(data, ("hidden_act", "hidden_activation"), family, "silu"),
        extra={
            k: data[k]
            for k in _EXTRA_FIELDS
            if data.get(k) is not None and (k != "layer_types" or family in LAYER_TYPE_FAMILIES)
        },
        **experts,
    )


def _through_config_class(family: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` as transformers' config class for ``family`` completes it (its defaults for
    what is left out); the config's own fields, checked, where transformers is missing."""
    try:
        import transformers
    except ImportError:
        return dict(data)
    fields = {k: v for k, v in data.items() if k != "model_type"}
    try:
        config = transformers.AutoConfig.for_model(family, **fields)
    except Exception as err:  # transformers' own checks of the fields
        raise LessonkitError(
            f"transformers cannot read this {family} config: {short_str(err, 200)}"
        ) from None
    filled = config.to_dict()
    return {**filled, "model_type": family}


def hf_config_from_spec(spec: Any) -> Any:
    """A transformers config that builds a model of this shape (a ModelSpec)."""
    import transformers

    common = dict(
        vocab_size=spec.vocab_size, tie_word_embeddings=spec.tie_embeddings, use_cache=False
    )
    if spec.family == "gpt2":
        return transformers.GPT2Config(
            n_embd=spec.hidden_size,
            n_layer=spec.n_layers,
            n_head=spec.n_heads,
            n_inner=spec.intermediate_size,
            n_positions=spec.max_positions,
            activation_function=spec.hidden_act if spec.hidden_act in _GELU_ACTS else "gelu_new",
            **common,
        )
    fields = dict(
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.n_layers,
        num_attention_heads=spec.n_heads,
        num_key_value_heads=spec.n_kv_heads,
        intermediate_size=spec.intermediate_size,
        head_dim=spec.head_dim,
        hidden_act=spec.hidden_act,
        **common,
    )
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
    if spec.family in CONFIG_CLASS_FAMILIES:
        if spec.family == "gemma3_text":
            fields["hidden_activation"] = fields.pop("hidden_act")
        if spec.family in ("qwen3", "olmo2", "smollm3", "granite"):
            fields.update(attention_bias=spec.attention_bias != "none")
        if spec.family in ("smollm3", "granite"):
            fields.update(mlp_bias=spec.mlp_bias)
        if spec.family == "phi3":
            fields.pop("head_dim")
        if spec.family == "qwen3_moe":
            fields.update(
                num_experts=spec.n_experts,
                num_experts_per_tok=spec.experts_per_token,
                moe_intermediate_size=spec.expert_intermediate_size,
                decoder_sparse_step=1,
                mlp_only_layers=[],
            )
        if spec.family == "gpt_oss":
            fields.update(
                num_local_experts=spec.n_experts,
                num_experts_per_tok=spec.experts_per_token,
                intermediate_size=spec.expert_intermediate_size,
                attention_bias=spec.attention_bias != "none",
            )
        if spec.family == "mixtral":
            fields.update(
                num_local_experts=spec.n_experts,
                num_experts_per_tok=spec.experts_per_token,
                intermediate_size=spec.expert_intermediate_size,
            )
        extra = {k: v for k, v in spec.extra.items() if k in _EXTRA_FIELDS}
        # no padding token: its index (e.g. Phi-3's 32000) may lie outside a smaller vocabulary
        fields.update(pad_token_id=None, bos_token_id=None, eos_token_id=None)
        return transformers.AutoConfig.for_model(spec.family, **{**extra, **fields})
    fields["hidden_activation"] = fields.pop("hidden_act")
    fields.update(dict(spec.extra.items()))
    return transformers.Gemma2Config(**fields)
