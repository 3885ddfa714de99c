"""The settings of one training run, checked once for estimate() and measure() alike.

``validate_run`` turns the keyword arguments both functions take into a frozen ``RunSettings``
or raises a LessonkitError saying what was wrong and what is allowed, so that the two accept
exactly the same input and reject bad input with the same words.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ..errors import LessonkitError, choose, positive_int, real_number, unknown_name_message
from ..models.experts import EXPERT_TARGETS, expert_target_error, expert_targets
from ..models.spec import DEFAULT_LORA_TARGETS, LINEAR_MODULES, ModelSpec
from ..options import (
    ATTENTION,
    BNB_BEHAVIOURS,
    DEFAULT_LOSS_CHUNKS,
    FSDP_VERSIONS,
    LORA_DTYPES,
    LOSSES,
    METHODS,
    OPTIMIZERS,
    PRECISIONS,
    ZERO_STAGES,
)
from ..safe_repr import short_repr

DEVICES = ("cuda", "cpu")
MAX_BATCH = 4096
MAX_SEQ = 1_048_576
MAX_RANK = 65536
MAX_GPUS = 1024
MAX_ACCUMULATION = 4096
FLAGS = ("gradient_checkpointing", "offload_optimizer", "double_quant")
# LoRA targets outside the decoder layers: the output head (a LoRA Linear) and the token
# embeddings (peft's LoRA Embedding, where the model names them embed_tokens)
OUTER_LORA_TARGETS = ("lm_head", "embed_tokens")


def layer_lora_targets(targets: tuple[str, ...] | str) -> tuple[str, ...] | str:
    """The LoRA targets inside the decoder layers: ``targets`` without lm_head/embed_tokens."""
    if isinstance(targets, str):
        return targets
    return tuple(t for t in targets if t not in OUTER_LORA_TARGETS)


def outer_lora_targets(targets: tuple[str, ...] | str) -> tuple[str, ...]:
    """The LoRA targets outside the decoder layers (lm_head, embed_tokens) among ``targets``."""
    if isinstance(targets, str):
        return ()  # all-linear leaves the output head out, as peft does
    return tuple(t for t in OUTER_LORA_TARGETS if t in targets)


@dataclass(frozen=True)
class RunSettings:
    """One training run's choices, checked (see ``validate_run``); names as in estimate()."""

    method: str
    precision: str
    optimizer: str
    batch_size: int
    seq_len: int
    gradient_checkpointing: bool
    lora_rank: int
    lora_targets: tuple[str, ...] | str  # resolved: the model family's default filled in
    n_gpus: int
    zero_stage: int
    attention: str
    offload_optimizer: bool
    double_quant: bool
    lora_dtype: str
    gradient_accumulation: int
    device: str
    lora_dropout: float = 0.0
    bitsandbytes: str = "current"
    activation_offload: bool = False
    optimizer_in_backward: bool = False
    loss: str = "standard"
    loss_chunks: int = DEFAULT_LOSS_CHUNKS
    no_sync: bool = False
    fsdp_version: int = 2
    compile: bool = False  # torch.compile of each decoder layer (memory/compiled.py)

    @property
    def mixed(self) -> bool:
        """fp32 weights computed in 16 bits ("bf16-mixed", "fp16-mixed")."""
        return self.precision.endswith("-mixed")

    @property
    def sharded_mixed(self) -> bool:
        """ZeRO-3 with a "-mixed" precision: FSDP's mixed precision (each layer gathered in
        16 bits, fp32 shards of the weights, gradients and states), not autocast."""
        return self.zero_stage == 3 and self.mixed

    def as_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        if not isinstance(self.lora_targets, str):
            data["lora_targets"] = list(self.lora_targets)
        return data


def usual_precision(method: str, native_bf16: bool = True) -> str:
    """The precision a method is usually run in, the default of ``precision`` everywhere (None):
    full fine-tuning keeps fp32 weights under bf16 autocast ("bf16-mixed"; "fp16-mixed" on a GPU
    without native bf16, the same memory); LoRA and QLoRA load the base model in bf16."""
    if method == "full":
        return "bf16-mixed" if native_bf16 else "fp16-mixed"
    return "bf16"


def _flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise LessonkitError(f"{what} must be True or False, got {short_repr(value)}.")
    return value


def _targets(value: object) -> tuple[str, ...] | str | None:
    """The LoRA targets as given (a tuple of names or 'all-linear'); None for the default."""
    if value is None or value is DEFAULT_LORA_TARGETS:
        return None
    if isinstance(value, list):
        value = tuple(value)
    if value == "all-linear" or (
        isinstance(value, tuple) and value and all(isinstance(t, str) for t in value)
    ):
        return value
    raise LessonkitError(
        f"lora_targets must be a list of module names (e.g. "
        f"['q_proj', 'v_proj']) or 'all-linear', got {short_repr(value)}."
    )


def _check_layer_targets(spec: ModelSpec, targets: tuple[str, ...] | str) -> None:
    """Raise for an unknown target, naming the ones this model has (lm_head and
    embed_tokens among them where LoRA on them is modelled)."""
    if isinstance(targets, str) or spec.family == "traced" or spec.tie_embeddings:
        if spec.n_experts and not isinstance(targets, str):
            own = LINEAR_MODULES.get(spec.family, LINEAR_MODULES["default"])
            _check_expert_targets(targets, (*own, *_expert_names(spec), "all-linear"))
        spec.lora_shapes(targets)  # raises, naming the targets this model has
        return
    own = LINEAR_MODULES.get(spec.family, LINEAR_MODULES["default"])
    names = dict.fromkeys((*own, *(name for names in LINEAR_MODULES.values() for name in names)))
    outer = OUTER_LORA_TARGETS if spec.family != "gpt2" else ("lm_head",)
    allowed = (
        *(n for n in names if _layer_target(spec, n)),
        *_expert_names(spec),
        *outer,
        "all-linear",
    )
    if spec.n_experts:
        _check_expert_targets(targets, allowed)
    for target in targets:
        if target in EXPERT_TARGETS and spec.experts_take_lora:
            continue
        if target not in names or not _layer_target(spec, target):
            raise LessonkitError(
                unknown_name_message(target, allowed, f"LoRA target for {spec.family}")
            )


def _expert_names(spec: ModelSpec) -> tuple[str, ...]:
    """The names of LoRA targets on the experts' weights, where that is modelled."""
    return ("experts", *EXPERT_TARGETS) if spec.experts_take_lora else ()


def _with_expert_targets(spec: ModelSpec, targets: tuple[str, ...] | str) -> tuple[str, ...] | str:
    """``targets`` with each name of the experts' weights spelled as in EXPERT_TARGETS
    ("experts" standing for both), once each, in the order given."""
    if isinstance(targets, str) or not spec.n_experts:
        return targets
    spelled: list[str] = []
    for target in targets:
        named = expert_targets(target)
        if named is not None and not spec.experts_take_lora:
            raise LessonkitError(
                f"LoRA target {target!r}: LoRA on the experts' weights is modelled for the "
                f"families described block by block (qwen3_moe, mixtral, gpt_oss), not for "
                f"{spec.name} (a traced model): name its attention's linear layers instead."
            )
        spelled += named or (target,)
    return tuple(dict.fromkeys(spelled))


def lora_on_experts(s: RunSettings) -> tuple[str, ...]:
    """The experts' weights (EXPERT_TARGETS) a run's LoRA targets name."""
    if s.method == "full" or isinstance(s.lora_targets, str):
        return ()
    return tuple(t for t in EXPERT_TARGETS if t in s.lora_targets)


def _check_lora_on_experts(s: RunSettings) -> None:
    """What peft's ParamWrapper refuses, and what lessonkit measured it with (bf16 weights)."""
    others = {
        "lora_dropout > 0 (peft's ParamWrapper refuses it)": s.lora_dropout > 0,
        f"precision {s.precision!r}": s.precision != "bf16",
        "zero_stage=3": s.zero_stage == 3,
        "activation_offload": s.activation_offload,
    }
    chosen = [name for name, on in others.items() if on]
    if chosen:
        raise LessonkitError(
            "LoRA on the experts' weights (peft's target_parameters) is modelled with bf16 "
            f"weights (precision 'bf16'), lora_dropout=0 and no ZeRO-3 or "
            f"activation offloading; got {', '.join(chosen)}. Change those, or leave "
            "'experts' out of lora_targets."
        )


def _check_expert_targets(targets: tuple[str, ...], allowed: tuple[str, ...]) -> None:
    """Raise for a LoRA target on a MoE model's experts (peft's target_parameters)."""
    for target in targets:
        error = expert_target_error(target, allowed)
        if error is not None:
            raise error


def _layer_target(spec: ModelSpec, name: str) -> bool:
    return name in spec.lora_target_names()


def _check_outer_targets(spec: ModelSpec, outer: tuple[str, ...]) -> None:
    if outer and spec.family == "traced":
        raise LessonkitError(
            f"LoRA on {', '.join(outer)} is modelled for the named families only, not for a "
            f"traced model: use its decoder layers' linear layers as targets."
        )
    if outer and spec.tie_embeddings:
        raise LessonkitError(
            f"LoRA on {', '.join(outer)} is modelled for models with an untied output head "
            f"only; {spec.name} ties lm_head to its embeddings: use the decoder layers' "
            f"targets, or a model with tie_embeddings=False."
        )
    if "embed_tokens" in outer and spec.family == "gpt2":
        raise LessonkitError(
            "gpt2 names its token embeddings wte, not embed_tokens; LoRA on them is not "
            "modelled: use lm_head or the decoder layers' targets (c_attn, c_proj, c_fc)."
        )


def _probability(value: object, what: str) -> float:
    number = real_number(value)
    if number is None or not 0 <= number < 1:
        raise LessonkitError(
            f"{what} must be a number from 0 up to (not including) 1, such as "
            f"0.05 or 0.1, got {short_repr(value)}."
        )
    return float(number)


def _seq_len(value: object, spec: ModelSpec) -> int:
    seq = positive_int(value, "seq_len", maximum=MAX_SEQ)
    if spec.max_positions and seq > spec.max_positions:
        raise LessonkitError(
            f"seq_len must be at most {spec.max_positions:,} for {spec.name} "
            f"(its learned position embeddings), got {seq:,}."
        )
    return seq


def _fsdp_version(value: object, zero_stage: int) -> int:
    if isinstance(value, bool) or value not in FSDP_VERSIONS:
        raise LessonkitError(
            f"fsdp_version must be one of {', '.join(map(str, FSDP_VERSIONS))}, got "
            f"{short_repr(value)}."
        )
    if value == 1 and zero_stage != 3:
        raise LessonkitError(
            f"fsdp_version=1 (FSDP1's flat parameters) applies to ZeRO-3 only, got "
            f"zero_stage={zero_stage}: use zero_stage=3 with it, or leave fsdp_version at 2."
        )
    return int(value)


# optimizers that cannot step FSDP2's DTensor parameters (bitsandbytes' kernels have no
# sharding rule; transformers' Adafactor makes plain tensors beside them)
NOT_FOR_FSDP2 = ("adamw-8bit", "paged-adamw-8bit", "paged-adamw-32bit", "adafactor")
# the optimizers precision "bf16-master" (fp32 masters and states) is modelled with
MASTER_OPTIMIZERS = ("adamw", "adamw-fused", "adamw-forloop")


def validate_run(spec: ModelSpec, **kw: Any) -> RunSettings:
    """Check every argument of a run of ``spec``; raise LessonkitError saying what is allowed.

    Takes the keyword arguments of estimate() (all of them). ``precision`` None is the method's
    usual one (``usual_precision``); ``lora_targets`` left at its default (or None) becomes the
    model family's peft default (``ModelSpec.default_lora_targets``).
    """
    zero = kw["zero_stage"]
    if isinstance(zero, bool) or zero not in ZERO_STAGES:
        raise LessonkitError(
            f"zero_stage must be one of {', '.join(map(str, ZERO_STAGES))}, got {zero!r}."
        )
    method = choose(kw["method"], METHODS, "method")
    precision = kw.get("precision")
    s = RunSettings(
        method=method,
        precision=usual_precision(method)
        if precision is None
        else choose(precision, PRECISIONS, "precision"),
        optimizer=choose(kw["optimizer"], OPTIMIZERS, "optimizer"),
        batch_size=positive_int(kw["batch_size"], "batch_size", maximum=MAX_BATCH),
        seq_len=_seq_len(kw["seq_len"], spec),
        gradient_checkpointing=_flag(kw["gradient_checkpointing"], "gradient_checkpointing"),
        lora_rank=positive_int(kw["lora_rank"], "lora_rank", maximum=MAX_RANK),
        lora_targets=_with_expert_targets(
            spec, spec.resolve_lora_targets(_targets(kw["lora_targets"]))
        ),
        n_gpus=positive_int(kw["n_gpus"], "n_gpus", maximum=MAX_GPUS),
        zero_stage=zero,
        attention=choose(kw["attention"], ATTENTION, "attention"),
        offload_optimizer=_flag(kw["offload_optimizer"], "offload_optimizer"),
        double_quant=_flag(kw["double_quant"], "double_quant"),
        lora_dtype=choose(kw["lora_dtype"], LORA_DTYPES, "lora_dtype"),
        gradient_accumulation=positive_int(
            kw["gradient_accumulation"], "gradient_accumulation", maximum=MAX_ACCUMULATION
        ),
        device=choose(kw["device"], DEVICES, "device"),
        lora_dropout=_probability(kw.get("lora_dropout", 0.0), "lora_dropout"),
        bitsandbytes=choose(kw.get("bitsandbytes", "current"), BNB_BEHAVIOURS, "bitsandbytes"),
        activation_offload=_flag(kw.get("activation_offload", False), "activation_offload"),
        optimizer_in_backward=_flag(
            kw.get("optimizer_in_backward", False), "optimizer_in_backward"
        ),
        loss=choose(kw.get("loss", "standard"), LOSSES, "loss"),
        loss_chunks=positive_int(
            kw.get("loss_chunks", DEFAULT_LOSS_CHUNKS), "loss_chunks", maximum=MAX_SEQ
        ),
        no_sync=_flag(kw.get("no_sync", False), "no_sync"),
        fsdp_version=_fsdp_version(kw.get("fsdp_version", 2), zero),
        compile=_flag(kw.get("compile", False), "compile"),
    )
    if s.method != "full":
        _check_layer_targets(spec, layer_lora_targets(s.lora_targets))
        _check_outer_targets(spec, outer_lora_targets(s.lora_targets))
        if s.lora_rank > spec.hidden_size:
            raise LessonkitError(
                f"lora_rank must be at most the hidden size of {spec.name} "
                f"({spec.hidden_size}), got {s.lora_rank}."
            )
    if lora_on_experts(s):
        _check_lora_on_experts(s)
    if (
        s.method != "full"
        and s.lora_targets == "all-linear"
        and spec.experts_take_lora
        and s.lora_dropout > 0
    ):
        raise LessonkitError(
            f"lora_targets='all-linear' on {spec.name}, a mixture-of-experts model, puts LoRA "
            "on the experts' fused weights too (peft's ParamWrapper), which refuses "
            f"lora_dropout > 0 (got {s.lora_dropout}): set lora_dropout=0, or name the "
            "targets without the experts."
        )
    if s.zero_stage == 3 and s.fsdp_version == 2 and s.optimizer in NOT_FOR_FSDP2:
        why = (
            "transformers' Adafactor makes its factored states as plain tensors beside them"
            if s.optimizer == "adafactor"
            else "bitsandbytes' optimizer kernels have no sharding rule for them"
        )
        raise LessonkitError(
            f"optimizer {s.optimizer!r} cannot step FSDP2's sharded parameters (DTensors): "
            f"{why}. Use fsdp_version=1, zero_stage 0-2, or AdamW, SGD or Lion."
        )
    if s.precision == "bf16-master" and s.method == "full" and s.optimizer not in MASTER_OPTIMIZERS:
        raise LessonkitError(
            f"precision 'bf16-master' (fp32 master weights and states in the optimizer) is "
            f"modelled with AdamW ({', '.join(MASTER_OPTIMIZERS)}), not {s.optimizer!r}: choose "
            "one of those, or precision 'bf16' or 'bf16-mixed'."
        )
    if s.method == "qlora" and s.precision in ("fp32", "bf16-master"):
        raise LessonkitError(
            f"QLoRA computes in 16 bits on 4-bit weights; precision {s.precision!r} makes no "
            "sense with it. Use 'bf16-mixed' (or 'fp16-mixed' on GPUs without bf16) or 'bf16'."
        )
    if s.offload_optimizer and s.zero_stage == 0:
        raise LessonkitError(
            "offload_optimizer needs ZeRO (zero_stage 1, 2 or 3): plain data "
            "parallelism keeps the optimizer states on the GPU."
        )
    if s.loss == "standard" and s.loss_chunks != DEFAULT_LOSS_CHUNKS:
        raise LessonkitError(
            f"loss_chunks={s.loss_chunks} applies to loss='chunked' only; "
            "the standard loss computes all the logits at once."
        )
    if s.loss == "chunked" and s.loss_chunks > s.seq_len:
        raise LessonkitError(
            f"loss_chunks must be at most seq_len ({s.seq_len}) so that every "
            f"chunk holds a token, got {s.loss_chunks}."
        )
    if s.optimizer_in_backward and s.gradient_accumulation > 1:
        raise LessonkitError(
            "optimizer_in_backward steps each parameter as soon as its gradient is ready, so "
            "there is nothing to accumulate: it needs gradient_accumulation=1 (got "
            f"{s.gradient_accumulation}), or set optimizer_in_backward=False."
        )
    if s.optimizer_in_backward and (s.n_gpus > 1 or s.offload_optimizer):
        raise LessonkitError(
            "optimizer_in_backward is modelled on one GPU without optimizer "
            "offload: use n_gpus=1, or optimizer_in_backward=False."
        )
    if s.activation_offload and s.method == "qlora" and s.bitsandbytes != "current":
        raise LessonkitError(
            "activation_offload is modelled with bitsandbytes='current' only "
            "(older releases kept each 4-bit layer's input outside autograd's "
            "saved tensors, where offloading does not reach it)."
        )
    if s.activation_offload and not s.gradient_checkpointing:
        raise LessonkitError(
            "activation_offload is modelled together with gradient_checkpointing=True (as "
            "torchtune's recipes pair them): without checkpointing the working tensors inside "
            "each layer decide the peak, which this calculator does not follow yet. Set "
            "gradient_checkpointing=True, or activation_offload=False."
        )
    if s.activation_offload and s.zero_stage == 3:
        raise LessonkitError(
            "activation_offload is modelled without ZeRO-3 only: use "
            "zero_stage 0, 1 or 2 with it, or turn it off under ZeRO-3."
        )
    if s.no_sync and (s.n_gpus == 1 or s.gradient_accumulation == 1):
        raise LessonkitError(
            "no_sync skips the gradient reduction on every micro-batch but the last, so it needs "
            f"several GPUs and gradient_accumulation > 1 (got n_gpus={s.n_gpus}, "
            f"gradient_accumulation={s.gradient_accumulation}); or set no_sync=False."
        )
    if s.no_sync and s.zero_stage == 2:
        raise LessonkitError(
            "no_sync does not go with ZeRO-2: DeepSpeed refuses it once gradients are "
            "partitioned (stage 2 and 3). Use zero_stage 3 (modelled as FSDP, which allows "
            "it), 0 or 1 with no_sync, or no_sync=False."
        )
    if s.method == "qlora" and s.zero_stage == 3:
        raise LessonkitError(
            "ZeRO-3 cannot shard 4-bit QLoRA weights in this calculator; use "
            "zero_stage 0, 1 or 2 with QLoRA."
        )
    if s.fsdp_version == 1:
        _check_fsdp1(s, spec)
    if s.compile:
        _check_compiled(spec, s)
    return s


def _check_fsdp1(s: RunSettings, spec: ModelSpec) -> None:
    """The runs FSDP1 cannot flatten, or that its model (memory/fsdp1.py) does not follow."""
    stored = "bf16" if s.precision in ("bf16", "bf16-master") else "fp32"
    if s.method != "full" and s.lora_dtype != stored:
        raise LessonkitError(
            f"fsdp_version=1 flattens each decoder layer's tensors into one flat parameter of "
            f"one dtype, and FSDP1 refuses a {stored} base with {s.lora_dtype} adapters ('Must "
            f"flatten tensors with uniform dtype'): use lora_dtype='{stored}' with precision "
            f"{s.precision!r}, or fsdp_version=2."
        )
    if s.offload_optimizer:
        raise LessonkitError(
            "fsdp_version=1 is modelled without offload_optimizer: set offload_optimizer=False, "
            "or use fsdp_version=2."
        )
    if spec.family == "traced" or spec.n_experts:
        kind = "a traced model" if spec.family == "traced" else "a mixture of experts"
        raise LessonkitError(
            "fsdp_version=1 is modelled for the dense families lessonkit describes block by "
            f"block (llama, qwen2, gpt2, ...), not for {spec.name} ({kind}): use fsdp_version=2."
        )


def _check_compiled(spec: ModelSpec, s: RunSettings) -> None:
    """What compile=True models: one GPU, DDP, ZeRO-1 or FSDP2; SDPA attention, no LoRA dropout
    (see compiled.py)."""
    from .compiled import check_compiled

    check_compiled(spec, s.method, s.precision, s.gradient_checkpointing, s.seq_len)
    others = {
        "ZeRO-2 (each layer's gradients leave its compiled backward together, unsharded)": (
            s.zero_stage == 2
        ),
        "fsdp_version=1": s.zero_stage == 3 and s.fsdp_version == 1,
        "lora_dropout": s.lora_dropout > 0,
        "attention='eager'": s.attention == "eager",
        "lm_head/embed_tokens LoRA targets": bool(outer_lora_targets(s.lora_targets)),
        # the layers are traced with peft's default targets; others save other tensors
        f"LoRA targets other than peft's default for {spec.family} "
        f"({', '.join(spec.default_lora_targets)})": s.method == "lora"
        and not outer_lora_targets(s.lora_targets)
        and s.lora_targets != tuple(spec.default_lora_targets),
    }
    chosen = [name for name, on in others.items() if on]
    if chosen:
        raise LessonkitError(
            f"compile=True is modelled with SDPA attention on one GPU, with DDP, ZeRO-1 or "
            f"ZeRO-3 (FSDP2), without {', '.join(chosen)}: set compile=False, or leave those out."
        )
