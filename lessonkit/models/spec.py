"""Describing a decoder-only transformer: ModelSpec, its parameter tensors and LoRA targets,
and its Hugging Face config (the presets and resolve_model: models/presets.py)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import LessonkitError, unknown_name_message
from ..safe_repr import short_repr
from .experts import EXPERT_TARGETS, check_expert_fields, inactive_expert_params
from .hf_config import FAMILIES, hf_config_from_spec, read_hf_config, spec_fields
from .traced import TRACED, meta_inventory, traced_config, traced_experts

# Linear layers per family, in the names peft uses for ``target_modules``.
LINEAR_MODULES = {
    "gpt2": ("c_attn", "c_proj", "c_fc"),
    "phi3": ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"),
    # the experts' weights are 3D tensors, not linear layers: LoRA goes on attention
    "qwen3_moe": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mixtral": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "gpt_oss": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "default": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
}
# peft's default ``target_modules`` per family (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING).
# phi3 has none there: lessonkit takes its fused attention input, qkv_proj.
PEFT_DEFAULT_TARGETS = {"gpt2": ("c_attn",), "phi3": ("qkv_proj",), "default": ("q_proj", "v_proj")}
# Families whose attention normalises q and k: per head (over head_dim) or over the whole
# projection (OLMo 2).
QK_NORM = {"qwen3": "head", "qwen3_moe": "head", "gemma3_text": "head", "olmo2": "projection"}
# The norms of a decoder layer, by where they sit: before a sublayer ("pre"), after it
# ("post"), or both (Gemma 2 and 3).
LAYER_NORMS = {
    "pre": ("input_layernorm", "post_attention_layernorm"),
    "post": ("post_attention_layernorm", "post_feedforward_layernorm"),
    "both": (
        "input_layernorm",
        "post_attention_layernorm",
        "pre_feedforward_layernorm",
        "post_feedforward_layernorm",
    ),
}


class _DefaultTargets(tuple[str, ...]):
    """The default of ``lora_targets``: equal to ("q_proj", "v_proj"), but recognisable, so
    that a family without those modules gets its own peft default instead of an error."""


DEFAULT_LORA_TARGETS = _DefaultTargets(PEFT_DEFAULT_TARGETS["default"])
# Where transformers puts each peft-named linear layer inside a decoder layer.
_LINEAR_PATHS = {
    "q_proj": "self_attn.q_proj",
    "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj",
    "o_proj": "self_attn.o_proj",
    "gate_proj": "mlp.gate_proj",
    "up_proj": "mlp.up_proj",
    "down_proj": "mlp.down_proj",
    "qkv_proj": "self_attn.qkv_proj",
    "gate_up_proj": "mlp.gate_up_proj",
    "c_attn": "attn.c_attn",
    "attn.c_proj": "attn.c_proj",
    "c_fc": "mlp.c_fc",
    "mlp.c_proj": "mlp.c_proj",
}
NORMS = ("rmsnorm", "layernorm")
ATTENTION_BIASES = ("none", "qkv", "all")
# How often a family's layers use full attention when its config gives no ``layer_types``
# (transformers' defaults): every 6th layer of Gemma 3, every 2nd of gpt-oss, the others
# sliding-window layers.
FULL_ATTENTION_EVERY = {"gemma3_text": 6, "gpt_oss": 2}
LAYER_TYPES = ("full_attention", "sliding_attention")
# The largest dimension a ModelSpec takes: far above any model made (hidden sizes reach tens
# of thousands, vocabularies a few hundred thousand), low enough that every count stays exact.
MAX_DIMENSION = 10_000_000


class ParamTensor(NamedTuple):
    """One parameter tensor: its name as transformers registers it (within a decoder layer, or
    in the whole model for the outer ones), its shape as stored, and its kind: "linear" (a
    decoder layer's weight matrix: what LoRA targets and QLoRA quantizes), "bias", "norm",
    "embed" or "head"."""

    name: str
    shape: tuple[int, ...]
    kind: str


class ParameterTensors(NamedTuple):
    """A model's parameter tensors: one decoder layer's (the same in every layer), and the
    outer ones (embeddings, final norm, untied lm_head)."""

    layer: tuple[ParamTensor, ...]
    outer: tuple[ParamTensor, ...]


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer, enough to count its memory."""

    name: str
    family: str
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    intermediate_size: int
    vocab_size: int
    head_dim: int | None = None
    tie_embeddings: bool = False
    gated_mlp: bool = True
    norm: str = "rmsnorm"  # or "layernorm" (weight and bias)
    attention_bias: str = "none"  # "none", "qkv" (Qwen2) or "all" (GPT-2)
    mlp_bias: bool = False
    max_positions: int = 0  # learned position embeddings (GPT-2); 0 for rotary models
    hidden_act: str = "silu"
    # mixture of experts (0 without): experts per MoE layer, experts each token is routed to,
    # one expert's MLP width, always-used experts, and how many layers have experts
    n_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    n_shared_experts: int = 0
    moe_layers: int = 0
    note: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.family, str) or self.family not in (*FAMILIES, TRACED):
            raise LessonkitError(
                f"Unknown model family {short_repr(self.family)}; supported: {', '.join(FAMILIES)}."
            )
        for name in ("name", "hidden_act", "note"):
            if not isinstance(getattr(self, name), str):
                raise LessonkitError(
                    f"ModelSpec.{name} must be a string, got {short_repr(getattr(self, name))}."
                )
        dimensions = [
            "n_layers",
            "hidden_size",
            "n_heads",
            "n_kv_heads",
            "intermediate_size",
            "vocab_size",
        ] + (["head_dim"] if self.head_dim is not None else [])
        for name in [*dimensions, "max_positions"]:
            value, least = getattr(self, name), 0 if name == "max_positions" else 1
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or not least <= value <= MAX_DIMENSION
            ):
                raise LessonkitError(
                    f"ModelSpec.{name} must be a whole number from {least} to "
                    f"{MAX_DIMENSION:,}, got {short_repr(value)}."
                )
        for name in ("tie_embeddings", "gated_mlp", "mlp_bias"):
            if not isinstance(getattr(self, name), bool):
                raise LessonkitError(
                    f"ModelSpec.{name} must be True or False, "
                    f"got {short_repr(getattr(self, name))}."
                )
        for name, allowed in (("norm", NORMS), ("attention_bias", ATTENTION_BIASES)):
            if not isinstance(getattr(self, name), str) or getattr(self, name) not in allowed:
                raise LessonkitError(
                    f"ModelSpec.{name} must be one of {', '.join(allowed)}, "
                    f"got {short_repr(getattr(self, name))}."
                )
        if not isinstance(self.extra, Mapping):
            raise LessonkitError(f"ModelSpec.extra must be a dict, got {short_repr(self.extra)}.")
        if self.n_heads % self.n_kv_heads:
            raise LessonkitError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})."
            )
        if self.head_dim is None:
            if self.hidden_size % self.n_heads:
                raise LessonkitError(
                    "hidden_size must be divisible by n_heads when head_dim is not given."
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.n_heads)
        check_expert_fields(
            self.n_experts,
            self.experts_per_token,
            self.expert_intermediate_size,
            self.n_shared_experts,
            self.moe_layers,
            self.n_layers,
        )
        self.layer_types  # noqa: B018 (checks the config's layer_types, if any)

    # ----- parameter counts -------------------------------------------------------------
    @property
    def head_width(self) -> int:
        """The width of one attention head (``head_dim``, filled in when not given)."""
        assert self.head_dim is not None  # set by __post_init__
        return self.head_dim

    @property
    def q_size(self) -> int:
        return self.n_heads * self.head_width

    @property
    def kv_size(self) -> int:
        return self.n_kv_heads * self.head_width

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of each linear layer in one block, by peft name; for
        a traced model, of every linear layer of the decoder, by its module's full name."""
        h, i = self.hidden_size, self.intermediate_size
        if self.family == TRACED:
            return {
                t.name.removesuffix(".weight"): (t.shape[1], t.shape[0])
                for t in self.parameter_tensors().outer
                if t.kind == "linear"
            }
        if self.family == "gpt2":
            # GPT-2's "c_proj" names both the attention output and the MLP output.
            return {
                "c_attn": (h, 3 * h),
                "attn.c_proj": (h, h),
                "c_fc": (h, i),
                "mlp.c_proj": (i, h),
            }
        if self.family == "phi3":  # fused q, k, v and gate, up
            return {
                "qkv_proj": (h, self.q_size + 2 * self.kv_size),
                "o_proj": (self.q_size, h),
                "gate_up_proj": (h, 2 * i),
                "down_proj": (i, h),
            }
        shapes = {
            "q_proj": (h, self.q_size),
            "k_proj": (h, self.kv_size),
            "v_proj": (h, self.kv_size),
            "o_proj": (self.q_size, h),
        }
        if self.n_experts:  # the MLP is the experts' (not linear layers)
            return shapes
        if self.gated_mlp:
            shapes.update(gate_proj=(h, i), up_proj=(h, i), down_proj=(i, h))
        else:
            shapes.update(up_proj=(h, i), down_proj=(i, h))
        return shapes

    @property
    def norms_per_layer(self) -> int:
        return len(self.layer_norm_names)

    @property
    def norm_placement(self) -> str:
        """Where a decoder layer's norms sit: "pre", "post" (OLMo 2) or "both" (Gemma 2, 3)."""
        return {"gemma2": "both", "gemma3_text": "both", "olmo2": "post"}.get(self.family, "pre")

    @property
    def layer_norm_names(self) -> tuple[str, ...]:
        return LAYER_NORMS[self.norm_placement]

    @property
    def qk_norm(self) -> str:
        """ "head" (an RMSNorm over each head of q and k), "projection" (over all of q and
        of k: OLMo 2) or "none"."""
        return QK_NORM.get(self.family, "none")

    @property
    def layer_types(self) -> tuple[str, ...]:
        """Each decoder layer's attention, "full_attention" or "sliding_attention": the
        config's ``layer_types`` where it gives them, else the family's own pattern (Gemma 3:
        5 sliding layers in 6; gpt-oss: sliding and full in turn), else full everywhere."""
        given = self.extra.get("layer_types")
        if given is not None:
            if (
                not isinstance(given, (list, tuple))
                or len(given) != self.n_layers
                or any(kind not in LAYER_TYPES for kind in given)
            ):
                raise LessonkitError(
                    f"layer_types must list one of {', '.join(LAYER_TYPES)} for each of the "
                    f"{self.n_layers} layers, got {short_repr(given)}."
                )
            return tuple(given)
        every = FULL_ATTENTION_EVERY.get(self.family)
        if every is None:
            return ("full_attention",) * self.n_layers
        return tuple(
            "full_attention" if (layer + 1) % every == 0 else "sliding_attention"
            for layer in range(self.n_layers)
        )

    def parameter_tensors(self) -> ParameterTensors:
        """Every parameter tensor, named and shaped as transformers creates it: one decoder
        layer's and the outer ones. The one inventory the parameter counts and the memory
        estimate are computed from."""
        return _parameter_tensors(self)

    def _list_parameter_tensors(self) -> ParameterTensors:
        h, gpt2 = self.hidden_size, self.family == "gpt2"
        if self.family == TRACED:  # every tensor of the meta model, as an outer one
            inventory = meta_inventory(
                self.extra["config"], self.extra["model_type"], self.n_layers
            )
            return ParameterTensors(
                (), tuple(ParamTensor(n, s, k) for n, s, k in inventory["tensors"])
            )

        def norm(name: str) -> list[ParamTensor]:
            out = [ParamTensor(f"{name}.weight", (h,), "norm")]
            return out + (
                [ParamTensor(f"{name}.bias", (h,), "norm")] if self.norm == "layernorm" else []
            )

        linears, biases = [], []
        for key, (n_in, n_out) in self.linear_shapes().items():
            path = _LINEAR_PATHS[key]
            # GPT-2's Conv1D stores (in, out); nn.Linear stores (out, in)
            linears.append(
                ParamTensor(f"{path}.weight", (n_in, n_out) if gpt2 else (n_out, n_in), "linear")
            )
            attention = path.startswith(("self_attn.", "attn."))
            has_bias = (
                (
                    self.attention_bias == "all"
                    or (self.attention_bias == "qkv" and key in ("q_proj", "k_proj", "v_proj"))
                )
                if attention
                else self.mlp_bias
            )
            if has_bias:
                biases.append(ParamTensor(f"{path}.bias", (n_out,), "bias"))
        if gpt2:  # every Conv1D has a bias
            paired = [t for pair in zip(linears, biases, strict=True) for t in pair]
            layer = norm("ln_1") + paired[:4] + norm("ln_2") + paired[4:]
            outer = [
                ParamTensor("transformer.wte.weight", (self.vocab_size, h), "embed"),
                ParamTensor("transformer.wpe.weight", (self.max_positions, h), "embed"),
            ]
            outer += norm("transformer.ln_f")
        else:
            qk: list[ParamTensor] = []
            if self.qk_norm != "none":
                head = self.qk_norm == "head"
                q_width = self.head_width if head else self.q_size
                k_width = self.head_width if head else self.kv_size
                qk = [
                    ParamTensor("self_attn.q_norm.weight", (q_width,), "norm"),
                    ParamTensor("self_attn.k_norm.weight", (k_width,), "norm"),
                ]
            layer = (
                linears + biases + qk + [t for name in self.layer_norm_names for t in norm(name)]
            )
            if self.family == "gpt_oss":  # attention sinks, biased router and experts
                experts, width = self.n_experts, self.expert_intermediate_size
                layer += [
                    ParamTensor("self_attn.sinks", (self.n_heads,), "other"),
                    ParamTensor("mlp.router.weight", (experts, h), "other"),
                    ParamTensor("mlp.router.bias", (experts,), "other"),
                    ParamTensor("mlp.experts.gate_up_proj", (experts, h, 2 * width), "other"),
                    ParamTensor("mlp.experts.gate_up_proj_bias", (experts, 2 * width), "other"),
                    ParamTensor("mlp.experts.down_proj", (experts, width, h), "other"),
                    ParamTensor("mlp.experts.down_proj_bias", (experts, h), "other"),
                ]
            elif self.n_experts:  # the router and every expert's weights
                experts, width = self.n_experts, self.expert_intermediate_size
                layer += [
                    ParamTensor("mlp.gate.weight", (experts, h), "other"),
                    ParamTensor("mlp.experts.gate_up_proj", (experts, 2 * width, h), "other"),
                    ParamTensor("mlp.experts.down_proj", (experts, h, width), "other"),
                ]
            outer = [ParamTensor("model.embed_tokens.weight", (self.vocab_size, h), "embed")]
            outer += norm("model.norm")
        if not self.tie_embeddings:
            outer.append(ParamTensor("lm_head.weight", (self.vocab_size, h), "head"))
        return ParameterTensors(tuple(layer), tuple(outer))

    def _count(self, *kinds: str) -> int:
        tensors = self.parameter_tensors()
        return self.n_layers * sum(
            math.prod(t.shape) for t in tensors.layer if t.kind in kinds
        ) + sum(math.prod(t.shape) for t in tensors.outer if t.kind in kinds)

    @property
    def norm_params(self) -> int:
        """Parameters of all norm layers (per layer and the final one)."""
        return self._count("norm")

    @property
    def linear_params(self) -> int:
        """Weights of the blocks' linear layers (what LoRA targets and QLoRA quantizes)."""
        return self._count("linear")

    @property
    def embedding_params(self) -> int:
        return self._count("embed")

    @property
    def lm_head_params(self) -> int:
        return self._count("head")

    @property
    def n_params(self) -> int:
        """Total parameters, as ``sum(p.numel() for p in model.parameters())`` counts them."""
        return self._count("linear", "bias", "norm", "embed", "head", "other")

    @property
    def active_params(self) -> int:
        """Parameters one token's computation uses: all of them, less the experts it is not
        routed to (every expert's weights are still held); n_params without experts."""
        if self.family == TRACED:
            _, _, unused = traced_experts(
                self.extra["config"], self.extra["model_type"], self.n_layers
            )
            return self.n_params - unused
        if not self.n_experts:
            return self.n_params
        return self.n_params - inactive_expert_params(
            self.hidden_size,
            self.n_experts,
            self.experts_per_token,
            self.expert_intermediate_size,
            self.moe_layers,
            self.gated_mlp,
            biased=self.family == "gpt_oss",
        )

    @property
    def params_text(self) -> str:
        """ "6.74B params", or for a mixture of experts "30.53B params, 3.35B active"."""
        text = f"{self.n_params / 1e9:.2f}B params"
        if self.active_params != self.n_params:  # a traced model's experts too
            text += f", {self.active_params / 1e9:.2f}B active"
        return text

    def lora_shapes(self, targets: tuple[str, ...] | str) -> list[tuple[int, int]]:
        """Per-layer (in, out) of the linear layers that LoRA ``targets`` select."""
        shapes = self.linear_shapes()
        if targets == "all-linear":
            return list(shapes.values())
        if isinstance(targets, str):
            targets = (targets,)
        allowed = self.lora_target_names()
        chosen = []
        for target in targets:
            if target in EXPERT_TARGETS and self.experts_take_lora:
                continue  # 3D weights, not linear layers: expert_lora_shapes
            if target not in allowed:
                raise LessonkitError(
                    unknown_name_message(
                        target, (*allowed, "all-linear"), f"LoRA target for {self.family}"
                    )
                )
            chosen += [s for key, s in shapes.items() if key.split(".")[-1] == target]
        return chosen

    @property
    def experts_take_lora(self) -> bool:
        """Whether LoRA on the experts' 3D weights (peft's target_parameters) is modelled: the
        families whose MoE layers are described block by block (qwen3_moe, mixtral, gpt_oss)."""
        return bool(self.n_experts) and self.family != TRACED

    def expert_lora_shapes(self, targets: tuple[str, ...] | str) -> list[tuple[int, int, int]]:
        """Per-layer (experts, in, out) of the experts' weights that LoRA ``targets`` name
        (EXPERT_TARGETS): peft's ParamWrapper gives each an A of [rank x experts, in] and a B
        of [out, rank x experts]."""
        if isinstance(targets, str) or not self.experts_take_lora:
            return []
        hidden, width = self.hidden_size, self.expert_intermediate_size
        in_out = {
            "experts.gate_up_proj": (hidden, 2 * width),
            "experts.down_proj": (width, hidden),
        }
        return [(self.n_experts, *in_out[name]) for name in EXPERT_TARGETS if name in targets]

    def lora_target_names(self) -> tuple[str, ...]:
        """The decoder layers' linear layers LoRA can target, by the names peft matches."""
        allowed = LINEAR_MODULES.get(self.family, LINEAR_MODULES["default"])
        if self.family == TRACED:
            allowed = tuple(sorted({key.split(".")[-1] for key in self.linear_shapes()}))
        if not self.gated_mlp and self.family != "gpt2":
            allowed = tuple(a for a in allowed if a != "gate_proj")
        return allowed

    @property
    def default_lora_targets(self) -> tuple[str, ...]:
        """peft's default LoRA targets for this family (GPT-2: c_attn; others: q_proj, v_proj)."""
        return PEFT_DEFAULT_TARGETS.get(self.family, PEFT_DEFAULT_TARGETS["default"])

    def resolve_lora_targets(self, targets: tuple[str, ...] | str | None) -> tuple[str, ...] | str:
        """The targets to use: ``targets`` as given, or this family's peft default where they
        are None or the untouched default of ``lora_targets`` (DEFAULT_LORA_TARGETS)."""
        if targets is None or targets is DEFAULT_LORA_TARGETS:
            return self.default_lora_targets
        return targets

    def lora_default_note(self, targets: tuple[str, ...] | str) -> str:
        """A sentence for the assumptions where ``targets`` are this family's own peft default
        in place of q_proj/v_proj (which it does not have); "" otherwise."""
        default = self.default_lora_targets
        if tuple(targets) != default or default == PEFT_DEFAULT_TARGETS["default"]:
            return ""
        return (
            f"{self.family} has no q_proj/v_proj: LoRA goes on {', '.join(default)}, "
            f"peft's default target for {self.family}."
        )

    def lora_params(self, rank: int, targets: tuple[str, ...] | str) -> int:
        """Trainable parameters of LoRA adapters: rank x (in + out) per targeted layer, and
        rank x experts x (in + out) per targeted expert weight."""
        layers = 1 if self.family == TRACED else self.n_layers  # traced: every layer's
        linear = sum(rank * (a + b) for a, b in self.lora_shapes(targets))
        experts = sum(rank * e * (a + b) for e, a, b in self.expert_lora_shapes(targets))
        return layers * (linear + experts)

    # ----- conversions --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("extra")
        return data

    @classmethod
    def from_hf_config(
        cls, config: str | Path | Mapping[str, Any], name: str | None = None
    ) -> ModelSpec:
        """Read a Hugging Face ``config.json`` (a path, its folder or a dict); no network is used.
        A config that cannot be read or holds bad fields is a LessonkitError saying which."""
        data, folder = read_hf_config(config)
        return cls(**spec_fields(data, name=name or folder))

    def to_hf_config(self) -> Any:
        """A transformers config object that builds this model (imports transformers)."""
        if self.family == TRACED:
            return traced_config(self.extra["config"], self.extra["model_type"], self.n_layers)
        return hf_config_from_spec(self)


@lru_cache(maxsize=256)
def _parameter_tensors(spec: ModelSpec) -> ParameterTensors:
    return spec._list_parameter_tensors()  # specs are frozen: the same spec, the same list
